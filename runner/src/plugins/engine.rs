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
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use tracing::warn;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings::{Plugin, PluginPre};
use super::host::State;
use super::limiter;
use super::{Loaded, PluginOptions, digest};

/// How long one epoch tick is: a running guest yields (and its time limit is checked) this often.
pub(super) const TICK: Duration = Duration::from_millis(10);

/// The engine and linker, shared by every plugin.
pub(super) struct WasmEngine {
    pub engine: Engine,
    pub linker: Linker<State>,
    cache: Option<Cache>,
}

/// The compiled-code cache: a private directory and the key its files are signed with.
struct Cache {
    dir: PathBuf,
    key: [u8; 32],
}

type Mac = hmac::Hmac<sha2::Sha256>;

impl Cache {
    /// Opens (or creates) the cache directory; None, with a warning, when it can't be trusted.
    fn open(dir: &Path) -> Option<Cache> {
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
            Ok(()) => Some(bytes),
            Err(_) => {
                warn!(
                    "{} does not match its MAC: compiling the plugin again",
                    path.display()
                );
                None
            }
        }
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
/// and a margin.
pub(super) fn pool_slots(opts: &PluginOptions) -> u32 {
    (opts.workers + opts.warm_instances + 8) as u32
}

impl WasmEngine {
    /// Creates the engine and linker and starts the epoch ticker (it stops with the engine).
    pub fn new(opts: &PluginOptions) -> Result<WasmEngine> {
        let mut config = Config::new();
        config.epoch_interruption(true);
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
            cache: opts.cache_dir.as_deref().and_then(Cache::open),
        })
    }

    fn cache_path(&self, digest: &str) -> Option<PathBuf> {
        let dir = &self.cache.as_ref()?.dir;
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
            .zip(self.cache.as_ref())
            .and_then(|(p, cache)| cache.read(&p))
            .and_then(|bytes| {
                // SAFETY: these bytes carry a MAC made with this cache's private key, which only
                // `write_cache` makes, over the output of `Component::serialize` of an engine with
                // the same compatibility hash (it is in the file name).
                unsafe { Component::deserialize(&self.engine, &bytes) }.ok()
            });
        let component = match cached {
            Some(c) => c,
            None => {
                let c = Component::from_binary(&self.engine, wasm).map_err(|e| {
                    let e = format!("{e:#}");
                    if e.contains("exceeds the configured maximum") {
                        // the pooling allocator's per-component limits (see `limiter`)
                        format!("the component asks for more than a plugin may have: {e}")
                    } else {
                        format!("not a valid WebAssembly component (build it with `--target wasm32-wasip2`): {e}")
                    }
                })?;
                self.write_cache(&digest, &c);
                c
            }
        };
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            format!("the plugin imports something the host does not offer: {e:#} (the host offers WASI 0.2 with wasi:http, and eggtimer:plugin/host)")
        })?;
        let pre = PluginPre::new(pre)
            .map_err(|e| format!("the plugin does not export the eggtimer handler: {e:#}"))?;
        Ok(Loaded {
            name: name.to_owned(),
            version,
            digest,
            pre: Arc::new(pre),
        })
    }

    fn write_cache(&self, digest: &str, c: &Component) {
        let (Some(cache), Some(p)) = (self.cache.as_ref(), self.cache_path(digest)) else {
            return;
        };
        match c.serialize() {
            Ok(bytes) => {
                if let Err(e) = cache.write(&p, &bytes) {
                    warn!(
                        "could not write the compiled-plugin cache at {}: {e}",
                        p.display()
                    );
                }
            }
            Err(e) => warn!("could not serialize a compiled plugin: {e:#}"),
        }
    }
}
