//! The plugin registry's data in Redis: binaries by digest, the current version of each name and
//! its history. Every change is one script on the namespace slot that also announces it.

use std::collections::HashMap;

use super::{Promoted, SlotWaiter, SlotsOf, Store};
use anyhow::{Context, Result, bail};
use eggtimer_base::plugin_settings::{PluginEntry, PluginSettings, RateLimit};

/// A plugin binary goes to Redis, and comes back, in commands of at most this many bytes each,
/// so no command holds Redis long whatever size the binary has (a 60 MB binary in one script
/// call held Redis 185–526 ms; a GET of it copies all of it into one reply).
pub const BLOB_PIECE: usize = 1 << 20;

/// How long an upload's pieces wait for the store script before Redis drops them (a runner
/// killed between the pieces and the script leaves nothing for longer).
const STAGING_TTL_MS: u64 = 10 * 60 * 1000;

impl Store {
    /// Stores `wasm` as the new current version of `name` (or finds it is current already);
    /// returns (version, created). The bytes go first, in pieces of [`BLOB_PIECE`], to a key of
    /// their own that expires; the store script then takes that key as the blob (a rename) or
    /// drops it when the blob is there already.
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
        let staging = k.plugin_staging(digest, rand::random());
        let mut conn = self.conn();
        for (i, piece) in wasm.chunks(BLOB_PIECE).enumerate() {
            let cmd = if i == 0 {
                let mut c = redis::cmd("SET");
                c.arg(&staging).arg(piece).arg("PX").arg(STAGING_TTL_MS);
                c
            } else {
                let mut c = redis::cmd("APPEND");
                c.arg(&staging).arg(piece);
                c
            };
            let _: redis::Value = cmd
                .query_async(&mut conn)
                .await
                .context("sending a plugin's bytes")?;
        }
        let (version, created): (u64, u8) = self
            .inner
            .scripts
            .plugin_put
            .key(k.plugins())
            .key(k.plugin_history(name))
            .key(k.plugin_blob(digest))
            .key(k.plugin_seq())
            .key(&staging)
            .arg(name)
            .arg(digest)
            .arg(wasm.len())
            .arg(uploaded_at)
            .arg("")
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
            .key(k.plugin_emitted(name))
            .arg(name)
            .arg(k.plugins_channel())
            .arg(k.plugin_history_prefix())
            .arg(k.plugin_blob_prefix())
            .invoke_async(&mut self.conn())
            .await
            .context("deleting a plugin")?;
        if n == 1 {
            self.plugin_purge(name).await?;
            self.drop_owner_weights(name).await?;
        }
        Ok(n == 1)
    }

    /// Sets one owner's weight among a plugin's owners taking turns in claims (None: back to 1),
    /// on every shard, where claims read it (meta's `ow:<plugin>\0<owner>`).
    pub async fn set_owner_weight(
        &self,
        plugin: &str,
        owner: &str,
        weight: Option<u32>,
    ) -> Result<()> {
        let field = owner_weight_field(plugin, owner);
        let calls = (0..self.shards()).map(|shard| {
            let cmd = match weight {
                Some(w) => {
                    let mut c = redis::cmd("HSET");
                    c.arg(self.keys().shard(shard).meta).arg(&field).arg(w);
                    c
                }
                None => {
                    let mut c = redis::cmd("HDEL");
                    c.arg(self.keys().shard(shard).meta).arg(&field);
                    c
                }
            };
            let mut conn = self.conn();
            async move { cmd.query_async::<i64>(&mut conn).await }
        });
        futures::future::try_join_all(calls)
            .await
            .context("setting an owner's weight")?;
        Ok(())
    }

    /// One owner's weight among a plugin's owners (None: unset, 1).
    pub async fn owner_weight(&self, plugin: &str, owner: &str) -> Result<Option<u32>> {
        redis::cmd("HGET")
            .arg(self.keys().shard(0).meta)
            .arg(owner_weight_field(plugin, owner))
            .query_async(&mut self.conn())
            .await
            .context("reading an owner's weight")
    }

    /// Drops every owner weight of a deleted plugin, so the next owner of the name starts
    /// without them.
    async fn drop_owner_weights(&self, plugin: &str) -> Result<()> {
        let pattern = format!("{}*", owner_weight_field(plugin, ""));
        for shard in 0..self.shards() {
            let meta = self.keys().shard(shard).meta;
            let mut cursor = 0u64;
            loop {
                let (next, fields): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
                    .arg(&meta)
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut self.conn())
                    .await
                    .context("reading a deleted plugin's owner weights")?;
                if !fields.is_empty() {
                    let mut del = redis::cmd("HDEL");
                    del.arg(&meta);
                    for (f, _) in &fields {
                        del.arg(f);
                    }
                    del.query_async::<i64>(&mut self.conn())
                        .await
                        .context("dropping a deleted plugin's owner weights")?;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
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

    /// The binary of `digest` (None: no such blob), read in pieces of [`BLOB_PIECE`], one
    /// command after another. Blobs never change (a digest names its bytes); one deleted while
    /// it is read is None too.
    pub async fn plugin_blob(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        let key = self.keys().plugin_blob(digest);
        let mut conn = self.conn();
        let len: usize = redis::cmd("STRLEN")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .context("reading a plugin binary's size")?;
        if len == 0 {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let end = (out.len() + BLOB_PIECE).min(len) - 1;
            let piece: Vec<u8> = redis::cmd("GETRANGE")
                .arg(&key)
                .arg(out.len())
                .arg(end)
                .query_async(&mut conn)
                .await
                .context("reading a plugin binary")?;
            if piece.len() != end + 1 - out.len() {
                // deleted (or, against every rule, changed) while read
                return Ok(None);
            }
            out.extend_from_slice(&piece);
        }
        if out.len() != len {
            bail!("a plugin binary read as {} bytes, not {len}", out.len());
        }
        Ok(Some(out))
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

    /// Asks to start run `attempt` of task `id` under its plugin's rate limit and its owner's
    /// (`owner`: the owner and the plugin's `owner_rate_limit`), each where there is one: 0 when
    /// it may start now, else the ms until the start reserved for it (see `lua/rate.lua`).
    pub async fn rate_take(
        &self,
        plugin: &str,
        (id, attempt): (&str, u32),
        rate: Option<RateLimit>,
        owner: Option<(&str, RateLimit)>,
    ) -> Result<u64> {
        let mut inv = self.inner.scripts.rate.prepare_invoke();
        inv.arg(format!("{id}\t{attempt}"));
        if let Some(rate) = rate {
            inv.key(self.keys().plugin_rate(plugin))
                .key(self.keys().plugin_rate_queue(plugin))
                .arg(rate.max)
                .arg(rate.per_ms);
        }
        if let Some((owner, rate)) = owner {
            inv.key(self.keys().owner_rate(plugin, owner))
                .key(self.keys().owner_rate_queue(plugin, owner))
                .arg(rate.max)
                .arg(rate.per_ms);
        }
        inv.invoke_async(&mut self.conn())
            .await
            .context("asking the rate limit")
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
            .arg(self.inner.opts.priority_aging_ms)
            .invoke_async(&mut self.conn())
            .await
            .context("giving a concurrency slot back")?;
        Ok(next.as_deref().and_then(SlotWaiter::parse))
    }

    /// Puts a run that found every slot of `of` taken (and was put back, due `due`, of
    /// `priority`) among those waiting for one; true when a slot is free by now (the caller wakes
    /// it itself).
    pub async fn slot_wait(
        &self,
        of: SlotsOf<'_>,
        run: &SlotWaiter,
        max: u32,
        due: i64,
        priority: u8,
    ) -> Result<bool> {
        let free: i64 = self
            .slots_script(of, "wait")
            .arg(run.member())
            .arg(max)
            .arg(super::slots::waiting_score(due, priority))
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

/// The shard meta field of an owner's weight among a plugin's owners.
fn owner_weight_field(plugin: &str, owner: &str) -> String {
    format!("ow:{plugin}\0{owner}")
}
