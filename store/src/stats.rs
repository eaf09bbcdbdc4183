//! What the dashboard reads: counts per shard and plugin, when tasks fall due, the latest events,
//! and the namespace's recent history (every runner adds what it did in each 5 s bucket to one
//! hash per bucket, `{ns}:stats:<bucket start>`, kept an hour).

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, Result};
use futures::future::try_join_all;

use super::Store;

/// Most owners' heads [`Store::owner_backlog`] reads per shard.
pub const OWNER_HEADS_READ: usize = 256;

/// The width of one history bucket (ms).
pub const STATS_BUCKET_MS: i64 = 5_000;
/// How long a history bucket is kept (ms).
const STATS_KEEP_MS: i64 = 3_600_000;

/// One history bucket: field → count, summed over every runner (fields: `stats` module of the
/// runner names them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatsBucket {
    pub at: i64,
    pub fields: HashMap<String, i64>,
}

/// A plugin's scheduled, dead and running tasks (all shards).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginCounts {
    pub plugin: String,
    pub scheduled: u64,
    pub dead: u64,
    /// Claimed and not finished (a run that fails goes back to scheduled).
    pub running: u64,
}

/// Scheduled tasks falling due per bucket from `from`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueHistogram {
    pub from: i64,
    pub bucket_ms: i64,
    pub counts: Vec<u64>,
}

/// One stream entry: its id (`<ms>-<seq>`) and its fields.
pub type StreamEntry = (String, Vec<(String, String)>);

impl Store {
    /// Adds one runner's counts to the history bucket starting at `bucket_ms`.
    pub async fn add_stats(&self, bucket_ms: i64, fields: &[(String, i64)]) -> Result<()> {
        if fields.is_empty() {
            return Ok(());
        }
        let key = self.keys().stats(bucket_ms);
        let mut p = redis::pipe();
        for (f, n) in fields {
            p.cmd("HINCRBY").arg(&key).arg(f).arg(*n).ignore();
        }
        p.cmd("PEXPIRE").arg(&key).arg(STATS_KEEP_MS).ignore();
        p.query_async::<()>(&mut self.conn())
            .await
            .context("adding to the history")
    }

    /// The history buckets from `from_ms` to `to_ms`, oldest first (empty ones included).
    pub async fn read_stats(&self, from_ms: i64, to_ms: i64) -> Result<Vec<StatsBucket>> {
        let first = from_ms.div_euclid(STATS_BUCKET_MS) * STATS_BUCKET_MS;
        let ats: Vec<i64> = (0..)
            .map(|i| first + i * STATS_BUCKET_MS)
            .take_while(|at| *at <= to_ms)
            .take(721)
            .collect();
        let mut p = redis::pipe();
        for at in &ats {
            p.cmd("HGETALL").arg(self.keys().stats(*at));
        }
        let rows: Vec<HashMap<String, i64>> = p
            .query_async(&mut self.conn())
            .await
            .context("reading the history")?;
        Ok(ats
            .into_iter()
            .zip(rows)
            .map(|(at, fields)| StatsBucket { at, fields })
            .collect())
    }

    /// Scheduled, dead and running tasks of each of these plugins (all shards).
    pub async fn plugin_counts(&self, plugins: &[String]) -> Result<Vec<PluginCounts>> {
        if plugins.is_empty() {
            return Ok(vec![]); // (an empty pipeline is not a reply)
        }
        let calls = (0..self.shards()).map(|shard| {
            let k = self.keys().shard(shard);
            let mut p = redis::pipe();
            for name in plugins {
                p.cmd("HGET").arg(&k.scheduled).arg(name);
                p.cmd("ZLEXCOUNT")
                    .arg(&k.byplugin)
                    .arg(format!("[{name}\0x\0"))
                    .arg(format!("({name}\0x\x01"));
                p.cmd("HGET").arg(&k.batches).arg(format!("running:{name}"));
            }
            let mut conn = self.conn();
            async move { p.query_async::<Vec<Option<u64>>>(&mut conn).await }
        });
        let per_shard = try_join_all(calls)
            .await
            .context("counting tasks per plugin")?;
        Ok(plugins
            .iter()
            .enumerate()
            .map(|(i, name)| PluginCounts {
                plugin: name.clone(),
                scheduled: per_shard.iter().map(|c| c[3 * i].unwrap_or(0)).sum(),
                dead: per_shard.iter().map(|c| c[3 * i + 1].unwrap_or(0)).sum(),
                running: per_shard.iter().map(|c| c[3 * i + 2].unwrap_or(0)).sum(),
            })
            .collect())
    }

    /// One owner's scheduled, dead and running tasks per plugin (all shards; plugins with none
    /// left out), by plugin name. Each shard is walked a bounded piece per script call
    /// (`owner_stats.lua`): the owner's index for its scheduled tasks (cheap: no record is
    /// read), the claim batches for its running ones, and every dead task of the shard for its
    /// dead ones (a record read each). Each call counts one moment, so a task changing state
    /// during the walk may be counted twice or not at all.
    pub async fn owner_counts(&self, owner: &str) -> Result<Vec<PluginCounts>> {
        /// Index entries one call walks; records one call reads.
        const WALK: usize = 2_000;
        const READ: usize = 200;
        let script = &self.inner.scripts.owner_stats;
        let calls = (0..self.shards()).map(|shard| async move {
            // (state letter, plugin, count) as each call answers them
            let mut counted: Vec<(String, String, u64)> = Vec::new();
            let mut cursor = String::new();
            loop {
                let mut inv = self.shard_script(script, shard);
                inv.arg(owner).arg(&cursor).arg(WALK).arg(READ);
                let reply: Vec<String> = inv.invoke_async(&mut self.conn()).await?;
                let [state, next, pairs @ ..] = &reply[..] else {
                    anyhow::bail!("owner_stats answered {reply:?}");
                };
                for pair in pairs.chunks_exact(2) {
                    let n: u64 = pair[1].parse().context("a count")?;
                    counted.push((state.clone(), pair[0].clone(), n));
                }
                if next.is_empty() {
                    return Ok::<_, anyhow::Error>(counted);
                }
                cursor = next.clone();
            }
        });
        let per_shard = try_join_all(calls)
            .await
            .context("counting an owner's tasks")?;
        let mut all: BTreeMap<String, PluginCounts> = BTreeMap::new();
        for (state, plugin, n) in per_shard.into_iter().flatten() {
            let c = all.entry(plugin).or_insert_with_key(|p| PluginCounts {
                plugin: p.clone(),
                ..PluginCounts::default()
            });
            match state.as_str() {
                "s" => c.scheduled += n,
                "r" => c.running += n,
                _ => c.dead += n,
            }
        }
        Ok(all.into_values().collect())
    }

    /// The owners with tasks due now or earlier and not started, with
    /// how many each has over every shard, most first (ties by name). On each shard the owners
    /// are found from their heads due by now, at most [`OWNER_HEADS_READ`] of them, earliest
    /// first (`owner_backlog.lua`): an owner due later than that many others on every shard is
    /// left out.
    pub async fn owner_backlog(&self) -> Result<Vec<(String, u64)>> {
        let script = &self.inner.scripts.owner_backlog;
        let calls = (0..self.shards()).map(|shard| async move {
            let mut inv = self.shard_script(script, shard);
            inv.arg(OWNER_HEADS_READ);
            inv.invoke_async::<Vec<(String, u64)>>(&mut self.conn())
                .await
        });
        let per_shard = try_join_all(calls)
            .await
            .context("reading the owners' due tasks")?;
        let mut all: HashMap<String, u64> = HashMap::new();
        for (owner, n) in per_shard.into_iter().flatten() {
            *all.entry(owner).or_default() += n;
        }
        let mut all: Vec<(String, u64)> = all.into_iter().collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(all)
    }

    /// How many scheduled tasks fall due in each of `n` buckets of `bucket_ms` from `from`
    /// (overdue ones are in the first).
    pub async fn due_histogram(&self, from: i64, bucket_ms: i64, n: usize) -> Result<DueHistogram> {
        let mut edges = vec!["-inf".to_owned()];
        edges.extend((1..=n as i64).map(|i| (from + i * bucket_ms).to_string()));
        let edges = &edges;
        let calls = (0..self.shards()).map(|shard| self.count_due(shard, edges));
        let per_shard = try_join_all(calls).await.context("counting due times")?;
        let counts = (0..n)
            .map(|i| per_shard.iter().map(|c| c[i]).sum())
            .collect();
        Ok(DueHistogram {
            from,
            bucket_ms,
            counts,
        })
    }

    /// The newest `limit` entries of a topic among these plugins' streams, newest first: (entry
    /// id, fields). 0.1.0's shared stream of the topic is read too, keeping only these plugins'
    /// entries (its newest `limit`, so a page may hold fewer). One pipeline on the namespace slot.
    pub async fn latest_events(
        &self,
        plugins: &[String],
        topic: &str,
        limit: usize,
    ) -> Result<Vec<StreamEntry>> {
        let k = self.keys();
        let mut pipe = redis::pipe();
        for key in plugins
            .iter()
            .map(|p| k.events(p, topic))
            .chain([k.events_0_1(topic)])
        {
            pipe.cmd("XREVRANGE")
                .arg(key)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(limit);
        }
        let mut streams: Vec<Vec<StreamEntry>> = pipe
            .query_async(&mut self.conn())
            .await
            .context("reading events")?;
        let of_0_1 = streams.pop().unwrap_or_default();
        let mut rows: Vec<_> = streams.into_iter().flatten().collect();
        rows.extend(of_0_1.into_iter().filter(|(_, fields)| {
            fields
                .iter()
                .any(|(f, v)| f == "plugin" && plugins.contains(v))
        }));
        // newest first by entry id `<ms>-<seq>`, numerically
        let order = |id: &str| -> (u64, u64) {
            let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
            (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
        };
        rows.sort_by_key(|(id, _)| std::cmp::Reverse(order(id)));
        rows.truncate(limit);
        Ok(rows)
    }
}
