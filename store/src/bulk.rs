//! Changes to many tasks at once (pausing a plugin, cancelling an owner's tasks, replaying or
//! dropping dead letters). Each walks every shard in
//! chunks of at most [`BULK_CHUNK`] tasks, one script per chunk, so Redis is never held long;
//! each chunk is atomic, the whole is not (a task changed meanwhile is handled by its own script).

use std::collections::HashMap;

use anyhow::{Context, Result};
use futures::future::try_join_all;

use super::Store;

/// Most tasks one bulk script handles (a chunk holds Redis for about a millisecond).
pub const BULK_CHUNK: usize = 500;

/// A bulk change to dead letters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadAction {
    Retry,
    Drop,
}

impl Store {
    /// Runs a chunked script on every shard (concurrently) until each answers an empty cursor;
    /// returns the sum of the counts.
    /// `args` gives the script's arguments for a shard and cursor.
    async fn chunked<F>(&self, what: &str, script: &redis::Script, args: F) -> Result<u64>
    where
        F: Fn(u32, &str) -> Vec<String> + Sync,
    {
        let args = &args;
        let calls = (0..self.shards()).map(|shard| async move {
            let mut total = 0u64;
            let mut cursor = String::new();
            loop {
                let mut inv = self.shard_script(script, shard);
                for a in args(shard, &cursor) {
                    inv.arg(a);
                }
                let (n, next): (u64, String) = inv.invoke_async(&mut self.conn()).await?;
                total += n;
                if next.is_empty() {
                    return Ok::<_, anyhow::Error>(total);
                }
                cursor = next;
            }
        });
        let counts = try_join_all(calls)
            .await
            .with_context(|| format!("{what} script"))?;
        Ok(counts.iter().sum())
    }

    /// Pauses (`true`) or resumes a plugin on every shard: while paused, claims park its due
    /// tasks instead of starting them; resuming puts the parked ones back, due as they were.
    /// Returns how many parked tasks were put back.
    pub async fn set_paused(&self, plugin: &str, paused: bool) -> Result<u64> {
        // the plugin's setting first, with the epoch of this change: a shard applies it only if
        // no later pause or resume reached it, so the last one asked for is what every shard
        // and the settings say, however the chunks of a long resume interleave with a pause
        let epoch = self
            .set_plugin_setting(plugin, "paused", &serde_json::json!(paused))
            .await?;
        let channel = self.keys().wake_channel();
        self.chunked("pause", &self.inner.scripts.pause, |shard, cursor| {
            vec![
                channel.clone(),
                shard.to_string(),
                if paused { "pause" } else { "resume" }.into(),
                plugin.into(),
                cursor.into(),
                BULK_CHUNK.to_string(),
                epoch.to_string(),
            ]
        })
        .await
    }

    /// Pauses (`true`) or resumes an owner's tasks (of one plugin; all of them when `plugin` is
    /// None) on every shard: while paused, claims park its due tasks instead of starting them;
    /// resuming puts back the parked ones nothing else holds (a paused plugin, another pause of
    /// the owner), due as they were. Resuming without a plugin ends every pause of the owner.
    /// Returns how many parked tasks were put back.
    pub async fn set_owner_paused(
        &self,
        owner: &str,
        plugin: Option<&str>,
        paused: bool,
    ) -> Result<u64> {
        let channel = self.keys().wake_channel();
        let n = self
            .chunked(
                "owner_pause",
                &self.inner.scripts.owner_pause,
                |shard, cursor| {
                    vec![
                        channel.clone(),
                        shard.to_string(),
                        if paused { "pause" } else { "resume" }.into(),
                        owner.into(),
                        plugin.unwrap_or("").into(),
                        cursor.into(),
                        BULK_CHUNK.to_string(),
                    ]
                },
            )
            .await?;
        self.announce_owner_pauses(owner).await?;
        Ok(n)
    }

    /// Copies an owner's pauses, as every shard holds them once its pause or resume ran there,
    /// to the namespace's list the runners read, and tells them: a run of a task claimed before
    /// the pause then does not start (the claims park what they find).
    async fn announce_owner_pauses(&self, owner: &str) -> Result<()> {
        let k = self.keys();
        let list: Option<String> = redis::cmd("HGET")
            .arg(&k.shard(0).meta)
            .arg(format!("op:{owner}"))
            .query_async(&mut self.conn())
            .await
            .context("reading an owner's pauses")?;
        let mut pipe = redis::pipe();
        match list {
            Some(l) => pipe.hset(k.owner_pauses(), owner, l),
            None => pipe.hdel(k.owner_pauses(), owner),
        };
        pipe.publish(k.plugins_channel(), super::keys::OWNER_PAUSES_CHANGED)
            .query_async::<()>(&mut self.conn())
            .await
            .context("announcing an owner's pauses")?;
        self.sync_owner_pauses().await
    }

    /// Reads every owner's pauses (the namespace's list) for the runs to check.
    pub async fn sync_owner_pauses(&self) -> Result<()> {
        let all: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.keys().owner_pauses())
            .query_async(&mut self.conn())
            .await
            .context("reading the owners' pauses")?;
        self.inner.quotas.owner_pauses.set(all);
        Ok(())
    }

    /// The pauses of an owner: the plugins whose tasks of the owner are paused, `None` among
    /// them when all its tasks are (as every shard holds them once a pause has answered).
    pub async fn owner_pauses(&self, owner: &str) -> Result<Vec<Option<String>>> {
        let list: Option<String> = redis::cmd("HGET")
            .arg(&self.keys().shard(0).meta)
            .arg(format!("op:{owner}"))
            .query_async(&mut self.conn())
            .await
            .context("reading an owner's pauses")?;
        Ok(list
            .unwrap_or_default()
            .split('\0')
            .filter(|p| !p.is_empty())
            .map(|p| (p != "*").then(|| p.to_owned()))
            .collect())
    }

    /// Gives the owned tasks a build before the owners' heads wrote (0.2.0) their heads, so
    /// owners take turns over them (`owner_heads.lua`): every shard's owner index walked once,
    /// in chunks, then marked done in the shard. Returns how many heads it lowered.
    pub async fn backfill_owner_heads(&self) -> Result<u64> {
        self.chunked(
            "owner_heads",
            &self.inner.scripts.owner_heads,
            |_, cursor| vec![cursor.into(), BULK_CHUNK.to_string()],
        )
        .await
    }

    /// Cancels every scheduled task of an owner (of one plugin); returns how many.
    pub async fn cancel_owner(&self, owner: &str, plugin: Option<&str>) -> Result<u64> {
        self.bulk("cancel_owner", owner, plugin).await
    }

    /// Replays or drops every dead task (of one plugin); returns how many.
    pub async fn dead_all(&self, action: DeadAction, plugin: Option<&str>) -> Result<u64> {
        let op = match action {
            DeadAction::Retry => "retry_dead",
            DeadAction::Drop => "drop_dead",
        };
        self.bulk(op, "", plugin).await
    }

    /// Deletes every scheduled, dead and done task of a plugin, with their logs, listeners and
    /// dedup windows (running ones finish); returns how many.
    pub async fn cancel_plugin(&self, plugin: &str) -> Result<u64> {
        self.bulk("cancel_plugin", "", Some(plugin)).await
    }

    /// Deletes the dead tasks that died before `before` (ms); returns how many.
    pub async fn expire_dead(&self, before: i64) -> Result<u64> {
        self.bulk("expire_dead", &before.to_string(), None).await
    }

    async fn bulk(&self, op: &str, owner: &str, plugin: Option<&str>) -> Result<u64> {
        let channel = self.keys().wake_channel();
        self.chunked(op, &self.inner.scripts.bulk, |shard, cursor| {
            vec![
                channel.clone(),
                shard.to_string(),
                op.into(),
                owner.into(),
                plugin.unwrap_or("").into(),
                cursor.into(),
                BULK_CHUNK.to_string(),
            ]
        })
        .await
    }
}
