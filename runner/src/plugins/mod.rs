//! The plugin host: the only code that imports wasmtime.
//!
//! Each plugin version is compiled and pre-instantiated once; the current version of each name
//! sits behind a lock and is swapped atomically, so calls in flight finish on the old one. Calls
//! are async and run on the host's own runtime (one thread per core), so a busy guest never
//! delays the pollers, the API or the finisher; a call is bounded by its wall-clock time limit
//! whatever the guest does (computes, sleeps, polls), and by its memory cap and effects budget.
//! A trap, timeout, memory overrun or budget overrun fails that task with a readable error and
//! touches nothing else.
//!
//! Architecture invariant: a plugin never reaches Redis; it asks the host, and the host turns its
//! asks into [`Effects`](crate::executor::Effects) that the executor commits before the outcome.

mod addresses;
mod compiler;
mod engine;
mod host;
mod http;
mod instance;
mod limiter;
mod output;
mod registry;
mod run_http;
mod sandbox;
mod turns;
mod wasi_http;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use eggtimer_base::names::valid_plugin_name;
use eggtimer_base::policy::{Defaults, Policies, Policy};

use anyhow::{Context, Result, anyhow};
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use tracing::{info, warn};

pub use compiler::{CompileLimits, compile_child};

pub use addresses::is_public;
pub use host::{Asked, Budget, derive_id};
pub use http::{MAX_ALLOWED_HOSTS, Response as HttpAnswer, valid_origin};
pub use limiter::MAX_MEMORY_BYTES;
pub use registry::{PluginVersion, Prepared, Registry, UploadError};
pub use sandbox::{CheckError, DryRun, Verdicts};

use crate::executor::{Handler, Run, TaskHost};
use eggtimer_store::Claimed;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "plugin",
        imports: { default: async | trappable },
        exports: { default: async },
    });
}

use bindings::PluginPre;

/// Settings of the plugin host.
#[derive(Clone, Debug)]
pub struct PluginOptions {
    /// Wall-clock time limit of one call.
    pub timeout: Duration,
    /// Wall-clock time limit of one call of a plugin's `check` or `payload-schema`.
    pub check_timeout: Duration,
    /// Memory cap of one instance, all its memories together (bytes), where a plugin has no
    /// `memory_bytes` of its own.
    pub memory: usize,
    /// Where compiled code is cached (by wasm digest, wasmtime version and engine settings).
    pub cache_dir: Option<PathBuf>,
    /// How long a cached file no runner loads is kept.
    pub cache_keep: Duration,
    /// Compile in a child process bounded in time and memory (the runner does); `None` compiles
    /// in this process, unbounded.
    pub compiler: Option<CompileLimits>,
    /// Largest payload of a follow-up task (bytes).
    pub max_payload_bytes: usize,
    /// Attempts of a follow-up task that does not say.
    pub default_max_attempts: u32,
    /// Calls at once (the executor's workers): the allocator has room for one instance each.
    pub workers: usize,
    /// Idle instances kept for reuse over all plugins (least recently used evicted).
    pub warm_instances: usize,
    /// What one run may ask for.
    pub budget: Budget,
    /// Extra CA certificates (PEM) for plugins' HTTPS requests.
    pub http_ca_file: Option<PathBuf>,
    /// The runner's clock: a plugin's `now()`, its wall clock, its log lines' times.
    pub clock: eggtimer_base::clock::Clock,
}

impl Default for PluginOptions {
    fn default() -> Self {
        PluginOptions {
            timeout: Duration::from_secs(1),
            check_timeout: Duration::from_secs(1),
            memory: 64 << 20,
            cache_dir: None,
            cache_keep: Duration::from_secs(7 * 24 * 3600),
            compiler: None,
            max_payload_bytes: 64 << 10,
            default_max_attempts: 5,
            workers: 32,
            warm_instances: 64,
            budget: Budget::default(),
            http_ca_file: None,
            clock: eggtimer_base::clock::Clock::default(),
        }
    }
}

/// A compiled, checked plugin version, ready to instantiate.
#[derive(Clone)]
pub struct Loaded {
    pub name: String,
    /// The key that uploaded it (the plugin's own name for one loaded from the plugins
    /// directory): the team whose share of the check slots its checks take.
    pub team: String,
    pub version: u64,
    pub digest: String,
    /// The plugin's `check` export (the `checked` world), if it has one.
    check: Option<wasmtime::component::ComponentExportIndex>,
    /// Its `payload-schema` export, and what it answered once asked.
    schema: Option<wasmtime::component::ComponentExportIndex>,
    schema_text: Arc<std::sync::OnceLock<Option<serde_json::Value>>>,
    pre: Arc<PluginPre<host::State>>,
}

impl Loaded {
    /// Whether the plugin says which payloads it takes (exports `check`).
    pub fn has_check(&self) -> bool {
        self.check.is_some()
    }
}

/// The runtime plugin calls run on; shut down without blocking when the host is dropped.
struct CallRuntime(Option<tokio::runtime::Runtime>);

impl Drop for CallRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The plugin host.
pub struct Plugins {
    engine: engine::WasmEngine,
    current: RwLock<HashMap<String, Arc<Loaded>>>,
    /// Each plugin's policy (time limit, memory, hosts, `may_schedule`, config): the store's,
    /// once a registry serves this host ([`Plugins::follow`]).
    policies: RwLock<Policies>,
    pool: instance::Pool,
    /// The HTTP client of plugins' requests.
    outbound: Arc<http::Outbound>,
    opts: PluginOptions,
    rt: CallRuntime,
    /// Checks running at once (each holds an instance beside the workers' and the idle ones).
    checking: tokio::sync::Semaphore,
    /// Each plugin's share of them (see `sandbox`).
    checking_per_team: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl Plugins {
    /// Creates the engine, the linker and the call runtime, and starts the epoch ticker.
    pub fn new(opts: PluginOptions) -> Result<Arc<Plugins>> {
        let engine = engine::WasmEngine::new(&opts)?;
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("eggtimer-plugin")
            .enable_all()
            .build()
            .context("starting the plugin runtime")?;
        let outbound =
            http::Outbound::new(opts.budget.http_requests, opts.http_ca_file.as_deref())?;
        Ok(Arc::new(Plugins {
            outbound: Arc::new(outbound),
            engine,
            current: RwLock::new(HashMap::new()),
            policies: RwLock::new(Policies::new(Defaults {
                time_limit: opts.timeout,
                memory: opts.memory,
                check_time_limit: opts.check_timeout,
            })),
            pool: instance::Pool::new(opts.warm_instances),
            opts,
            rt: CallRuntime(Some(rt)),
            checking: tokio::sync::Semaphore::new(sandbox::CHECK_SLOTS),
            checking_per_team: Default::default(),
        }))
    }

    /// What a plugin leaves unset: the runner's `--plugin-timeout`, `--plugin-memory` and
    /// `--check-timeout`.
    pub fn defaults(&self) -> Defaults {
        Defaults {
            time_limit: self.opts.timeout,
            memory: self.opts.memory,
            check_time_limit: self.opts.check_timeout,
        }
    }

    /// Reads each plugin's policy from `policies` (the store's, which the registry's sync makes)
    /// from now on, and makes them with this host's defaults.
    pub fn follow(&self, policies: &Policies) {
        policies.set_defaults(self.defaults());
        *self.policies.write().unwrap_or_else(|e| e.into_inner()) = policies.clone();
    }

    /// A plugin's policy.
    fn policy(&self, plugin: &str) -> Arc<Policy> {
        self.policies
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(plugin)
    }

    /// Compiles and checks a plugin binary (blocking: call it off the async runtime). One
    /// compile runs at a time; when several wait, a `team` (the key that uploaded the plugin)
    /// other than the one served last goes first, so one team's uploads hold up another team's
    /// deploy for one compile at most.
    pub fn compile(
        &self,
        name: &str,
        team: &str,
        version: u64,
        wasm: &[u8],
    ) -> Result<Loaded, String> {
        self.engine.compile(name, team, version, wasm)
    }

    /// Instantiates `loaded` once, as its first call would (its start code runs, under the
    /// plugin's time limit and memory cap), and keeps the instance warm for that call; the
    /// error says why it could not start. On the calls' runtime: guest code never runs on the
    /// caller's threads.
    pub async fn start_once(self: &Arc<Self>, loaded: &Loaded) -> Result<(), String> {
        let this = Arc::clone(self);
        let loaded = loaded.clone();
        let start = async move {
            let p = this.policy(&loaded.name);
            instance::start_once(
                &this.engine.engine,
                &this.pool,
                &loaded,
                p.time_limit,
                p.memory,
                &this.opts.clock,
            )
            .await
        };
        match &self.rt.0 {
            Some(rt) => rt
                .spawn(start)
                .await
                .unwrap_or_else(|e| Err(format!("starting the plugin failed: {e}"))),
            None => start.await,
        }
    }

    /// Cleans the compiled-code cache, at most hourly (blocking: file system calls): files of
    /// another engine, and files unused for the cache's keep time that no plugin loaded here has.
    pub fn clean_cache(&self) {
        let loaded: Vec<String> = self.loaded().into_iter().map(|(_, _, d)| d).collect();
        self.engine.clean_cache(&loaded);
    }

    /// Compiles running or waiting for their turn (one runs at a time).
    pub fn compiles(&self) -> usize {
        self.engine.compiles()
    }

    /// Makes `loaded` the current version of its name; calls in flight keep the old one.
    pub fn install(&self, loaded: Loaded) {
        info!(plugin = %loaded.name, version = loaded.version, digest = %&loaded.digest[..12], "plugin loaded");
        self.current
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(loaded.name.clone(), Arc::new(loaded));
        self.forget_stale();
    }

    /// Unloads a plugin; its tasks fail (and retry) until it is uploaded again.
    pub fn remove(&self, name: &str) {
        self.current
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        self.forget_stale();
    }

    /// Drops idle instances of versions that are no longer current.
    fn forget_stale(&self) {
        let keep: Vec<(String, String)> = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|l| (l.name.clone(), l.digest.clone()))
            .collect();
        self.pool.forget_except(&keep);
    }

    /// The current version of a name.
    pub fn get(&self, name: &str) -> Option<Arc<Loaded>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// (name, version, digest) of every loaded plugin.
    /// Warm instances kept idle (all plugins).
    pub fn idle_instances(&self) -> usize {
        self.pool.len()
    }

    pub fn loaded(&self) -> Vec<(String, u64, String)> {
        let mut v: Vec<_> = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|l| (l.name.clone(), l.version, l.digest.clone()))
            .collect();
        v.sort();
        v
    }

    /// Drops every idle instance (the next calls instantiate afresh).
    pub fn forget_warm(&self) {
        self.pool.forget_except(&[]);
    }

    /// Runs one task on the current version of its plugin (on the caller's runtime).
    pub async fn call(self: &Arc<Self>, task: &Claimed, host: Arc<dyn TaskHost>) -> Run {
        let Some(loaded) = self.get(&task.plugin) else {
            return Run::failed(format!(
                "no plugin named {:?} is loaded (upload it with PUT /v1/plugins/{})",
                task.plugin, task.plugin
            ));
        };
        let checks = Arc::clone(self);
        let policy = self.policy(&task.plugin);
        instance::call(self.env(), &loaded, task, host, checks, policy, None).await
    }
}

impl Handler for Plugins {
    fn handle(self: Arc<Self>, task: Claimed, host: Arc<dyn TaskHost>) -> BoxFuture<'static, Run> {
        Box::pin(async move { self.call(&task, host).await })
    }

    /// The executor spawns each run on the host's own runtime: guest code never runs on the
    /// caller's threads, and there is no hop between runtimes per call.
    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.rt.0.as_ref().map(|r| r.handle().clone())
    }

    fn has_plugin(&self, plugin: &str) -> bool {
        self.get(plugin).is_some()
    }
}

/// The sha256 of a plugin binary, hex.
pub fn digest(wasm: &[u8]) -> String {
    hex::encode(Sha256::digest(wasm))
}

/// Loads every `*.wasm` of a directory (file stem = plugin name) as version 0; returns the names.
pub fn load_dir(plugins: &Plugins, dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)
        .with_context(|| format!("reading the plugins directory {}", dir.display()))?
    {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("wasm") {
            continue;
        }
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        if !valid_plugin_name(&name) {
            warn!("skipping {}: {name:?} is not a plugin name", path.display());
            continue;
        }
        let wasm = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let loaded = plugins
            .compile(&name, &name, 0, &wasm)
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        plugins.install(loaded);
        names.push(name);
    }
    Ok(names)
}
