//! The plugin registry: uploads are checked (compiled, contract fitted) before they are stored in
//! Redis by digest; every runner on the namespace hears the announcement and swaps to the new
//! current version; a runner that starts or reconnects loads the current versions from Redis.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::watch;
use tracing::{info, warn};

use super::{Loaded, Plugins, digest};
use eggtimer_base::names::valid_plugin_name;
use eggtimer_base::plugin_settings::PluginEntry;
use eggtimer_store::{Heard, OWNER_PAUSES_CHANGED, Promoted, Store};

/// What the registry's listener asks its loader to load.
enum Load {
    /// Every plugin (the reason, for a failure's log line).
    Everything(&'static str),
    /// The plugin of this name.
    One(String),
}

/// A plugin binary compiled and started once, not stored yet.
pub struct Prepared {
    pub loaded: Arc<Loaded>,
    wasm: Vec<u8>,
}

/// A plugin version as the API shows it.
pub type PluginVersion = PluginEntry;

/// Why an upload was refused.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("{0:?} is not a plugin name: use [a-z0-9][a-z0-9-]{{0,63}}")]
    BadName(String),
    #[error("the plugin is {0} bytes; the limit is {1}")]
    TooLarge(usize, usize),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] anyhow::Error),
}

/// Uploads, rollbacks and hot reload of plugins.
pub struct Registry {
    store: Store,
    plugins: Arc<Plugins>,
    max_bytes: usize,
}

impl Registry {
    /// The registry of `store`'s namespace, serving `plugins`: both read each plugin's policy
    /// from the store's table, which [`Registry::sync_settings`] makes.
    pub fn new(store: Store, plugins: Arc<Plugins>, max_bytes: usize) -> Arc<Registry> {
        plugins.follow(store.policies());
        Arc::new(Registry {
            store,
            plugins,
            max_bytes,
        })
    }

    pub fn plugins(&self) -> &Arc<Plugins> {
        &self.plugins
    }

    /// Whether a plugin of this name exists: loaded here, or stored (another runner's upload
    /// this one has not loaded yet).
    pub async fn exists(&self, name: &str) -> Result<bool> {
        Ok(self.plugins.get(name).is_some() || self.store.plugin_current(name).await?.is_some())
    }

    /// Checks, stores and installs a plugin uploaded by the key `team` (None: the runner's own
    /// seeding); returns its entry and whether it is a new version.
    pub async fn upload(
        &self,
        name: &str,
        team: Option<&str>,
        wasm: Vec<u8>,
    ) -> Result<(PluginEntry, bool), UploadError> {
        let prepared = self.prepare(name, team, wasm).await?;
        self.store_version(prepared, team, false).await
    }

    /// Checks a plugin binary uploaded by the key `team`: compiled, fitted to the contract, its
    /// start code run once (a plugin that can't start is refused, not stored).
    pub async fn prepare(
        &self,
        name: &str,
        team: Option<&str>,
        wasm: Vec<u8>,
    ) -> Result<Prepared, UploadError> {
        if !valid_plugin_name(name) {
            return Err(UploadError::BadName(name.to_owned()));
        }
        if wasm.len() > self.max_bytes {
            return Err(UploadError::TooLarge(wasm.len(), self.max_bytes));
        }
        // a name deleted earlier starts clean, even if that delete was cut short
        self.store.plugin_purge(name).await?;
        let plugins = Arc::clone(&self.plugins);
        let (owned, turn) = (name.to_owned(), team.unwrap_or(name).to_owned());
        let (loaded, wasm) =
            tokio::task::spawn_blocking(move || (plugins.compile(&owned, &turn, 0, &wasm), wasm))
                .await
                .context("compiling a plugin")?;
        let loaded = loaded.map_err(UploadError::Invalid)?;
        self.plugins
            .start_once(&loaded)
            .await
            .map_err(|e| UploadError::Invalid(format!("the plugin can't start: {e}")))?;
        Ok(Prepared {
            loaded: Arc::new(loaded),
            wasm,
        })
    }

    /// Stores a prepared version and installs it, or keeps it as a `candidate` (not current, not
    /// announced; a plugin's first version is current whatever was asked); returns its entry and
    /// whether it is a new version.
    pub async fn store_version(
        &self,
        prepared: Prepared,
        team: Option<&str>,
        candidate: bool,
    ) -> Result<(PluginEntry, bool), UploadError> {
        let Prepared { loaded, wasm } = prepared;
        let name = loaded.name.clone();
        let at = self.store.clock().now_ms();
        let (version, created) = self
            .store
            .plugin_put(&name, &loaded.digest, &wasm, at, team, candidate)
            .await?;
        let stored = self
            .store
            .plugin_history(&name)
            .await?
            .into_iter()
            .find(|e| e.version == version);
        let current = self.store.plugin_current(&name).await?;
        let entry = match (stored, current) {
            (Some(e), _) => e,
            (None, Some(cur)) => cur,
            (None, None) => {
                return Err(UploadError::Store(anyhow::anyhow!(
                    "plugin {name:?} was deleted while it was stored"
                )));
            }
        };
        if !entry.candidate {
            // stored and announced: should reading the registry fail here, the announcement
            // loads it
            let mut loaded = Loaded::clone(&loaded);
            loaded.version = version;
            if let Err(e) = self.install_if_current(loaded).await {
                warn!(
                    plugin = %name,
                    "loading the plugin just stored failed: {e:#}"
                );
            }
        }
        Ok((entry, created))
    }

    /// A stored version, compiled (the loaded one when it is current here): what a check of the
    /// waiting tasks or a dry run runs.
    pub async fn version(&self, entry: &PluginEntry) -> Result<Arc<Loaded>, String> {
        if let Some(l) = self.plugins.get(&entry.name)
            && l.digest == entry.digest
        {
            return Ok(l);
        }
        let wasm = self
            .store
            .plugin_blob(&entry.digest)
            .await
            .map_err(|e| format!("reading v{} of {:?}: {e:#}", entry.version, entry.name))?
            .ok_or_else(|| format!("v{} of {:?} is no longer stored", entry.version, entry.name))?;
        let plugins = Arc::clone(&self.plugins);
        let e = entry.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            plugins.compile(&e.name, e.team(), e.version, &wasm)
        })
        .await
        .map_err(|e| format!("compiling: {e}"))??;
        Ok(Arc::new(loaded))
    }

    /// Makes version `version` of `name` current if `expected` still is (see
    /// [`Store::plugin_promote`]), and loads it here.
    pub async fn promote(
        &self,
        name: &str,
        version: u64,
        expected: Option<u64>,
    ) -> Result<Promoted> {
        let r = self.store.plugin_promote(name, version, expected).await?;
        if matches!(r, Promoted::Done(_)) {
            self.sync_one(name).await?;
        }
        Ok(r)
    }

    /// Installs `loaded` when the registry still names its bytes the current version of its name:
    /// a compile that took long (or an upload that raced another) must not replace a newer version
    /// installed meanwhile, nor bring back a plugin deleted meanwhile.
    async fn install_if_current(&self, mut loaded: Loaded) -> Result<()> {
        match self.store.plugin_current(&loaded.name).await? {
            Some(cur) if cur.digest == loaded.digest => {
                loaded.version = cur.version;
                self.store.set_team(&loaded.name, &loaded.team);
                self.plugins.install(loaded);
            }
            cur => info!(
                plugin = %loaded.name,
                "not loading v{} compiled just now: the registry names {} now",
                loaded.version,
                cur.map_or("no version".to_owned(), |c| format!("v{}", c.version))
            ),
        }
        Ok(())
    }

    /// Deletes a plugin and what is its (versions, settings, secrets, kv, slots, rate state);
    /// its tasks are the caller's business.
    pub async fn delete(&self, name: &str) -> Result<bool> {
        let existed = self.store.plugin_delete(name).await?;
        self.plugins.remove(name);
        Ok(existed)
    }

    /// Makes the loaded version of `name` the registry's current one.
    pub async fn sync_one(&self, name: &str) -> Result<()> {
        let Some(entry) = self.store.plugin_current(name).await? else {
            if self.plugins.get(name).is_some() {
                info!(plugin = name, "plugin deleted");
                self.plugins.remove(name);
            }
            return Ok(());
        };
        if let Some(l) = self.plugins.get(name)
            && l.digest == entry.digest
        {
            if l.version != entry.version {
                // same bytes under another version number (a seeded file): relabel
                let plugins = Arc::clone(&self.plugins);
                let wasm = self
                    .store
                    .plugin_blob(&entry.digest)
                    .await?
                    .unwrap_or_default();
                let e = entry.clone();
                if let Ok(Ok(loaded)) = tokio::task::spawn_blocking(move || {
                    plugins.compile(&e.name, e.team(), e.version, &wasm)
                })
                .await
                {
                    self.install_if_current(loaded).await?;
                }
            }
            return Ok(());
        }
        let wasm = self
            .store
            .plugin_blob(&entry.digest)
            .await?
            .with_context(|| {
                format!(
                    "the binary of {name} v{} is missing from Redis",
                    entry.version
                )
            })?;
        let plugins = Arc::clone(&self.plugins);
        let e = entry.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            plugins.compile(&e.name, e.team(), e.version, &wasm)
        })
        .await
        .context("compiling a plugin")?
        .map_err(|err| anyhow::anyhow!("{name} v{}: {err}", entry.version))?;
        self.install_if_current(loaded).await
    }

    /// Makes every plugin's policy from the registry's settings (each limit held under its
    /// admin's ceiling) and swaps them in whole: the executor, the plugin host and the quota
    /// check read the new ones from their next read on.
    pub async fn sync_settings(&self) -> Result<()> {
        let all = self.store.plugin_settings_all().await?;
        self.store.policies().set(all);
        Ok(())
    }

    /// Loads the registry's current version of every plugin, and unloads what it no longer has.
    pub async fn sync_all(&self) -> Result<()> {
        self.sync_settings().await?;
        let entries = self.store.plugin_list().await?;
        for e in &entries {
            if let Err(err) = self.sync_one(&e.name).await {
                warn!("loading plugin {} failed: {err:#}", e.name);
            }
        }
        for (name, _, _) in self.plugins.loaded() {
            if !entries.iter().any(|e| e.name == name) {
                self.sync_one(&name).await?;
            }
        }
        Ok(())
    }

    /// Seeds the registry from a directory: each `<name>.wasm` is uploaded unless the registry
    /// already has a plugin of that name (then the registry's version wins, so a restart never
    /// undoes an upload).
    pub async fn seed_dir(&self, dir: &Path) -> Result<Vec<String>> {
        let mut seeded = Vec::new();
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| format!("reading the plugins directory {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("wasm"))
            .collect();
        entries.sort();
        for path in entries {
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_owned();
            let wasm =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            match self.store.plugin_current(&name).await? {
                Some(cur) if cur.digest != digest(&wasm) => {
                    info!(plugin = %name, "the registry has version {} of {name}; not seeding {}", cur.version, path.display());
                }
                // deleted through the API: a restart does not bring it back
                None if self.store.plugin_ever_uploaded(&name).await? => {
                    info!(plugin = %name, "{name} was deleted; not seeding {}", path.display());
                }
                _ => {
                    self.upload(&name, None, wasm)
                        .await
                        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                    seeded.push(name);
                }
            }
        }
        Ok(seeded)
    }

    /// Cleans the compiled-code cache (at most hourly; off the async threads).
    async fn clean_cache(&self) {
        let plugins = Arc::clone(&self.plugins);
        let _ = tokio::task::spawn_blocking(move || plugins.clean_cache()).await;
    }

    /// Follows announcements until `stop`: every announcement applies the settings at once, and
    /// hands the plugin to load to `load` (a task of its own), so that a plugin compiling for a
    /// minute holds up no setting of another; an owner's pauses changed, the owners' pauses are
    /// read again; on every (re)subscription, and every 30 s in case a message was lost,
    /// everything is loaded. A sync under way when `stop` comes is dropped (a
    /// compile in progress ends on its own thread, bounded by its timeout).
    pub async fn listen(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let channel = self.store.keys().plugins_channel();
        let mut sub = self.store.subscribe(channel, "plugin announcements");
        let mut resync = tokio::time::interval(Duration::from_secs(30));
        resync.tick().await;
        let (to_load, asked) = tokio::sync::mpsc::unbounded_channel();
        let loader = tokio::spawn(Arc::clone(&self).load(asked));
        loop {
            tokio::select! {
                heard = sub.next() => match heard {
                    Heard::Subscribed => {
                        self.apply_settings().await;
                        self.apply_owner_pauses().await;
                        let _ = to_load.send(Load::Everything("loading plugins from Redis"));
                    }
                    Heard::Message(name) if name == OWNER_PAUSES_CHANGED => {
                        self.apply_owner_pauses().await;
                    }
                    Heard::Message(name) => {
                        self.apply_settings().await;
                        let _ = to_load.send(Load::One(name));
                    }
                },
                _ = resync.tick() => {
                    self.apply_owner_pauses().await;
                    let _ = to_load.send(Load::Everything("resyncing plugins"));
                }
                _ = stop.changed() => {
                    loader.abort();
                    return;
                }
            }
        }
    }

    async fn apply_settings(&self) {
        if let Err(e) = self.sync_settings().await {
            warn!("reloading plugin settings failed: {e:#}");
        }
    }

    async fn apply_owner_pauses(&self) {
        if let Err(e) = self.store.sync_owner_pauses().await {
            warn!("reloading the owners' pauses failed: {e:#}");
        }
    }

    /// Loads what `listen` asks for, one plugin at a time: what was asked while a compile ran is
    /// loaded after it, each name once, everything once.
    async fn load(self: Arc<Self>, mut asked: tokio::sync::mpsc::UnboundedReceiver<Load>) {
        while let Some(first) = asked.recv().await {
            let mut names: Vec<String> = Vec::new();
            let mut everything = None;
            let mut next = Some(first);
            while let Some(l) = next {
                match l {
                    Load::Everything(what) => everything = Some(what),
                    Load::One(name) if !names.contains(&name) => names.push(name),
                    Load::One(_) => {}
                }
                next = asked.try_recv().ok();
            }
            if let Some(what) = everything {
                self.sync_everything(what).await;
                continue;
            }
            for name in names {
                if let Err(e) = self.sync_one(&name).await {
                    warn!("reloading plugin {name} failed: {e:#}");
                }
            }
        }
    }

    /// Loads every plugin (`what` names the attempt in a failure's log line) and cleans the
    /// compiled-code cache.
    async fn sync_everything(&self, what: &str) {
        if let Err(e) = self.sync_all().await {
            warn!("{what} failed: {e:#}");
        }
        self.clean_cache().await;
    }
}

/// The task service asks the registry: a plugin exists when it is loaded here or stored, and its
/// current version checks payloads in one of the runner's check slots.
impl crate::tasks::PluginChecks for Registry {
    fn exists<'a>(&'a self, name: &'a str) -> futures::future::BoxFuture<'a, Result<bool>> {
        Box::pin(Registry::exists(self, name))
    }

    fn loaded(&self) -> Vec<String> {
        self.plugins.loaded().into_iter().map(|(n, ..)| n).collect()
    }

    fn check<'a>(
        &'a self,
        plugin: &'a str,
        payloads: Vec<String>,
    ) -> futures::future::BoxFuture<'a, Result<crate::tasks::Verdicts, crate::tasks::Unchecked>>
    {
        Box::pin(async move {
            self.plugins
                .check(plugin, payloads)
                .await
                .map_err(crate::tasks::Unchecked::from)
        })
    }
}
