//! The plugin registry's data in Redis: binaries by digest, the current version of each name and
//! its history. Every change is one script on the namespace slot that also announces it.

use std::collections::HashMap;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::{DEFAULT_MAX_PENDING, Store};

/// One version of a plugin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PluginEntry {
    pub name: String,
    pub version: u64,
    pub digest: String,
    pub size: u64,
    pub uploaded_at: i64,
    /// The id of the key that uploaded it (`admin` for the runner's token; absent for a plugin
    /// the runner seeded from its directory, or one uploaded before 0.2.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploaded_by: Option<String>,
    /// Stored but never made current (uploaded with `?promote=false`, or refused by its check
    /// of the waiting tasks): `POST /v1/plugins/{name}/promote` makes it current.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub candidate: bool,
    /// The current version only: the version that was current before it became current (absent
    /// for a first version, or one made current by 0.2.0). `POST /v1/plugins/{name}/rollback`
    /// makes that one current again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<u64>,
}

impl PluginEntry {
    /// Whose turn its compiles take: the key that uploaded it, else its name.
    pub fn team(&self) -> &str {
        self.uploaded_by.as_deref().unwrap_or(&self.name)
    }
}

/// A plugin's settings, kept apart from its versions (an upload or rollback keeps them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginSettings {
    /// No runner starts its tasks (they wait, parked, without using attempts).
    #[serde(default)]
    pub paused: bool,
    /// At most this many runs at once across the namespace's runners (None: no limit).
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// The plugin's share of workers when plugins compete, against the others' (None: 1).
    #[serde(default)]
    pub weight: Option<u32>,
    /// Plugin patterns whose tasks this plugin may schedule and cancel besides its own (None:
    /// its own only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub may_schedule: Option<Vec<String>>,
    /// The time limit of one of its runs, ms (None: the runner's `--plugin-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_ms: Option<u64>,
    /// The memory cap of one of its instances, bytes (None: the runner's `--plugin-memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// The time limit of one call of its `check` (and `payload-schema`), ms (None: the runner's
    /// `--check-timeout`), apart from its runs'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_time_limit_ms: Option<u64>,
    /// At most this many runs of one owner's tasks at once across all runners (None: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency_per_owner: Option<u32>,
    /// At most `max` starts in any `per_ms` ms across all runners (None: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// At most this many of its tasks scheduled (None: `DEFAULT_MAX_PENDING`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending: Option<u64>,
    /// Origins the plugin may send HTTP requests to (None: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_hosts: Option<Vec<String>>,
    /// Strings the plugin reads with `config(name)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<std::collections::BTreeMap<String, String>>,
    /// An admin's ceilings on the limits above: a developer key sets values at or below them,
    /// and what applies is never above them (`effective`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceilings: Option<Ceilings>,
}

/// An admin's ceilings on a plugin's limits (None: no ceiling but the operator's caps).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Ceilings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency_per_owner: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_time_limit_ms: Option<u64>,
}

impl Ceilings {
    pub fn is_empty(&self) -> bool {
        self == &Ceilings::default()
    }
}

/// The smaller of a value and a ceiling, where None is "no limit".
fn under<T: Ord + Copy>(v: Option<T>, ceiling: Option<T>) -> Option<T> {
    match (v, ceiling) {
        (Some(v), Some(c)) => Some(v.min(c)),
        (v, None) => v,
        (None, c) => c,
    }
}

impl RateLimit {
    /// Whether this rate allows no more than `other`: no more starts per unit of time, and no
    /// larger burst.
    pub fn within(&self, other: &RateLimit) -> bool {
        u128::from(self.max) * u128::from(other.per_ms)
            <= u128::from(other.max) * u128::from(self.per_ms)
            && self.max <= other.max
    }
}

impl PluginSettings {
    /// The settings that apply: each limit held under its ceiling. `time_limit_ms`,
    /// `memory_bytes` and `check_time_limit_ms` unset mean the runner's defaults (given), held
    /// under a ceiling too.
    pub fn effective(
        &self,
        default_time_limit_ms: u64,
        default_memory: u64,
        default_check_ms: u64,
    ) -> PluginSettings {
        let Some(c) = &self.ceilings else {
            return self.clone();
        };
        let with_default = |v: Option<u64>, c: Option<u64>, d: u64| match c {
            Some(c) => Some(v.unwrap_or(d).min(c)),
            None => v,
        };
        PluginSettings {
            max_pending: with_default(self.max_pending, c.max_pending, DEFAULT_MAX_PENDING),
            max_concurrency: under(self.max_concurrency, c.max_concurrency),
            max_concurrency_per_owner: under(
                self.max_concurrency_per_owner,
                c.max_concurrency_per_owner,
            ),
            rate_limit: match (self.rate_limit, c.rate_limit) {
                (Some(v), Some(c)) if !v.within(&c) => Some(c),
                (None, c) => c,
                (v, _) => v,
            },
            // unset is 1, the least there is: a ceiling can only lower a weight that was set
            weight: self.weight.map(|w| w.min(c.weight.unwrap_or(u32::MAX))),
            time_limit_ms: with_default(self.time_limit_ms, c.time_limit_ms, default_time_limit_ms),
            memory_bytes: with_default(self.memory_bytes, c.memory_bytes, default_memory),
            check_time_limit_ms: with_default(
                self.check_time_limit_ms,
                c.check_time_limit_ms,
                default_check_ms,
            ),
            ..self.clone()
        }
    }
}

/// A run put back to wait for a concurrency slot: its task, occurrence and attempts (as the put
/// back recorded them, the attempt given back).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotWaiter {
    pub id: String,
    pub created: i64,
    pub attempts: u32,
}

impl SlotWaiter {
    fn member(&self) -> String {
        format!("{}\t{}\t{}", self.id, self.created, self.attempts)
    }

    fn parse(member: &str) -> Option<SlotWaiter> {
        let mut f = member.rsplitn(3, '\t');
        let attempts = f.next()?.parse().ok()?;
        let created = f.next()?.parse().ok()?;
        Some(SlotWaiter {
            id: f.next()?.to_owned(),
            created,
            attempts,
        })
    }
}

/// A plugin's rate limit: at most `max` starts in any `per_ms` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RateLimit {
    pub max: u32,
    pub per_ms: u64,
}

/// Whose concurrency slots: a plugin's (`max_concurrency`), or those of one owner's runs of a
/// plugin (`max_concurrency_per_owner`).
#[derive(Debug, Clone, Copy)]
pub enum SlotsOf<'a> {
    Plugin(&'a str),
    Owner { plugin: &'a str, owner: &'a str },
}

/// Outcome of a rollback.
#[derive(Debug, PartialEq, Eq)]
pub enum Promoted {
    /// Now current.
    Done(PluginEntry),
    /// No such plugin, or no such version in its history.
    Missing,
    /// The current version is no longer the one the caller checked against.
    Moved,
}

impl Store {
    /// Stores `wasm` as the new current version of `name` (or finds it is current already);
    /// returns (version, created).
    pub async fn plugin_put(
        &self,
        name: &str,
        digest: &str,
        wasm: &[u8],
        uploaded_at: i64,
        uploaded_by: Option<&str>,
        candidate: bool,
    ) -> Result<(u64, bool)> {
        let k = self.keys();
        let (version, created): (u64, u8) = self
            .inner
            .scripts
            .plugin_put
            .key(k.plugins())
            .key(k.plugin_history(name))
            .key(k.plugin_blob(digest))
            .key(k.plugin_seq())
            .arg(name)
            .arg(digest)
            .arg(wasm.len())
            .arg(uploaded_at)
            .arg(wasm)
            .arg(k.plugins_channel())
            .arg(self.inner.opts.keep_versions.max(1))
            .arg(k.plugin_history_prefix())
            .arg(k.plugin_blob_prefix())
            .arg(uploaded_by.unwrap_or(""))
            .arg(if candidate { "1" } else { "0" })
            .invoke_async(&mut self.conn())
            .await
            .context("storing a plugin")?;
        Ok((version, created == 1))
    }

    /// Makes version `version` of `name` (from its history) current, if the current version is
    /// still `expected` (None: whatever it is); announces it.
    pub async fn plugin_promote(
        &self,
        name: &str,
        version: u64,
        expected: Option<u64>,
    ) -> Result<Promoted> {
        let k = self.keys();
        let r: String = self
            .inner
            .scripts
            .plugin_promote
            .key(k.plugins())
            .key(k.plugin_history(name))
            .arg(name)
            .arg(version)
            .arg(k.plugins_channel())
            .arg(expected.map_or(String::new(), |v| v.to_string()))
            .invoke_async(&mut self.conn())
            .await
            .context("making a plugin version current")?;
        Ok(match r.as_str() {
            "missing" => Promoted::Missing,
            "moved" => Promoted::Moved,
            json => Promoted::Done(serde_json::from_str(json).context("a plugin entry")?),
        })
    }

    /// Deletes a plugin; false when there was none.
    pub async fn plugin_delete(&self, name: &str) -> Result<bool> {
        let k = self.keys();
        let kv_index = k.plugin_kv_index(name);
        let n: i64 = self
            .inner
            .scripts
            .plugin_delete
            .key(k.plugins())
            .key(k.plugin_history(name))
            .key(k.plugin_settings())
            .key(k.plugin_pause_epoch())
            .key(k.plugin_secrets(name))
            .key(k.plugin_slots(name))
            .key(k.plugin_rate(name))
            .key(k.plugin_slot_waits(name))
            .key(k.plugin_purge())
            .key(k.plugin_rate_queue(name))
            .key(k.plugin_topics(name))
            .key(&kv_index[0])
            .key(&kv_index[1])
            .key(&kv_index[2])
            .arg(name)
            .arg(k.plugins_channel())
            .arg(k.plugin_history_prefix())
            .arg(k.plugin_blob_prefix())
            .invoke_async(&mut self.conn())
            .await
            .context("deleting a plugin")?;
        if n == 1 {
            self.plugin_purge(name).await?;
        }
        Ok(n == 1)
    }

    /// Deletes the keys of a deleted plugin that only a pattern names (kv, per-owner slots),
    /// and the sources of its emitted events, in chunks that hold Redis briefly; returns how
    /// many keys. A no-op unless `name` is in the purge set (deleted, and not purged yet).
    pub async fn plugin_purge(&self, name: &str) -> Result<u64> {
        let k = self.keys();
        let pending: bool = redis::cmd("SISMEMBER")
            .arg(k.plugin_purge())
            .arg(name)
            .query_async(&mut self.conn())
            .await
            .context("reading the purge set")?;
        if !pending {
            return Ok(0);
        }
        // the sources reading its emitted events go with it: a plugin uploaded again under its
        // name (perhaps by another team) feeds no topic through them
        for s in self.source_list().await? {
            if s.plugin.as_deref() == Some(name) {
                self.source_delete(&s.name).await?;
            }
        }
        let (mut cursor, mut total) = ("0".to_owned(), 0u64);
        loop {
            let mut inv = self.inner.scripts.plugin_purge.prepare_invoke();
            inv.key(k.plugin_purge()).arg(name).arg(&cursor).arg(1000);
            for p in k.plugin_key_prefixes(name) {
                inv.arg(p);
            }
            let (next, n): (String, u64) = inv
                .invoke_async(&mut self.conn())
                .await
                .context("deleting a deleted plugin's keys")?;
            total += n;
            if next == "0" {
                return Ok(total);
            }
            cursor = next;
        }
    }

    /// Whether a plugin of this name was uploaded at some time (its version counter exists; a
    /// delete keeps it, so versions never repeat).
    pub async fn plugin_ever_uploaded(&self, name: &str) -> Result<bool> {
        let k = self.keys();
        redis::cmd("HEXISTS")
            .arg(k.plugin_seq())
            .arg(name)
            .query_async(&mut self.conn())
            .await
            .context("reading the plugin version counters")
    }

    /// The name of every plugin in the registry.
    pub async fn plugin_names(&self) -> Result<Vec<String>> {
        redis::cmd("HKEYS")
            .arg(self.keys().plugins())
            .query_async(&mut self.conn())
            .await
            .context("listing plugin names")
    }

    /// The current version of every plugin.
    pub async fn plugin_list(&self) -> Result<Vec<PluginEntry>> {
        let all: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.keys().plugins())
            .query_async(&mut self.conn())
            .await
            .context("listing plugins")?;
        let mut v: Vec<PluginEntry> = all
            .iter()
            .filter_map(|(_, j)| serde_json::from_str(j).ok())
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    }

    pub async fn plugin_current(&self, name: &str) -> Result<Option<PluginEntry>> {
        let j: Option<String> = redis::cmd("HGET")
            .arg(self.keys().plugins())
            .arg(name)
            .query_async(&mut self.conn())
            .await
            .context("reading a plugin")?;
        Ok(j.and_then(|j| serde_json::from_str(&j).ok()))
    }

    /// Every version of a plugin, newest first.
    pub async fn plugin_history(&self, name: &str) -> Result<Vec<PluginEntry>> {
        let all: Vec<String> = redis::cmd("LRANGE")
            .arg(self.keys().plugin_history(name))
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn())
            .await
            .context("reading a plugin's history")?;
        Ok(all
            .iter()
            .filter_map(|j| serde_json::from_str(j).ok())
            .collect())
    }

    pub async fn plugin_blob(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        let b: Option<Vec<u8>> = redis::cmd("GET")
            .arg(self.keys().plugin_blob(digest))
            .query_async(&mut self.conn())
            .await
            .context("reading a plugin binary")?;
        Ok(b)
    }

    /// The settings of every plugin that has any.
    pub async fn plugin_settings_all(&self) -> Result<HashMap<String, PluginSettings>> {
        let all: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.keys().plugin_settings())
            .query_async(&mut self.conn())
            .await
            .context("reading plugin settings")?;
        Ok(all
            .into_iter()
            .filter_map(|(k, j)| Some((k, serde_json::from_str(&j).ok()?)))
            .collect())
    }

    /// One plugin's settings (the defaults when it has none).
    pub async fn plugin_settings(&self, name: &str) -> Result<PluginSettings> {
        let j: Option<String> = redis::cmd("HGET")
            .arg(self.keys().plugin_settings())
            .arg(name)
            .query_async(&mut self.conn())
            .await
            .context("reading a plugin's settings")?;
        Ok(j.and_then(|j| serde_json::from_str(&j).ok())
            .unwrap_or_default())
    }

    /// Changes one of a plugin's settings (`field` to the JSON `value`) atomically and announces
    /// it to every runner; returns the plugin's pause epoch (see `lua/plugin_setting.lua`).
    pub(super) async fn set_plugin_setting(
        &self,
        name: &str,
        field: &str,
        value: &serde_json::Value,
    ) -> Result<u64> {
        let k = self.keys();
        self.inner
            .scripts
            .plugin_setting
            .key(k.plugin_settings())
            .key(k.plugin_pause_epoch())
            .arg(name)
            .arg(field)
            .arg(value.to_string())
            .arg(k.plugins_channel())
            .invoke_async(&mut self.conn())
            .await
            .context("changing a plugin's setting")
    }

    /// Changes one of a plugin's settings (the field of `PluginSettings` named `field`; null
    /// resets it to its default), and announces it. The caller has checked the value.
    pub async fn set_setting(
        &self,
        name: &str,
        field: &str,
        value: &serde_json::Value,
    ) -> Result<()> {
        self.set_plugin_setting(name, field, value)
            .await
            .map(|_| ())
    }

    fn slots_key(&self, of: SlotsOf<'_>) -> String {
        match of {
            SlotsOf::Plugin(plugin) => self.keys().plugin_slots(plugin),
            SlotsOf::Owner { plugin, owner } => self.keys().owner_slots(plugin, owner),
        }
    }

    fn slot_waits_key(&self, of: SlotsOf<'_>) -> String {
        match of {
            SlotsOf::Plugin(plugin) => self.keys().plugin_slot_waits(plugin),
            SlotsOf::Owner { plugin, owner } => self.keys().owner_slot_waits(plugin, owner),
        }
    }

    fn slots_script(&self, of: SlotsOf<'_>, op: &str) -> redis::ScriptInvocation<'_> {
        let mut inv = self.inner.scripts.slots.prepare_invoke();
        inv.key(self.slots_key(of))
            .key(self.slot_waits_key(of))
            .arg(op);
        inv
    }

    /// Asks to start run `attempt` of task `id` under its plugin's rate limit: 0 when it may
    /// start now, else the ms until the start reserved for it (see `lua/rate.lua`).
    pub async fn rate_take(
        &self,
        plugin: &str,
        (id, attempt): (&str, u32),
        rate: RateLimit,
    ) -> Result<u64> {
        self.inner
            .scripts
            .rate
            .key(self.keys().plugin_rate(plugin))
            .key(self.keys().plugin_rate_queue(plugin))
            .arg(format!("{id}\t{attempt}"))
            .arg(rate.max)
            .arg(rate.per_ms)
            .invoke_async(&mut self.conn())
            .await
            .context("asking the plugin's rate limit")
    }

    /// Takes (or renews) one of the `max` concurrency slots of `of` for `holder`, for
    /// `lease_ms`; false when all are taken.
    pub async fn slot_take(
        &self,
        of: SlotsOf<'_>,
        holder: &str,
        max: u32,
        lease_ms: u64,
    ) -> Result<bool> {
        let n: i64 = self
            .slots_script(of, "take")
            .arg(holder)
            .arg(max)
            .arg(lease_ms)
            .invoke_async(&mut self.conn())
            .await
            .context("taking a concurrency slot")?;
        Ok(n == 1)
    }

    /// Gives a concurrency slot back; answers the run waiting for one that is to be woken
    /// ([`Store::wake_waiter`]), if any.
    pub async fn slot_give(&self, of: SlotsOf<'_>, holder: &str) -> Result<Option<SlotWaiter>> {
        let next: Option<String> = self
            .slots_script(of, "give")
            .arg(holder)
            .invoke_async(&mut self.conn())
            .await
            .context("giving a concurrency slot back")?;
        Ok(next.as_deref().and_then(SlotWaiter::parse))
    }

    /// Puts a run that found every slot of `of` taken (and was put back, due `due`) among those
    /// waiting for one; true when a slot is free by now (the caller wakes it itself).
    pub async fn slot_wait(
        &self,
        of: SlotsOf<'_>,
        run: &SlotWaiter,
        max: u32,
        due: i64,
    ) -> Result<bool> {
        let free: i64 = self
            .slots_script(of, "wait")
            .arg(run.member())
            .arg(max)
            .arg(due)
            .invoke_async(&mut self.conn())
            .await
            .context("waiting for a concurrency slot")?;
        Ok(free == 1)
    }

    /// Moves a run waiting for a slot to now, if it still waits (the same occurrence and
    /// attempts, due within `within_ms`); false when it no longer does.
    pub async fn wake_waiter(&self, run: &SlotWaiter, within_ms: u64) -> Result<bool> {
        let shard = self.shard_of(&run.id);
        let v: Vec<redis::Value> = self
            .shard_script(&self.inner.scripts.move_task, shard)
            .arg(self.keys().wake_channel())
            .arg(shard)
            .arg(&run.id)
            .arg("wake")
            .arg(within_ms)
            .arg(run.created)
            .arg(run.attempts)
            .invoke_async(&mut self.conn())
            .await
            .context("waking a run waiting for a slot")?;
        Ok(matches!(v.first(), Some(redis::Value::BulkString(s)) if s == b"ok"))
    }
}
