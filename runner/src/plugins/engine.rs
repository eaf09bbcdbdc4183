//! The wasm engine: configuration (async calls, epoch interruption, pooling allocator sized from
//! the worker count), the linker with WASI and the eggtimer host, compiling and checking a
//! plugin, and the on-disk cache of compiled code.

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
use super::{Loaded, PluginOptions, digest};

/// How long one epoch tick is: a running guest yields (and its time limit is checked) this often.
pub(super) const TICK: Duration = Duration::from_millis(10);

/// The engine and linker, shared by every plugin.
pub(super) struct WasmEngine {
    pub engine: Engine,
    pub linker: Linker<State>,
    cache_dir: Option<PathBuf>,
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
        // and tables: room for a few of each per instance.
        pool.max_memory_size(opts.memory)
            .total_component_instances(slots)
            .total_core_instances(slots * 8)
            .total_memories(slots * 2)
            .total_tables(slots * 8)
            .total_stacks(slots)
            .max_memories_per_component(4);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine =
            Engine::new(&config).map_err(|e| anyhow!("creating the wasm engine: {e:#}"))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
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
        Ok(WasmEngine {
            engine,
            linker,
            cache_dir: opts.cache_dir.clone(),
        })
    }

    fn cache_path(&self, digest: &str) -> Option<PathBuf> {
        let dir = self.cache_dir.as_ref()?;
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
                self.write_cache(&digest, &c);
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
            pre: Arc::new(pre),
        })
    }

    fn write_cache(&self, digest: &str, c: &Component) {
        if let (Some(p), Ok(bytes)) = (self.cache_path(digest), c.serialize()) {
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
    }
}
