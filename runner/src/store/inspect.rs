//! Reads for the API and metrics: one task, an owner's tasks, dead letters, counts per shard.

use anyhow::{Context, Result};
use futures::future::try_join_all;

use super::{Store, TaskRecord, TaskState};

impl Store {
    /// Reads one task in any state (a done task until its retention ends).
    pub async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        let shard = self.shard_of(id);
        let k = self.keys().shard(shard);
        let (live, done): (Option<String>, Option<String>) = redis::pipe()
            .cmd("HGET")
            .arg(&k.tasks)
            .arg(id)
            .cmd("GET")
            .arg(self.keys().done(shard, id))
            .query_async(&mut self.conn())
            .await
            .context("reading a task")?;
        Ok(live.or(done).and_then(|r| TaskRecord::decode(id, &r)))
    }

    /// The owner's scheduled tasks, soonest first.
    pub async fn owner_tasks(&self, owner: &str) -> Result<Vec<TaskRecord>> {
        let calls = (0..self.shards()).map(|shard| {
            let k = self.keys().shard(shard);
            let mut conn = self.conn();
            let (lo, hi) = (format!("[{owner}\0"), format!("({owner}\u{1}"));
            async move {
                let members: Vec<String> = redis::cmd("ZRANGEBYLEX")
                    .arg(&k.byowner)
                    .arg(lo)
                    .arg(hi)
                    .query_async(&mut conn)
                    .await?;
                let ids: Vec<String> = members
                    .iter()
                    .filter_map(|m| m.rsplit('\0').next())
                    .map(str::to_owned)
                    .collect();
                if ids.is_empty() {
                    return Ok::<_, anyhow::Error>(Vec::new());
                }
                let recs: Vec<Option<String>> = redis::cmd("HMGET")
                    .arg(&k.tasks)
                    .arg(&ids)
                    .query_async(&mut conn)
                    .await?;
                Ok(ids
                    .iter()
                    .zip(recs)
                    .filter_map(|(id, r)| r.and_then(|r| TaskRecord::decode(id, &r)))
                    .filter(|t| t.state == TaskState::Scheduled)
                    .collect())
            }
        });
        let mut all: Vec<TaskRecord> = try_join_all(calls)
            .await
            .context("listing an owner's tasks")?
            .concat();
        all.sort_by(|a, b| (a.run_at, &a.id).cmp(&(b.run_at, &b.id)));
        Ok(all)
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

    /// Tasks scheduled (due), in flight and dead, per shard: for metrics.
    pub async fn shard_counts(&self) -> Result<Vec<(u64, u64, u64)>> {
        let calls = (0..self.shards()).map(|shard| {
            let k = self.keys().shard(shard);
            let mut conn = self.conn();
            async move {
                redis::pipe()
                    .cmd("ZCARD")
                    .arg(&k.due)
                    .cmd("ZCARD")
                    .arg(&k.inflight)
                    .cmd("ZCARD")
                    .arg(&k.dead)
                    .query_async::<(u64, u64, u64)>(&mut conn)
                    .await
            }
        });
        try_join_all(calls).await.context("counting tasks")
    }
}
