//! The Redis servers a run measures: one redis-server, or the masters of a local Redis Cluster
//! (`--cluster N`). Redis CPU is read from each one's `INFO cpu`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use redis::aio::MultiplexedConnection;

pub struct Nodes {
    conns: Vec<MultiplexedConnection>,
    /// Per node, the store's shards whose keys it holds.
    pub shards: Vec<Vec<u32>>,
}

/// A number field of an INFO answer (`field:value` lines).
pub fn info_field(info: &str, field: &str) -> Option<f64> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse::<f64>().ok())
}

impl Nodes {
    /// `urls`: one redis:// URL per node; `shards[i]`: the shards node i holds.
    pub async fn connect(urls: &[String], shards: Vec<Vec<u32>>) -> Result<Nodes> {
        let mut conns = Vec::new();
        for u in urls {
            conns.push(
                redis::Client::open(u.as_str())?
                    .get_multiplexed_async_connection()
                    .await
                    .with_context(|| format!("connecting to {u}"))?,
            );
        }
        Ok(Nodes { conns, shards })
    }

    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Empties every node: FLUSHALL ASYNC (W3's 10M tasks take Redis seconds to free, longer
    /// than a command may take on this connection), then waits until each node has freed them,
    /// so the next workload's memory and CPU figures start clean.
    pub async fn flush_all(&self) -> Result<()> {
        for c in &self.conns {
            let _: () = redis::cmd("FLUSHALL")
                .arg("ASYNC")
                .query_async(&mut c.clone())
                .await?;
        }
        for i in 0..self.conns.len() {
            let freed = until(
                std::time::Duration::from_secs(300),
                std::time::Duration::from_millis(20),
                || async { Ok(self.info(i, "memory", "lazyfree_pending_objects").await? == 0.0) },
            )
            .await?;
            anyhow::ensure!(freed, "node {i} still freeing a flush after 300 s");
        }
        Ok(())
    }

    /// A number field of `INFO <section>` of node `i`.
    pub async fn info(&self, i: usize, section: &str, field: &str) -> Result<f64> {
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query_async(&mut self.conns[i].clone())
            .await?;
        info_field(&info, field).with_context(|| format!("{field} in INFO {section}"))
    }

    /// Forks (AOF rewrites) of all nodes together so far.
    pub async fn forks(&self) -> Result<f64> {
        let mut total = 0.0;
        for i in 0..self.conns.len() {
            total += self.info(i, "stats", "total_forks").await?;
        }
        Ok(total)
    }

    /// Starts Redis's latency monitor afresh on every node: from here on each kind of event
    /// (a slow command or script, an AOF write, a fork, an expire cycle, …) that holds a node's
    /// one thread for `threshold_ms` or longer is recorded.
    pub async fn latency_reset(&self, threshold_ms: u32) -> Result<()> {
        for c in &self.conns {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("latency-monitor-threshold")
                .arg(threshold_ms)
                .query_async(&mut c.clone())
                .await?;
            let _: i64 = redis::cmd("LATENCY")
                .arg("RESET")
                .query_async(&mut c.clone())
                .await?;
        }
        Ok(())
    }

    /// Per kind of event since `latency_reset`, the longest it held a node's thread (ms; the
    /// largest over the nodes). `LATENCY LATEST` answers event, time, latest ms, max ms.
    pub async fn latency_max(&self) -> Result<BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        for c in &self.conns {
            let rows: Vec<(String, i64, i64, i64)> = redis::cmd("LATENCY")
                .arg("LATEST")
                .query_async(&mut c.clone())
                .await
                .context("LATENCY LATEST")?;
            for (event, _, _, max) in rows {
                let m = out.entry(event).or_insert(0.0);
                *m = f64::max(*m, max as f64);
            }
        }
        Ok(out)
    }

    /// CPU seconds each node has used so far (user + sys).
    pub async fn cpu(&self) -> Result<Vec<f64>> {
        let mut out = Vec::new();
        for i in 0..self.conns.len() {
            out.push(
                self.info(i, "cpu", "used_cpu_sys").await?
                    + self.info(i, "cpu", "used_cpu_user").await?,
            );
        }
        Ok(out)
    }

    /// How many times all nodes together have run any of `commands` (INFO commandstats' `calls`).
    pub async fn calls(&self, commands: &[&str]) -> Result<f64> {
        let mut total = 0.0;
        for c in &self.conns {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut c.clone())
                .await?;
            // cmdstat_<command>:calls=N,usec=...; none before its first call
            for command in commands {
                let stat = format!("cmdstat_{command}:calls=");
                total += info
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix(&stat)?
                            .split(',')
                            .next()?
                            .parse::<f64>()
                            .ok()
                    })
                    .unwrap_or(0.0);
            }
        }
        Ok(total)
    }

    /// CPU seconds all nodes together have used so far.
    pub async fn cpu_total(&self) -> Result<f64> {
        Ok(self.cpu().await?.iter().sum())
    }
}

/// Polls `f` every `every` until it is true; false at the deadline.
pub(crate) async fn until<F, Fut>(limit: Duration, every: Duration, mut f: F) -> Result<bool>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f().await? {
            return Ok(true);
        }
        tokio::time::sleep(every).await;
    }
    Ok(false)
}
