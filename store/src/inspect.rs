//! Reads for the API and metrics: one task, an owner's tasks, dead letters, counts per shard.

use anyhow::{Context, Result};
use futures::future::try_join_all;

use super::{Scheduled, ShardCounts, Store, TaskRecord, TaskState, task_key};

impl Store {
    /// The tasks of id `id` of the plugins `plugins` (without their logs), in one read: the
    /// tasks of one id share a shard. A record eggtimer 0.1.0 stored under the bare id is one of
    /// them when its plugin is in `plugins` and that plugin has none under its key. Done tasks
    /// past the retention window are left out.
    pub async fn tasks_of_id(&self, id: &str, plugins: &[String]) -> Result<Vec<TaskRecord>> {
        let mut keys: Vec<String> = plugins.iter().map(|p| task_key(p, id)).collect();
        keys.push(id.to_owned());
        let k = self.keys().shard(self.shard_of(id));
        let (mut raw, far_tier): (Vec<Option<String>>, bool) = redis::pipe()
            .cmd("HMGET")
            .arg(&k.tasks)
            .arg(&keys)
            .cmd("EXISTS")
            .arg(k.far_slots())
            .query_async(&mut self.conn())
            .await
            .context("reading a task's records")?;
        // a key with no record may have a far task (0.1.0's bare ids are never far)
        let missing: Vec<usize> = (0..plugins.len()).filter(|&i| raw[i].is_none()).collect();
        if far_tier && !missing.is_empty() {
            let keyed: Vec<&str> = missing.iter().map(|&i| keys[i].as_str()).collect();
            let far = self.far_records(self.shard_of(id), &keyed).await?;
            for (i, r) in missing.into_iter().zip(far) {
                raw[i] = r;
            }
        }
        let mut found: Vec<TaskRecord> = keys
            .iter()
            .zip(raw)
            .filter_map(|(key, r)| TaskRecord::decode(key, &r?))
            .filter(|r| self.retained(r))
            .collect();
        if let Some(at) = found.iter().position(|r| r.key == id) {
            let bare = &found[at];
            let keyed = |r: &TaskRecord| r.key != id && r.plugin == bare.plugin;
            if !plugins.contains(&bare.plugin) || found.iter().any(keyed) {
                found.remove(at);
            }
        }
        Ok(found)
    }

    /// Reads into each debounced task's `batch` the payloads its window holds in the list beside
    /// its record (one LRANGE each, pipelined; nothing to read for the others).
    pub async fn load_windows(&self, shard: u32, recs: &mut [TaskRecord]) -> Result<()> {
        let want: Vec<usize> = (0..recs.len()).filter(|&i| recs[i].window > 0).collect();
        if want.is_empty() {
            return Ok(());
        }
        let k = self.keys().shard(shard);
        let mut pipe = redis::pipe();
        for &i in &want {
            pipe.cmd("LRANGE")
                .arg(k.window(&recs[i].key))
                .arg(0)
                .arg(-1);
        }
        let lists: Vec<Vec<String>> = pipe
            .query_async(&mut self.conn())
            .await
            .context("reading debounced tasks' payloads")?;
        for (i, list) in want.into_iter().zip(lists) {
            recs[i].batch.extend(list);
        }
        Ok(())
    }

    /// One chunk of the tasks of `plugin` waiting on `shard` (scheduled, parked or dead; not
    /// running), read with HSCAN from `cursor` (0 to start): the tasks and the next cursor (0:
    /// the shard is done). Every task there throughout the walk is seen (one scheduled meanwhile
    /// may be missed, or seen twice). Only the plugin's own records come back (`MATCH` on its
    /// ids' prefix; Redis still walks every record of the page), but on a shard of 0.1.0's data,
    /// whose bare ids carry no plugin.
    pub async fn waiting_chunk(
        &self,
        shard: u32,
        plugin: &str,
        cursor: u64,
    ) -> Result<(Vec<TaskRecord>, u64)> {
        let k = self.keys().shard(shard);
        let legacy: bool = redis::cmd("HEXISTS")
            .arg(&k.meta)
            .arg("legacy")
            .query_async(&mut self.conn())
            .await
            .context("reading a shard's layout")?;
        let mut scan = redis::cmd("HSCAN");
        scan.arg(&k.tasks).arg(cursor);
        if !legacy {
            // a plugin name is [a-z0-9-]: nothing in it is a pattern's
            scan.arg("MATCH").arg(format!("{}*", task_key(plugin, "")));
        }
        let (next, fields): (u64, Vec<(String, String)>) = scan
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut self.conn())
            .await
            .context("reading the waiting tasks")?;
        let tasks = fields
            .iter()
            .filter_map(|(key, rec)| TaskRecord::decode(key, rec))
            .filter(|t| {
                t.plugin == plugin && matches!(t.state, TaskState::Scheduled | TaskState::Dead)
            })
            .collect();
        Ok((tasks, next))
    }

    /// Reads the task stored under `key` in any state, with its log (a done task until its
    /// retention ends: its record may outlive the window until a later finish on its shard
    /// deletes it, but is not shown).
    pub async fn get(&self, key: &str) -> Result<Option<TaskRecord>> {
        let id = key;
        let shard = self.shard_of(id);
        let k = self.keys().shard(shard);
        let (rec, log, far_tier): (Option<String>, Option<String>, bool) = redis::pipe()
            .hget(&k.tasks, id)
            .hget(&k.logs, id)
            .exists(k.far_slots())
            .query_async(&mut self.conn())
            .await
            .context("reading a task")?;
        let rec = match rec {
            None if far_tier => self.far_records(shard, &[id]).await?.pop().flatten(),
            rec => rec,
        };
        let Some(mut r) = rec
            .and_then(|r| TaskRecord::decode(id, &r))
            .filter(|r| self.retained(r))
        else {
            return Ok(None);
        };
        r.log = log
            .as_deref()
            .map(super::record::decode_log)
            .unwrap_or_default();
        self.load_windows(shard, std::slice::from_mut(&mut r))
            .await?;
        Ok(Some(r))
    }

    /// Whether a record is to be shown: anything but a done task past the retention window.
    pub(super) fn retained(&self, r: &TaskRecord) -> bool {
        r.state != TaskState::Done
            || r.finished_at.unwrap_or(0) + self.inner.opts.keep_done_ms as i64
                > self.clock().now_ms()
    }

    /// The stored records of `ids` (None: no live record), in the order of `ids`: one HMGET per
    /// shard, sent concurrently.
    pub(super) async fn read_records(&self, ids: &[&str]) -> Result<Vec<Option<String>>> {
        let calls = self
            .by_shard(ids.iter().copied())
            .into_iter()
            .map(|(shard, ix)| {
                let k = self.keys().shard(shard);
                let mut conn = self.conn();
                let names: Vec<&str> = ix.iter().map(|&i| ids[i]).collect();
                async move {
                    let recs: Vec<Option<String>> = redis::cmd("HMGET")
                        .arg(&k.tasks)
                        .arg(&names)
                        .query_async(&mut conn)
                        .await?;
                    Ok::<_, anyhow::Error>((ix, recs))
                }
            });
        let mut out = vec![None; ids.len()];
        for (ix, recs) in try_join_all(calls).await? {
            for (i, r) in ix.into_iter().zip(recs) {
                out[i] = r;
            }
        }
        Ok(out)
    }

    /// Why each of `ids` would refuse an upsert now: `Running`, `Duplicate` (inside its dedup
    /// window), or None. A read for the checks before a batch over several shards is written.
    /// Per shard, one round trip first asks whether anything there could refuse: a task running
    /// (the claim batches' count) or a dedup window at all.
    /// Only then are the ids' records and windows read, in a second round trip. (A shard where
    /// nothing runs has no running id to find; reading 1,000 records to learn that cost W0 a
    /// tenth of Redis's time, BENCHMARKS.md.)
    pub async fn conflicts_among(&self, ids: &[&str]) -> Result<Vec<Option<Scheduled>>> {
        let now = self.clock().now_ms() as f64;
        let calls = self
            .by_shard(ids.iter().copied())
            .into_iter()
            .map(|(shard, ix)| {
                let names: Vec<&str> = ix.iter().map(|&i| ids[i]).collect();
                let k = self.keys().shard(shard);
                let mut conn = self.conn();
                async move {
                    let (running, windows): (Option<i64>, bool) = redis::pipe()
                        .cmd("HGET")
                        .arg(&k.batches)
                        .arg("running")
                        .cmd("EXISTS")
                        .arg(&k.unique)
                        .query_async(&mut conn)
                        .await?;
                    // (any count but zero, a negative one too, reads the records)
                    let runs = running.unwrap_or(0) != 0;
                    if !runs && !windows {
                        return Ok::<_, anyhow::Error>((ix, vec![None; names.len()]));
                    }
                    let mut pipe = redis::pipe();
                    if runs {
                        pipe.cmd("HMGET").arg(&k.tasks).arg(&names);
                    }
                    if windows {
                        pipe.cmd("ZMSCORE").arg(&k.unique).arg(&names);
                    }
                    let mut replies: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
                    let ends: Vec<Option<f64>> = if windows {
                        redis::from_redis_value(replies.pop().context("no ZMSCORE reply")?)?
                    } else {
                        vec![None; names.len()]
                    };
                    let recs: Vec<Option<String>> = if runs {
                        redis::from_redis_value(replies.pop().context("no HMGET reply")?)?
                    } else {
                        vec![None; names.len()]
                    };
                    let verdicts: Vec<Option<Scheduled>> = recs
                        .iter()
                        .zip(ends)
                        .map(|(r, w)| {
                            if r.as_deref().is_some_and(|r| r.starts_with("r\t")) {
                                Some(Scheduled::Running)
                            } else if w.is_some_and(|w| w > now) {
                                Some(Scheduled::Duplicate)
                            } else {
                                None
                            }
                        })
                        .collect();
                    Ok((ix, verdicts))
                }
            });
        let mut out = vec![None; ids.len()];
        for (ix, verdicts) in try_join_all(calls)
            .await
            .context("checking a batch for running tasks and dedup windows")?
        {
            for (i, v) in ix.into_iter().zip(verdicts) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// A page of the owner's scheduled tasks, soonest first: at most `limit`, after the cursor
    /// (the `(due, id)` of the last task of the previous page). Each shard reads O(limit) entries
    /// of its owner index. The next cursor is None when there is nothing after this page.
    pub async fn owner_tasks(
        &self,
        owner: &str,
        limit: usize,
        after: Option<(i64, String)>,
    ) -> Result<(Vec<TaskRecord>, Option<(i64, String)>)> {
        let lo = match &after {
            Some((due, id)) => format!("({owner}\0{due:015}\0{id}"),
            None => format!("[{owner}\0"),
        };
        let hi = format!("({owner}\u{1}");
        let calls = (0..self.shards()).map(|shard| {
            let k = self.keys().shard(shard);
            let mut conn = self.conn();
            let (lo, hi) = (lo.clone(), hi.clone());
            async move {
                let members: Vec<String> = redis::cmd("ZRANGEBYLEX")
                    .arg(&k.byowner)
                    .arg(lo)
                    .arg(hi)
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit)
                    .query_async(&mut conn)
                    .await?;
                members
                    .iter()
                    .map(|m| {
                        let mut parts = m.splitn(3, '\0').skip(1);
                        let due = parts.next().and_then(|d| d.parse::<i64>().ok());
                        match (due, parts.next()) {
                            (Some(due), Some(id)) => Ok((due, id.to_owned(), shard)),
                            _ => {
                                anyhow::bail!("an owner index entry this runner can't read: {m:?}")
                            }
                        }
                    })
                    .collect::<Result<Vec<_>>>()
            }
        });
        let mut entries: Vec<(i64, String, u32)> = try_join_all(calls)
            .await
            .context("listing an owner's tasks")?
            .concat();
        entries.sort();
        entries.truncate(limit);
        let next = (entries.len() == limit)
            .then(|| entries.last().map(|(d, id, _)| (*d, id.clone())))
            .flatten();
        let ids: Vec<&str> = entries.iter().map(|(_, id, _)| id.as_str()).collect();
        let recs = self
            .read_records(&ids)
            .await
            .context("reading an owner's tasks")?;
        let tasks = ids
            .iter()
            .zip(recs)
            .filter_map(|(id, r)| r.and_then(|r| TaskRecord::decode(id, &r)))
            .filter(|t| t.state == TaskState::Scheduled)
            .collect();
        Ok((tasks, next))
    }

    /// Dead tasks, most recently dead first. The cursor is the `(died_at, id)` of the last one
    /// returned; pass it back for the next page.
    pub async fn dead(
        &self,
        limit: usize,
        cursor: Option<(i64, String)>,
    ) -> Result<(Vec<TaskRecord>, Option<(i64, String)>)> {
        let max = cursor
            .as_ref()
            .map(|(t, _)| t.to_string())
            .unwrap_or_else(|| "+inf".into());
        let calls = (0..self.shards()).map(|shard| {
            let k = self.keys().shard(shard);
            let mut conn = self.conn();
            let max = max.clone();
            let cursor = cursor.clone();
            async move {
                // Enough to page past entries that tie with the cursor's time.
                let rows: Vec<(String, i64)> = redis::cmd("ZRANGE")
                    .arg(&k.dead)
                    .arg(&max)
                    .arg("-inf")
                    .arg("BYSCORE")
                    .arg("REV")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit + 1000)
                    .arg("WITHSCORES")
                    .query_async(&mut conn)
                    .await?;
                let rows: Vec<(String, i64)> = rows
                    .into_iter()
                    .filter(|(id, t)| match &cursor {
                        Some((ct, cid)) => (t, id.as_str()) < (ct, cid.as_str()),
                        None => true,
                    })
                    .take(limit)
                    .collect();
                if rows.is_empty() {
                    return Ok::<_, anyhow::Error>(Vec::new());
                }
                let ids: Vec<&String> = rows.iter().map(|(id, _)| id).collect();
                let recs: Vec<Option<String>> = redis::cmd("HMGET")
                    .arg(&k.tasks)
                    .arg(&ids)
                    .query_async(&mut conn)
                    .await?;
                Ok(rows
                    .iter()
                    .zip(recs)
                    .filter_map(|((id, t), r)| {
                        r.and_then(|r| TaskRecord::decode(id, &r))
                            .map(|rec| (*t, rec))
                    })
                    .collect::<Vec<_>>())
            }
        });
        let mut all: Vec<(i64, TaskRecord)> = try_join_all(calls)
            .await
            .context("listing dead tasks")?
            .concat();
        all.sort_by(|a, b| (b.0, &b.1.id).cmp(&(a.0, &a.1.id)));
        all.truncate(limit);
        let next = if all.len() == limit {
            all.last().map(|(t, r)| (*t, r.id.clone()))
        } else {
            None
        };
        Ok((all.into_iter().map(|(_, r)| r).collect(), next))
    }

    /// Tasks scheduled, due now, in flight and dead, per shard: for metrics.
    pub async fn shard_counts(&self) -> Result<Vec<ShardCounts>> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let calls = (0..self.shards()).map(|shard| {
            let k = self.keys().shard(shard);
            let mut conn = self.conn();
            async move {
                // scheduled: the per-plugin counts (due or parked) less the parked ones of
                // paused plugins, `parked` less `waiting` (O(plugins), not a walk of the buckets)
                let (counts, parked, waiting, batched, dead) = redis::pipe()
                    .cmd("HVALS")
                    .arg(&k.scheduled)
                    .cmd("ZCARD")
                    .arg(&k.parked)
                    .cmd("ZCARD")
                    .arg(&k.waiting)
                    .cmd("HGET")
                    .arg(&k.batches)
                    .arg("running")
                    .cmd("ZCARD")
                    .arg(&k.dead)
                    .query_async::<(Vec<i64>, u64, u64, Option<i64>, u64)>(&mut conn)
                    .await?;
                let due_now = self
                    .count_due(shard, &["-inf".into(), (now + 1).to_string()])
                    .await?[0];
                let counted = counts.iter().sum::<i64>().max(0) as u64;
                Ok::<_, anyhow::Error>(ShardCounts {
                    scheduled: counted.saturating_sub(parked.saturating_sub(waiting)),
                    inflight: batched.unwrap_or(0).max(0) as u64,
                    dead,
                    due_now,
                })
            }
        });
        try_join_all(calls).await.context("counting tasks")
    }

    /// How many tasks of a shard's due buckets fall in each range `[edges[i], edges[i + 1])`
    /// (ms, or `-inf` / `+inf`), walked a bounded number of buckets per script (`due_count.lua`).
    /// The tasks set aside for their plugin's share (due when set aside) count in a first range
    /// that starts at `-inf`.
    pub async fn count_due(&self, shard: u32, edges: &[String]) -> Result<Vec<u64>> {
        let ranges = edges.len().saturating_sub(1);
        let mut total = vec![0u64; ranges];
        if ranges > 0 && edges[0] == "-inf" {
            let waiting: u64 = redis::cmd("ZCARD")
                .arg(self.keys().shard(shard).waiting)
                .query_async(&mut self.conn())
                .await?;
            total[0] = waiting;
        }
        let mut from = String::new();
        loop {
            let mut inv = self.shard_script(&self.inner.scripts.due_count, shard);
            inv.arg(&from).arg(DUE_COUNT_BUCKETS);
            for e in edges {
                inv.arg(e);
            }
            let (counts, next): (Vec<u64>, String) = {
                let mut reply: Vec<redis::Value> = inv.invoke_async(&mut self.conn()).await?;
                let next = reply.pop().context("an empty reply from due_count")?;
                (
                    redis::from_redis_value(redis::Value::Array(reply))?,
                    redis::from_redis_value(next)?,
                )
            };
            for (t, c) in total.iter_mut().zip(counts) {
                *t += c;
            }
            if next.is_empty() {
                return Ok(total);
            }
            from = next;
        }
    }

    /// How many tasks a shard's due buckets hold (a walk of every bucket: for tests and the
    /// benchmark, not metrics).
    pub async fn due_len(&self, shard: u32) -> Result<u64> {
        Ok(self
            .count_due(shard, &["-inf".into(), "+inf".into()])
            .await?[0])
    }
}

/// How many due buckets one `due_count` script looks at (about 64 tasks each).
const DUE_COUNT_BUCKETS: usize = 500;
