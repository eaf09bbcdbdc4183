//! Runners and shards: heartbeats in Redis time, shard leases, the pub/sub client, PING.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::{LeaseOp, Store};

/// A live runner, as its heartbeat records it (`GET /v1/runners`).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunnerInfo {
    pub id: String,
    /// Where its API listens.
    pub address: Option<String>,
    /// The shards it polls.
    pub shards: Vec<u32>,
    pub last_seen: i64,
    pub started_at: i64,
    /// How far its clock is ahead of Redis's (ms; negative: behind), as it last measured; its
    /// timing follows Redis's clock whatever this is (absent: a runner of 0.2.0 or before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_ahead_ms: Option<i64>,
}

impl Store {
    /// Records that a runner is alive (its info, JSON, readable for `ttl_ms`) and returns the ids
    /// of the runners heard from within `window_ms`, sorted. Times are Redis time, so runners'
    /// clocks do not matter; the reading of Redis's clock also sets this process's offset to it.
    pub async fn heartbeat(
        &self,
        runner_id: &str,
        info: &str,
        ttl_ms: u64,
        window_ms: u64,
    ) -> Result<Vec<String>> {
        let k = self.keys();
        let sent = self.clock().own_ms();
        let (redis_ms, live): (i64, Vec<String>) = self
            .inner
            .scripts
            .heartbeat
            .key(k.runners())
            .key(k.runner(runner_id))
            .arg(runner_id)
            .arg(info)
            .arg(ttl_ms.max(1))
            .arg(window_ms)
            .invoke_async(&mut self.conn())
            .await
            .context("heartbeat")?;
        // the heartbeat reads Redis's clock anyway: this process's clock follows it
        self.clock()
            .observe_redis(redis_ms, sent, self.clock().own_ms());
        Ok(live)
    }

    /// Removes a runner's heartbeat (graceful shutdown).
    pub async fn forget_runner(&self, runner_id: &str) -> Result<()> {
        let k = self.keys();
        redis::pipe()
            .cmd("DEL")
            .arg(k.runner(runner_id))
            .ignore()
            .cmd("ZREM")
            .arg(k.runners())
            .arg(runner_id)
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .context("removing a heartbeat")
    }

    /// The info (JSON) of every live runner.
    pub async fn runners(&self) -> Result<Vec<String>> {
        let k = self.keys();
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(k.runners())
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn())
            .await
            .context("listing runners")?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = ids.iter().map(|id| k.runner(id)).collect();
        let infos: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut self.conn())
            .await
            .context("listing runners")?;
        Ok(infos.into_iter().flatten().collect())
    }

    /// Acquires, renews or releases a shard lease for `runner_id`; true when it holds (held) it.
    pub async fn shard_lease(
        &self,
        shard: u32,
        op: LeaseOp,
        runner_id: &str,
        ttl_ms: u64,
    ) -> Result<bool> {
        let op = match op {
            LeaseOp::Acquire => "acquire",
            LeaseOp::Renew => "renew",
            LeaseOp::Release => "release",
        };
        let held: i64 = self
            .inner
            .scripts
            .shard_lease
            .key(self.keys().shard_lease(shard))
            .arg(op)
            .arg(runner_id)
            .arg(ttl_ms.max(1))
            .invoke_async(&mut self.conn())
            .await
            .context("shard lease script")?;
        Ok(held == 1)
    }

    /// Whether Redis answers.
    pub async fn ping(&self) -> Result<()> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn())
            .await
            .context("PING")?;
        Ok(())
    }

    /// The shards whose Redis refuses writes because it is out of memory (`maxmemory` reached),
    /// asked of each shard's node with a script that writes nothing but may write: Redis
    /// refuses those whole while it is full.
    pub async fn full_shards(&self) -> Result<Vec<u32>> {
        let asks = (0..self.shards()).map(|shard| async move {
            let r: redis::RedisResult<i64> = self
                .inner
                .scripts
                .writable
                .key(self.keys().shard_lease(shard))
                .invoke_async(&mut self.conn())
                .await;
            match r {
                Ok(_) => Ok(None),
                Err(e) if e.code() == Some("OOM") => Ok(Some(shard)),
                Err(e) => Err(anyhow::Error::new(e).context("asking whether Redis takes writes")),
            }
        });
        let full = futures::future::try_join_all(asks).await?;
        Ok(full.into_iter().flatten().collect())
    }

    /// With `min_replicas_acked` N > 0: waits until N replicas have every write this store's
    /// connection made so far (`WAIT`, up to the timeout). On a cluster the client sends it to
    /// every master (each on the connection that carried this store's writes to it) and answers
    /// the fewest. Returns how many confirmed when that is fewer than N (None: enough, or nothing
    /// asked).
    pub async fn wait_replicas(&self) -> Result<Option<u32>> {
        let want = self.inner.opts.min_replicas_acked;
        if want == 0 {
            return Ok(None);
        }
        let acked: u32 = redis::cmd("WAIT")
            .arg(want)
            .arg(self.inner.opts.replica_ack_timeout_ms.max(1))
            .query_async(&mut self.conn())
            .await
            .context("WAIT for replicas")?;
        Ok((acked < want).then_some(acked))
    }

    /// Redis's clock, ms since the Unix epoch (`TIME`).
    pub async fn redis_time_ms(&self) -> Result<i64> {
        let (s, us): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.conn())
            .await
            .context("reading Redis's clock")?;
        Ok(s * 1000 + us / 1000)
    }

    /// Reads Redis's clock and has this process's clock follow it (`Clock::observe_redis`).
    pub async fn follow_redis_clock(&self) -> Result<()> {
        let sent = self.clock().own_ms();
        let redis_ms = self.redis_time_ms().await?;
        self.clock()
            .observe_redis(redis_ms, sent, self.clock().own_ms());
        Ok(())
    }

    /// A plain client for pub/sub subscriptions (`attempt`: see
    /// [`super::RedisTarget::pubsub_client`]).
    pub(super) async fn pubsub_client(&self, attempt: usize) -> Result<redis::Client> {
        self.target().pubsub_client(attempt).await
    }
}
