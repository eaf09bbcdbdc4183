//! The wasm engine: configuration (async calls, epoch interruption, pooling allocator sized from
//! the worker count), the linker with WASI and the eggtimer host, compiling and checking a
//! plugin, and the on-disk cache of compiled code.
//!
//! The cache is not a way in: loading compiled code runs it as native code, so a cache file is
//! loaded only when its keyed MAC (HMAC-SHA256, with a random key kept in the cache directory,
//! 0600) matches. The directory is made 0700, and one that others can write is not used at all.
//! A file that does not check out is compiled again from the wasm and rewritten.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow};
use tracing::{info, warn};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings::{Plugin, PluginPre};
use super::compiler::{self, CompileLimits};
use super::host::State;
use super::limiter;
use super::{Loaded, PluginOptions, digest};
use crate::counted::Counted;

/// How long one epoch tick is: a running guest yields (and its time limit is checked) this often.
pub(super) const TICK: Duration = Duration::from_millis(10);

/// The engine and linker, shared by every plugin.
pub(super) struct WasmEngine {
    pub engine: Engine,
    pub linker: Linker<State>,
    cache: Option<Cache>,
    /// Where plugins are compiled: a bounded child process, or (None) this process.
    compiler: Option<CompileLimits>,
    /// One compile at a time: cranelift spreads a compile over every core already, so uploads and
    /// reloads arriving together queue here instead of multiplying the CPU and memory compiling
    /// takes (loading from the cache does not queue); by turns between plugins.
    compile_turn: super::turns::Turns,
    /// Compiles running or queued.
    compiles: AtomicUsize,
    /// When the cache was last cleaned (at most hourly).
    cleaned: Mutex<Option<Instant>>,
}

/// The compiled-code cache: a private directory, the key its files are signed with, and how long
/// a file nobody loads is kept.
struct Cache {
    dir: PathBuf,
    key: [u8; 32],
    keep: Duration,
}

type Mac = hmac::Hmac<sha2::Sha256>;

impl Cache {
    /// Opens (or creates) the cache directory; None, with a warning, when it can't be trusted.
    fn open(dir: &Path, keep: Duration) -> Option<Cache> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
        let setup = || -> Result<Cache> {
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            let meta = std::fs::metadata(dir)?;
            // SAFETY: getuid has no preconditions.
            let me = unsafe { libc::getuid() };
            if meta.uid() != me || meta.mode() & 0o022 != 0 {
                anyhow::bail!("it is not a private directory of this user");
            }
            let key_path = dir.join("key");
            let key = match std::fs::read(&key_path) {
                Ok(k) if k.len() == 32 => k.try_into().expect("32 bytes"),
                _ => {
                    let k: [u8; 32] = rand::random();
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .mode(0o600)
                        .open(&key_path)?;
                    std::io::Write::write_all(&mut f, &k)?;
                    k
                }
            };
            Ok(Cache {
                dir: dir.to_owned(),
                key,
                keep,
            })
        };
        match setup() {
            Ok(c) => Some(c),
            Err(e) => {
                warn!(
                    "not using the compiled-plugin cache at {}: {e:#}",
                    dir.display()
                );
                None
            }
        }
    }

    fn mac(&self, bytes: &[u8]) -> Mac {
        use hmac::Mac as _;
        let mut m = Mac::new_from_slice(&self.key).expect("any key length");
        m.update(bytes);
        m
    }

    /// The compiled bytes of a file, if its MAC checks out.
    fn read(&self, path: &Path) -> Option<Vec<u8>> {
        use hmac::Mac as _;
        let bytes = std::fs::read(path).ok()?;
        let tag = hex::decode(
            std::fs::read_to_string(path.with_extension("mac"))
                .ok()?
                .trim(),
        )
        .ok()?;
        match self.mac(&bytes).verify_slice(&tag) {
            Ok(()) => {
                // used now: cleaning keeps it (see `clean`)
                let _ = std::fs::File::options()
                    .write(true)
                    .open(path)
                    .and_then(|f| f.set_modified(SystemTime::now()));
                Some(bytes)
            }
            Err(_) => {
                warn!(
                    "{} does not match its MAC: compiling the plugin again",
                    path.display()
                );
                None
            }
        }
    }

    /// Deletes the files no runner of this build loads again: those of another engine (another
    /// wasmtime version or engine settings: `ours` is the end of this engine's file names),
    /// those not loaded for `keep` (unless their digest is in `loaded`), and temporary files a
    /// crash left. Returns how many compiled files went.
    fn clean(&self, ours: &str, loaded: &[String]) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let now = SystemTime::now();
        let age = |p: &Path| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .unwrap_or_default()
        };
        let mut removed = 0;
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let stale = if name.ends_with(".tmp") {
                age(&path) > Duration::from_secs(3600)
            } else if let Some(stem) = name.strip_suffix(".cwasm") {
                let digest = stem.split('-').next().unwrap_or_default();
                !name.ends_with(ours)
                    || (age(&path) > self.keep && !loaded.iter().any(|d| d == digest))
            } else {
                false
            };
            if stale && std::fs::remove_file(&path).is_ok() && name.ends_with(".cwasm") {
                removed += 1;
                let _ = std::fs::remove_file(path.with_extension("mac"));
            }
        }
        // a MAC whose compiled file is gone
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
                if path.extension().is_some_and(|e| e == "mac")
                    && !path.with_extension("cwasm").exists()
                {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        removed
    }

    /// Writes compiled bytes and their MAC (each through a rename, so readers never see half).
    fn write(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        use hmac::Mac as _;
        let tag = hex::encode(self.mac(bytes).finalize().into_bytes());
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)?;
        let tmp = path.with_extension("mac.tmp");
        std::fs::write(&tmp, tag)?;
        std::fs::rename(&tmp, path.with_extension("mac"))
    }
}

/// Instances the pooling allocator has room for: those running (one per worker), those kept warm,
/// those checking payloads, and a margin.
pub(super) fn pool_slots(opts: &PluginOptions) -> u32 {
    (opts.workers + opts.warm_instances + super::sandbox::CHECK_SLOTS + 8) as u32
}

impl WasmEngine {
    /// Creates the engine and linker and starts the epoch ticker (it stops with the engine).
    pub fn new(opts: &PluginOptions) -> Result<WasmEngine> {
        let mut config = compiler::code_config();
        let slots = pool_slots(opts);
        let mut pool = PoolingAllocationConfig::default();
        // A component built by a non-Rust toolchain may hold several core instances, memories
        // and tables: each instance may hold the limiter's number of each, and the pool has room
        // for every instance at those caps, so no plugin can take another's slots. A memory may
        // be as large as a plugin's memory_bytes allows: the limiter caps all of an instance's
        // memories together.
        pool.max_memory_size(limiter::MAX_MEMORY_BYTES)
            .table_elements(limiter::TABLE_ELEMENTS)
            .total_component_instances(slots)
            .total_core_instances(slots * limiter::CORE_INSTANCES)
            .total_memories(slots * limiter::MEMORIES)
            .total_tables(slots * limiter::TABLES)
            .total_stacks(slots)
            .max_core_instances_per_component(limiter::CORE_INSTANCES)
            .max_memories_per_component(limiter::MEMORIES)
            .max_tables_per_component(limiter::TABLES);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine =
            Engine::new(&config).map_err(|e| anyhow!("creating the wasm engine: {e:#}"))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| anyhow!("linking WASI: {e:#}"))?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| anyhow!("linking wasi:http: {e:#}"))?;
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
        Ok(WasmEngine {
            engine,
            linker,
            cache: opts
                .cache_dir
                .as_deref()
                .and_then(|d| Cache::open(d, opts.cache_keep)),
            compiler: opts.compiler.clone(),
            compile_turn: Default::default(),
            compiles: AtomicUsize::new(0),
            cleaned: Mutex::new(None),
        })
    }

    /// Compiles running or waiting for their turn.
    pub fn compiles(&self) -> usize {
        self.compiles.load(Ordering::Relaxed)
    }

    /// How this engine's cache file names end: the wasmtime version and a hash of the engine's
    /// settings, so no other engine loads them.
    fn cache_suffix(&self) -> String {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut h);
        format!("-wasmtime48-{:016x}.cwasm", h.finish())
    }

    fn cache_path(&self, digest: &str) -> Option<PathBuf> {
        let dir = &self.cache.as_ref()?.dir;
        Some(dir.join(format!("{digest}{}", self.cache_suffix())))
    }

    /// Cleans the compiled-code cache (see `Cache::clean`) when it was not cleaned in the last
    /// hour; blocking (file system calls).
    pub fn clean_cache(&self, loaded: &[String]) {
        let Some(cache) = &self.cache else { return };
        {
            let mut cleaned = self.cleaned.lock().unwrap_or_else(|e| e.into_inner());
            if cleaned.is_some_and(|t| t.elapsed() < Duration::from_secs(3600)) {
                return;
            }
            *cleaned = Some(Instant::now());
        }
        let removed = cache.clean(&self.cache_suffix(), loaded);
        if removed > 0 {
            info!(
                removed,
                "removed compiled plugins no runner of this build loads again from {}",
                cache.dir.display()
            );
        }
    }

    /// Compiles and checks a plugin binary: it must be a component whose imports the host
    /// provides and which exports `handle` of the contract. Blocking (seconds for a large
    /// plugin): call it off the async runtime. Compiles take turns by `team` (the key that
    /// uploaded the plugin, else its name).
    pub fn compile(
        &self,
        name: &str,
        team: &str,
        version: u64,
        wasm: &[u8],
    ) -> Result<Loaded, String> {
        let digest = digest(wasm);
        let cached = self
            .cache_path(&digest)
            .zip(self.cache.as_ref())
            .and_then(|(p, cache)| cache.read(&p))
            .and_then(|bytes| {
                // SAFETY: these bytes carry a MAC made with this cache's private key, which only
                // `write_cache` makes, over compiled code (`Component::serialize`, or
                // `Engine::precompile_component` in the compiler child) of an engine with
                // the same compatibility hash (it is in the file name).
                unsafe { Component::deserialize(&self.engine, &bytes) }.ok()
            });
        let component = match cached {
            Some(c) => c,
            None => {
                let _counted = Counted::new(&self.compiles);
                let _turn = self.compile_turn.take(team);
                self.compile_fresh(&digest, wasm)?
            }
        };
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            format!("the plugin imports something the host does not offer: {e:#} (the host offers WASI 0.2 with wasi:http, and eggtimer:plugin/host)")
        })?;
        let pre = PluginPre::new(pre)
            .map_err(|e| format!("the plugin does not export the eggtimer handler: {e:#}"))?;
        Ok(Loaded {
            name: name.to_owned(),
            team: team.to_owned(),
            version,
            digest,
            check: component.get_export_index(None, "check"),
            schema: component.get_export_index(None, "payload-schema"),
            schema_text: Default::default(),
            pre: Arc::new(pre),
        })
    }

    /// Compiles `wasm` (in the bounded child process when there is one) and caches the code.
    fn compile_fresh(&self, digest: &str, wasm: &[u8]) -> Result<Component, String> {
        let (component, code) = match &self.compiler {
            Some(lim) => {
                let code = compiler::compile(lim, wasm).map_err(|e| explain(&e))?;
                // SAFETY: the code is the output of `Engine::precompile_component` of this very
                // binary (the child runs /proc/self/exe) over the uploaded wasm; `deserialize`
                // checks it was made with this engine's settings.
                let c = unsafe { Component::deserialize(&self.engine, &code) }
                    .map_err(|e| explain(&format!("{e:#}")))?;
                (c, Some(code))
            }
            None => {
                let c = Component::from_binary(&self.engine, wasm)
                    .map_err(|e| explain(&format!("{e:#}")))?;
                let code = c
                    .serialize()
                    .map_err(|e| warn!("could not serialize a compiled plugin: {e:#}"))
                    .ok();
                (c, code)
            }
        };
        if let Some(code) = code {
            self.write_cache(digest, &code);
        }
        Ok(component)
    }

    fn write_cache(&self, digest: &str, code: &[u8]) {
        let (Some(cache), Some(p)) = (self.cache.as_ref(), self.cache_path(digest)) else {
            return;
        };
        if let Err(e) = cache.write(&p, code) {
            warn!(
                "could not write the compiled-plugin cache at {}: {e}",
                p.display()
            );
        }
    }
}

/// A compile error, for the uploader.
fn explain(e: &str) -> String {
    if e.contains("exceeds the configured maximum") {
        // the pooling allocator's per-component limits (see `limiter`)
        format!("the component asks for more than a plugin may have: {e}")
    } else if e.contains("--plugin-compile-") || e.starts_with("could not start the compiler") {
        e.to_owned()
    } else {
        format!("not a valid WebAssembly component (build it with `--target wasm32-wasip2`): {e}")
    }
}
