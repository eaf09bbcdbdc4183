//! A run's effects on the namespace slot: kv reads (for the optimistic check), kv writes and
//! events, committed by one script.

use anyhow::{Context, Result, bail};

use super::{Claimed, Committed, KvWrite, NsEffects, Store};

/// How long the marker of an applied commit is kept when no outcome of its task is recorded: a
/// retried commit of the same claim comes within seconds, and a rerun after its runner died within
/// a lease or a few (a day is plenty, unless the task's plugin is paused for longer in between:
/// then the rerun's effects apply).
const MARKER_TTL_MS: u64 = 24 * 3600 * 1000;

/// How long a marker is kept once its task's outcome is recorded (which ends its rerun chain):
/// long enough for a runner stalled between its claim check and its commit to still find it.
pub const MARKER_GRACE_MS: u64 = 10_000;

impl Store {
    /// Commits one run's kv writes and events, provided no kv entry it read has changed since
    /// (else nothing is written: [`Committed::Conflict`]). At most once per claim, or per chain of
    /// claims whose runners died before recording an outcome ([`Claimed::effects_claim`]).
    pub async fn commit_ns_effects(&self, run: &Claimed, fx: &NsEffects) -> Result<Committed> {
        let plugin = run.plugin.as_str();
        // the marker is the task's key's; an event names the task by its id
        let task_id = run.task_id();
        let keys = self.keys();
        let mut inv = self.inner.scripts.effects.prepare_invoke();
        inv.key(keys.effects_marker(&run.id, &run.effects_claim.to_string()));
        // the SET of the plugin's topics and the bytes of its streams, when the run emits: the
        // keys after the others; then the plugin's kv index (three keys), when the run writes kv
        let after = 2 + fx.reads.len() + fx.kv.len() + fx.events.len();
        let topics_ix = match fx.events.is_empty() {
            true => 0,
            false => after,
        };
        let kv_ix = match fx.kv.is_empty() {
            true => 0,
            false => after + 2 * usize::from(topics_ix > 0),
        };
        let o = &self.inner.opts;
        // (the team's bounds are read only for a run that writes kv or events)
        let room = match (fx.kv.is_empty(), fx.events.is_empty()) {
            (true, true) => None,
            _ => Some(self.run_room(plugin).await?),
        };
        let (kv_bytes, emitted_bytes) = room.map_or((o.kv_max_bytes, o.emitted_max_bytes), |r| {
            (r.kv_bytes, r.emitted_bytes)
        });
        inv.arg(MARKER_TTL_MS)
            .arg(o.stream_maxlen)
            .arg(o.max_topics)
            .arg(topics_ix)
            .arg(kv_ix)
            .arg(o.kv_max_keys)
            .arg(kv_bytes)
            .arg(keys.kv(plugin, "").len())
            .arg(emitted_bytes)
            .arg(fx.reads.len());
        let mut ix = 1;
        for r in &fx.reads {
            ix += 1;
            inv.key(keys.kv(plugin, &r.key))
                .arg(ix)
                .arg(r.sha1.as_deref().unwrap_or(""));
        }
        for w in &fx.kv {
            ix += 1;
            match w {
                KvWrite::Set { key, value, ttl_ms } => {
                    inv.key(keys.kv(plugin, key))
                        .arg("set")
                        .arg(ix)
                        .arg(value)
                        .arg(ttl_ms.unwrap_or(0));
                }
                KvWrite::Delete { key } => {
                    inv.key(keys.kv(plugin, key)).arg("del").arg(ix);
                }
            }
        }
        for (topic, data) in &fx.events {
            ix += 1;
            inv.key(keys.events(plugin, topic));
            match &fx.traceparent {
                Some(tp) => inv
                    .arg("emit_tp")
                    .arg(ix)
                    .arg(topic)
                    .arg(task_id)
                    .arg(plugin)
                    .arg(data)
                    .arg(tp),
                None => inv
                    .arg("emit")
                    .arg(ix)
                    .arg(topic)
                    .arg(task_id)
                    .arg(plugin)
                    .arg(data),
            };
        }
        if topics_ix > 0 {
            inv.key(keys.plugin_topics(plugin))
                .key(keys.plugin_emitted(plugin));
        }
        if kv_ix > 0 {
            for k in keys.plugin_kv_index(plugin) {
                inv.key(k);
            }
        }
        let v: i64 = inv
            .invoke_async(&mut self.conn())
            .await
            .context("effects script")?;
        Ok(match v {
            1 => Committed::Applied,
            0 => Committed::AppliedBefore,
            -1 => Committed::Conflict,
            -2 => Committed::TooManyTopics {
                max: self.inner.opts.max_topics,
            },
            -3 => Committed::KvFull {
                max_keys: self.inner.opts.kv_max_keys,
                max_bytes: kv_bytes,
                team: room.and_then(|r| r.team_kv),
            },
            -4 => Committed::EmittedFull {
                max_bytes: emitted_bytes,
                team: room.and_then(|r| r.team_emitted),
            },
            other => bail!("the effects script answered {other}, which this runner does not know"),
        })
    }

    /// Shortens the markers of these (task id, claim) runs to [`MARKER_GRACE_MS`]: their tasks'
    /// outcomes are recorded. One pipeline on the namespace slot.
    pub async fn expire_markers(&self, markers: &[(&str, u64)]) -> Result<()> {
        let mut pipe = redis::pipe();
        for (id, claim) in markers {
            pipe.cmd("PEXPIRE")
                .arg(self.keys().effects_marker(id, &claim.to_string()))
                .arg(MARKER_GRACE_MS)
                .ignore();
        }
        let () = pipe
            .query_async(&mut self.conn())
            .await
            .context("expiring effect markers")?;
        Ok(())
    }

    /// Reads one entry of a plugin's key-value store.
    pub async fn kv_get(&self, plugin: &str, key: &str) -> Result<Option<String>> {
        let v: Option<String> = redis::cmd("GET")
            .arg(self.keys().kv(plugin, key))
            .query_async(&mut self.conn())
            .await
            .context("kv get")?;
        Ok(v)
    }
}
