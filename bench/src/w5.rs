//! W5: W1 across two `eggtimer` processes (beside this one's binary), one killed with SIGKILL
//! once half the tasks ran; counts and lateness come from the `bench-record` plugin's events.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use eggtimer::clock::system_ms as now_ms;
use serde_json::Value;

use crate::nodes::until;
use crate::report::{self, lateness, round};
use crate::workloads::{Bench, schedule_all, tasks};

impl Bench {
    /// W5: W1 across two `eggtimer` processes (beside this one's binary), one killed with
    /// SIGKILL once half the tasks ran. Counts and lateness come from `bench-record`'s events.
    pub async fn w5(&self) -> Result<report::W5> {
        self.flush().await?;
        let n = self.args.n;
        let exe = std::env::current_exe()?.with_file_name("eggtimer");
        if !exe.is_file() {
            bail!(
                "W5 runs {} (build it: cargo build --release -p eggtimer)",
                exe.display()
            );
        }
        // Only the plugin W5 runs: a runner compiles every plugin of its directory before it
        // answers, and the TypeScript and Python ones take minutes on 2 cores with a cold cache.
        let dir = eggtimer_tests::temp_dir("w5");
        let plugin = self.args.plugins_dir.join("bench-record.wasm");
        std::os::unix::fs::symlink(std::path::absolute(&plugin)?, dir.join("bench-record.wasm"))
            .with_context(|| format!("linking {}", plugin.display()))?;
        let mut runners = vec![self.spawn(&exe, &dir, "r1")?, self.spawn(&exe, &dir, "r2")?];
        let client = reqwest::Client::new();
        for (_, base) in &runners {
            let up = until(
                Duration::from_secs(60),
                Duration::from_millis(50),
                || async { Ok(client.get(format!("{base}/healthz")).send().await.is_ok()) },
            )
            .await?;
            if !up {
                bail!("a W5 runner did not start");
            }
        }
        // the two share the shards before anything is due
        let base = runners[0].1.clone();
        let split = until(
            Duration::from_secs(30),
            Duration::from_millis(50),
            || async {
                let list: Value = client
                    .get(format!("{base}/v1/runners"))
                    .send()
                    .await?
                    .json()
                    .await?;
                let owned: Vec<usize> = list
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|r| r["shards"].as_array().map_or(0, Vec::len))
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(owned.len() == 2
                    && owned.iter().all(|n| *n > 0)
                    && owned.iter().sum::<usize>() == self.store.shards() as usize)
            },
        )
        .await?;
        if !split {
            bail!("the two W5 runners did not share the shards");
        }
        let start = now_ms() + 3000 + (n as i64 / 50);
        let dues: Vec<i64> = (0..n)
            .map(|i| start + (i as i64 * 10_000) / n as i64)
            .collect();
        schedule_all(&self.store, tasks(0, &dues, "bench-record")).await?;
        if now_ms() > start {
            bail!("scheduling took past the first due time; run with a smaller --n");
        }
        let key = self.store.keys().events("bench-record", "bench");
        until(
            Duration::from_secs(60),
            Duration::from_millis(20),
            || async {
                let len: usize = redis::cmd("XLEN")
                    .arg(&key)
                    .query_async(&mut self.redis.clone())
                    .await?;
                Ok(len >= n / 2)
            },
        )
        .await?;
        let (mut victim, _) = runners.remove(0);
        victim.kill()?; // SIGKILL, mid-stream
        let killed_at = now_ms();
        let _ = victim.wait();
        // the rest, and the victim's in-flight tasks once their lease (2 s) expires
        until(
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                let pending: u64 = self
                    .store
                    .shard_counts()
                    .await?
                    .iter()
                    .map(|c| c.scheduled + c.inflight)
                    .sum();
                Ok(pending == 0 && now_ms() > start + 10_000)
            },
        )
        .await?;
        for (mut c, _) in runners {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&dir);
        let events = self.read_bench_stream(&key).await?;
        Ok(w5_report(n, start, killed_at, &events))
    }

    /// An `eggtimer serve` on this bench's Redis with the plugins of `dir` and its data in
    /// `dir/<name>`; (process, base URL).
    fn spawn(&self, exe: &Path, dir: &Path, name: &str) -> Result<(std::process::Child, String)> {
        let port = eggtimer_tests::free_port();
        let child = std::process::Command::new(exe)
            .args(["serve", "--redis", &self.redis_url])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--plugins-dir")
            .arg(dir)
            .arg("--data-dir")
            .arg(dir.join(name))
            .args(["--lease", "2s", "--shard-lease", "1s", "--log", "warn"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        Ok((child, format!("http://127.0.0.1:{port}")))
    }

    /// (task id, due, start) of every entry of the W5 stream.
    async fn read_bench_stream(&self, key: &str) -> Result<Vec<(String, i64, i64)>> {
        let mut out = Vec::new();
        let mut from = "-".to_owned();
        loop {
            let page: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
                .arg(key)
                .arg(&from)
                .arg("+")
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut self.redis.clone())
                .await?;
            let Some((last_id, _)) = page.last() else {
                return Ok(out);
            };
            from = format!("({last_id}");
            for (_, fields) in &page {
                let get = |k: &str| {
                    fields
                        .iter()
                        .find(|(f, _)| f == k)
                        .map_or("", |(_, v)| v.as_str())
                };
                let data: Value = serde_json::from_str(get("data")).unwrap_or(Value::Null);
                out.push((
                    get("task_id").to_owned(),
                    data["due"].as_i64().unwrap_or(0),
                    data["start"].as_i64().unwrap_or(0),
                ));
            }
        }
    }
}

/// W5's figures from the `bench-record` events `(task id, due, start)`.
fn w5_report(n: usize, start: i64, killed_at: i64, events: &[(String, i64, i64)]) -> report::W5 {
    let mut runs = vec![0usize; n];
    let mut late = Vec::with_capacity(events.len());
    let mut early = 0;
    let (mut first, mut last) = (i64::MAX, 0);
    for (id, due, started) in events {
        if let Some(i) = id
            .strip_prefix('b')
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|i| *i < n)
        {
            runs[i] += 1;
            if runs[i] == 1 {
                late.push((started - due) as f64);
                early += usize::from(started < due);
                first = first.min(*started);
                last = last.max(*started);
            }
        }
    }
    late.sort_by(|a, b| a.total_cmp(b));
    let missing = runs.iter().filter(|r| **r == 0).count();
    report::W5 {
        workload: "W5",
        n,
        runners: 2,
        killed_at_s: round((killed_at - start) as f64 / 1000.0),
        lateness_ms: lateness(&late),
        processed_per_s: (late.len() as f64 / ((last - first) as f64 / 1000.0).max(1e-9)).round(),
        outcomes: report::Outcomes {
            executed: n - missing,
            missing,
            duplicates: runs.iter().map(|r| r.saturating_sub(1)).sum(),
            early,
        },
        note: "lateness in whole ms (the plugin's now()); the killed runner's in-flight tasks wait for their 2 s lease",
    }
}
