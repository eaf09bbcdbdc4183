//! The plugin host: the only code that imports wasmtime.
//!
//! One [`Engine`] (pooling allocator, epoch interruption), one [`Linker`] with WASI (no files,
//! network, environment; clocks frozen at the call's start) and the `eggtimer:plugin/host`
//! imports. Each plugin version is compiled and pre-instantiated once; the current version of each
//! name sits behind a lock and is swapped atomically, so calls in flight finish on the old one.
//!
//! Calls: each worker thread keeps one instance per plugin version and reuses it for the next
//! tasks of that version (a fresh instance costs ~10x a call); an instance that trapped, timed out
//! or filled its output buffer is dropped. A trap, a timeout (epoch deadline) or a memory overrun
//! (`StoreLimits`) fails that task with a readable error and touches nothing else.
//!
//! Architecture invariant: a plugin never reaches Redis; it asks the host, and the host turns its
//! asks into [`Effects`] that the executor applies before the ack.

mod registry;

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimits,
    StoreLimitsBuilder, Trap,
};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{HostWallClock, WasiCtx, WasiCtxView, WasiView};

pub use registry::{PluginVersion, Registry, UploadError, valid_plugin_name};

use crate::executor::{Effects, Handler, Outcome, Run, TaskHost, now_ms};
use crate::store::{Claimed, KvWrite, NewTask};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "plugin",
    });
}

use bindings::eggtimer::plugin::types as wit;
use bindings::{Plugin, PluginPre};

/// How long one epoch tick is.
const TICK: Duration = Duration::from_millis(10);
/// Captured guest output kept per instance before it is recycled.
const OUTPUT_CAP: usize = 1 << 20;
/// Calls on one instance before it is recycled (bounds what a plugin can leak between tasks).
const MAX_REUSE: u32 = 10_000;
/// Effects one run may ask for.
const MAX_EFFECTS: usize = 1000;

/// Settings of the plugin host.
#[derive(Clone, Debug)]
pub struct PluginOptions {
    /// Time limit of one call.
    pub timeout: Duration,
    /// Memory cap of one instance (bytes).
    pub memory: usize,
    /// Where compiled code is cached (by wasm digest, wasmtime version and engine settings).
    pub cache_dir: Option<PathBuf>,
    /// Largest payload of a follow-up task (bytes).
    pub max_payload_bytes: usize,
    /// Attempts of a follow-up task that does not say.
    pub default_max_attempts: u32,
}

impl Default for PluginOptions {
    fn default() -> Self {
        PluginOptions {
            timeout: Duration::from_secs(1),
            memory: 64 << 20,
            cache_dir: None,
            max_payload_bytes: 64 << 10,
            default_max_attempts: 5,
        }
    }
}

/// A compiled, checked plugin version, ready to instantiate.
pub struct Loaded {
    pub name: String,
    pub version: u64,
    pub digest: String,
    pre: PluginPre<State>,
}

/// The plugin host.
pub struct Plugins {
    engine: Engine,
    linker: Linker<State>,
    current: RwLock<HashMap<String, Arc<Loaded>>>,
    opts: PluginOptions,
    /// Distinguishes this host's instances in the per-thread cache.
    id: u64,
}

/// Per-call context: what the running task is and what it asked for.
#[derive(Default)]
struct CallCtx {
    task_id: String,
    plugin: String,
    host: Option<Arc<dyn TaskHost>>,
    effects: Effects,
    /// This run's kv writes, so the plugin reads its own writes.
    kv_overlay: HashMap<String, Option<String>>,
    max_payload_bytes: usize,
    default_max_attempts: u32,
    effect_count: usize,
}

/// The data of one instance's Store.
pub struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
    call: CallCtx,
    started_at: Arc<std::sync::atomic::AtomicI64>,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The guest's wall clock: frozen at the start of the current call (the plugin's time comes
/// from the host's `now`).
struct FrozenClock(Arc<std::sync::atomic::AtomicI64>);

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.load(std::sync::atomic::Ordering::Relaxed).max(0) as u64)
    }
}

fn valid_topic(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

impl CallCtx {
    fn count(&mut self) -> Result<(), String> {
        self.effect_count += 1;
        if self.effect_count > MAX_EFFECTS {
            return Err(format!("a run may ask for at most {MAX_EFFECTS} effects"));
        }
        Ok(())
    }
}

impl wit::Host for State {}

impl bindings::eggtimer::plugin::host::Host for State {
    fn log(&mut self, level: wit::Level, message: String) {
        let (id, plugin) = (&self.call.task_id, &self.call.plugin);
        match level {
            wit::Level::Debug => debug!(task = %id, %plugin, "plugin: {message}"),
            wit::Level::Info => info!(task = %id, %plugin, "plugin: {message}"),
            wit::Level::Warn => warn!(task = %id, %plugin, "plugin: {message}"),
            wit::Level::Error => tracing::error!(task = %id, %plugin, "plugin: {message}"),
        }
    }

    fn now(&mut self) -> i64 {
        now_ms()
    }

    fn schedule(&mut self, t: wit::FollowUp) -> Result<String, String> {
        self.call.count()?;
        if !valid_plugin_name(&t.plugin) {
            return Err(format!("{:?} is not a plugin name", t.plugin));
        }
        if t.payload.len() > self.call.max_payload_bytes {
            return Err(format!(
                "the payload is larger than {} bytes",
                self.call.max_payload_bytes
            ));
        }
        serde_json::from_str::<serde::de::IgnoredAny>(&t.payload)
            .map_err(|e| format!("the payload is not JSON: {e}"))?;
        let id = derive_id(&self.call.task_id, self.call.effects.schedule.len());
        self.call.effects.schedule.push(NewTask {
            id: id.clone(),
            plugin: t.plugin,
            payload: t.payload,
            run_at: t.run_at,
            owner: t
                .owner
                .map(|o| crate::store::field_safe(&o))
                .filter(|o| !o.is_empty()),
            max_attempts: t
                .max_attempts
                .unwrap_or(self.call.default_max_attempts)
                .max(1),
        });
        Ok(id)
    }

    fn cancel(&mut self, id: String) {
        if self.call.count().is_ok() {
            self.call.effects.cancel.push(id);
        }
    }

    fn emit(&mut self, topic: String, data: String) -> Result<(), String> {
        self.call.count()?;
        if !valid_topic(&topic) {
            return Err(format!(
                "{topic:?} is not a topic: use 1 to 64 of a-z 0-9 . _ -"
            ));
        }
        serde_json::from_str::<serde::de::IgnoredAny>(&data)
            .map_err(|e| format!("the event data is not JSON: {e}"))?;
        self.call.effects.ns.events.push((topic, data));
        Ok(())
    }

    fn kv_get(&mut self, key: String) -> Result<Option<String>, String> {
        if let Some(v) = self.call.kv_overlay.get(&key) {
            return Ok(v.clone());
        }
        let host = self.call.host.as_ref().ok_or("no host")?;
        host.kv_get(&self.call.plugin, &key)
    }

    fn kv_set(&mut self, key: String, value: String, ttl_ms: Option<u64>) -> Result<(), String> {
        self.call.count()?;
        if key.is_empty() || key.len() > 512 || value.len() > 1 << 20 {
            return Err("kv keys are 1 to 512 bytes and values at most 1 MiB".into());
        }
        self.call
            .kv_overlay
            .insert(key.clone(), Some(value.clone()));
        self.call.effects.ns.kv.push(KvWrite::Set {
            key,
            value,
            ttl_ms: ttl_ms.filter(|t| *t > 0),
        });
        Ok(())
    }

    fn kv_delete(&mut self, key: String) -> Result<(), String> {
        self.call.count()?;
        self.call.kv_overlay.insert(key.clone(), None);
        self.call.effects.ns.kv.push(KvWrite::Delete { key });
        Ok(())
    }
}

/// The id of the `index`-th follow-up of task `parent`: stable, so a re-run derives the same one.
pub fn derive_id(parent: &str, index: usize) -> String {
    let mut h = Sha256::new();
    h.update(parent.as_bytes());
    h.update(b"\n");
    h.update(index.to_string().as_bytes());
    hex::encode(&h.finalize()[..10])
}

/// The sha256 of a plugin binary, hex.
pub fn digest(wasm: &[u8]) -> String {
    hex::encode(Sha256::digest(wasm))
}

/// An instance kept by a worker thread for reuse.
struct Warm {
    host_id: u64,
    digest: String,
    store: Store<State>,
    plugin: Plugin,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
    out_seen: usize,
    err_seen: usize,
    calls: u32,
}

thread_local! {
    static WARM: RefCell<HashMap<String, Warm>> = RefCell::new(HashMap::new());
}

impl Plugins {
    /// Creates the engine and linker and starts the epoch ticker.
    pub fn new(opts: PluginOptions) -> Result<Arc<Plugins>> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        let mut pool = PoolingAllocationConfig::default();
        pool.max_memory_size(opts.memory)
            .total_component_instances(1000)
            .total_core_instances(2000)
            .total_memories(1000)
            .total_tables(2000)
            .total_stacks(1000)
            .max_memories_per_component(4);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine =
            Engine::new(&config).map_err(|e| anyhow!("creating the wasm engine: {e:#}"))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| anyhow!("linking WASI: {e:#}"))?;
        Plugin::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)
            .map_err(|e| anyhow!("linking the host: {e:#}"))?;
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("eggtimer-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(TICK);
                }
            })
            .context("starting the epoch ticker")?;
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Arc::new(Plugins {
            engine,
            linker,
            current: RwLock::new(HashMap::new()),
            opts,
            id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }))
    }

    fn cache_path(&self, digest: &str) -> Option<PathBuf> {
        let dir = self.opts.cache_dir.as_ref()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut h);
        Some(dir.join(format!("{digest}-wasmtime48-{:016x}.cwasm", h.finish())))
    }

    /// Compiles and checks a plugin binary: it must be a component whose imports the host
    /// provides and which exports `handle` of the contract. Blocking (seconds for a large
    /// plugin): call it off the async runtime.
    pub fn compile(&self, name: &str, version: u64, wasm: &[u8]) -> Result<Loaded, String> {
        let digest = digest(wasm);
        let cached = self
            .cache_path(&digest)
            .filter(|p| p.exists())
            .and_then(|p| {
                // SAFETY: the file was written by `Component::serialize` of an engine with the same
                // compatibility hash (it is in the file name), into our own cache directory.
                unsafe { Component::deserialize_file(&self.engine, &p) }.ok()
            });
        let component = match cached {
            Some(c) => c,
            None => {
                let c = Component::from_binary(&self.engine, wasm).map_err(|e| {
                    format!("not a valid WebAssembly component (build it with `--target wasm32-wasip2`): {e:#}")
                })?;
                if let (Some(p), Ok(bytes)) = (self.cache_path(&digest), c.serialize()) {
                    let _ = std::fs::create_dir_all(p.parent().unwrap_or(Path::new(".")));
                    let tmp = p.with_extension("tmp");
                    if std::fs::write(&tmp, bytes)
                        .and_then(|_| std::fs::rename(&tmp, &p))
                        .is_err()
                    {
                        warn!(
                            "could not write the compiled-plugin cache at {}",
                            p.display()
                        );
                    }
                }
                c
            }
        };
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| format!("the plugin imports something the host does not offer: {e:#}"))?;
        let pre = PluginPre::new(pre)
            .map_err(|e| format!("the plugin does not export the eggtimer handler: {e:#}"))?;
        Ok(Loaded {
            name: name.to_owned(),
            version,
            digest,
            pre,
        })
    }

    /// Makes `loaded` the current version of its name; calls in flight keep the old one.
    pub fn install(&self, loaded: Loaded) {
        info!(plugin = %loaded.name, version = loaded.version, digest = %&loaded.digest[..12], "plugin loaded");
        self.current
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(loaded.name.clone(), Arc::new(loaded));
    }

    /// Unloads a plugin; its tasks fail (and retry) until it is uploaded again.
    pub fn remove(&self, name: &str) {
        self.current
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
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

    /// Drops this thread's warm instances (the next call instantiates afresh).
    pub fn forget_warm(&self) {
        WARM.with(|w| w.borrow_mut().clear());
    }

    fn instantiate(&self, loaded: &Loaded) -> Result<Warm, String> {
        let stdout = MemoryOutputPipe::new(OUTPUT_CAP);
        let stderr = MemoryOutputPipe::new(OUTPUT_CAP);
        let started_at = Arc::new(std::sync::atomic::AtomicI64::new(now_ms()));
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .wall_clock(FrozenClock(Arc::clone(&started_at)))
            .build();
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.opts.memory)
            .trap_on_grow_failure(true)
            .build();
        let state = State {
            wasi,
            table: ResourceTable::new(),
            limits,
            call: CallCtx::default(),
            started_at,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.deadline_ticks());
        let plugin = loaded
            .pre
            .instantiate(&mut store)
            .map_err(|e| format!("instantiating the plugin failed: {e:#}"))?;
        Ok(Warm {
            host_id: self.id,
            digest: loaded.digest.clone(),
            store,
            plugin,
            stdout,
            stderr,
            out_seen: 0,
            err_seen: 0,
            calls: 0,
        })
    }

    fn deadline_ticks(&self) -> u64 {
        (self.opts.timeout.as_millis() / TICK.as_millis()).max(1) as u64 + 1
    }

    /// Runs one task on the current version of its plugin.
    pub fn call(&self, task: &Claimed, host: &Arc<dyn TaskHost>) -> Run {
        let Some(loaded) = self.get(&task.plugin) else {
            return Run::failed(format!(
                "no plugin named {:?} is loaded (upload it with PUT /v1/plugins/{})",
                task.plugin, task.plugin
            ));
        };
        let mut warm = WARM.with(|w| w.borrow_mut().remove(&task.plugin));
        if warm
            .as_ref()
            .is_some_and(|w| w.digest != loaded.digest || w.host_id != self.id)
        {
            warm = None; // a new version was installed: drop the old instance
        }
        let mut warm = match warm {
            Some(w) => w,
            None => match self.instantiate(&loaded) {
                Ok(w) => w,
                Err(e) => return Run::failed(e),
            },
        };
        warm.store
            .data()
            .started_at
            .store(now_ms(), std::sync::atomic::Ordering::Relaxed);
        warm.store.data_mut().call = CallCtx {
            task_id: task.id.clone(),
            plugin: task.plugin.clone(),
            host: Some(Arc::clone(host)),
            max_payload_bytes: self.opts.max_payload_bytes,
            default_max_attempts: self.opts.default_max_attempts,
            ..CallCtx::default()
        };
        warm.store.set_epoch_deadline(self.deadline_ticks());
        let input = wit::Task {
            id: task.id.clone(),
            plugin: task.plugin.clone(),
            attempt: task.attempt,
            max_attempts: task.max_attempts,
            due: task.due,
            owner: task.owner.clone(),
            payload: task.payload.clone(),
        };
        let result = warm.plugin.call_handle(&mut warm.store, &input);
        let call = std::mem::take(&mut warm.store.data_mut().call);
        let stderr_tail = self.drain_output(&mut warm, task);
        warm.calls += 1;
        let run = match result {
            Ok(Ok(outcome)) => Run {
                outcome: Ok(match outcome {
                    wit::Outcome::Done => Outcome::Done,
                    wit::Outcome::RetryAfter(ms) => Outcome::RetryAfter(ms),
                    wit::Outcome::Fail(reason) => Outcome::Fail(reason),
                    wit::Outcome::RunAgainAt(t) => Outcome::RunAgainAt(t),
                }),
                effects: call.effects,
            },
            // The handler returned an error: a failed attempt; effects are dropped.
            Ok(Err(e)) => Run::failed(format!("the handler returned an error: {e}")),
            Err(e) => {
                let run = Run::failed(self.explain_trap(&e, &stderr_tail));
                return run; // a trapped instance can't be re-entered: drop it
            }
        };
        let full = warm.out_seen > OUTPUT_CAP / 2 || warm.err_seen > OUTPUT_CAP / 2;
        if warm.calls < MAX_REUSE && !full {
            WARM.with(|w| w.borrow_mut().insert(task.plugin.clone(), warm));
        }
        run
    }

    /// Logs what the guest printed since the last call; returns the last of its stderr.
    fn drain_output(&self, warm: &mut Warm, task: &Claimed) -> String {
        let out = warm.stdout.contents();
        let err = warm.stderr.contents();
        let new_out = String::from_utf8_lossy(&out[warm.out_seen.min(out.len())..]).into_owned();
        let new_err = String::from_utf8_lossy(&err[warm.err_seen.min(err.len())..]).into_owned();
        warm.out_seen = out.len();
        warm.err_seen = err.len();
        for line in new_out.lines() {
            info!(task = %task.id, plugin = %task.plugin, "plugin stdout: {line}");
        }
        for line in new_err.lines() {
            warn!(task = %task.id, plugin = %task.plugin, "plugin stderr: {line}");
        }
        let tail: Vec<&str> = new_err.lines().rev().take(3).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    fn explain_trap(&self, e: &wasmtime::Error, stderr_tail: &str) -> String {
        let text = format!("{e:#}");
        let mut msg = match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => format!(
                "the plugin ran longer than its time limit of {:?}",
                self.opts.timeout
            ),
            _ if text.contains("forcing trap when growing memory") => {
                format!(
                    "the plugin needed more than its memory limit of {} MiB",
                    self.opts.memory >> 20
                )
            }
            _ => format!("the plugin trapped: {}", text.lines().next().unwrap_or("")),
        };
        if !stderr_tail.is_empty() {
            msg.push_str(&format!(" (stderr: {stderr_tail})"));
        }
        msg
    }
}

impl Handler for Plugins {
    fn handle(&self, task: &Claimed, host: &Arc<dyn TaskHost>) -> Run {
        self.call(task, host)
    }
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
            .compile(&name, 0, &wasm)
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        plugins.install(loaded);
        names.push(name);
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        assert_eq!(derive_id("a", 0), derive_id("a", 0));
        assert_ne!(derive_id("a", 0), derive_id("a", 1));
        assert_ne!(derive_id("a", 0), derive_id("b", 0));
        assert_eq!(derive_id("a", 0).len(), 20);
    }

    #[test]
    fn topics() {
        assert!(valid_topic("order"));
        assert!(valid_topic("pet.v2_x-y"));
        assert!(!valid_topic(""));
        assert!(!valid_topic("Order"));
        assert!(!valid_topic("a b"));
    }
}
