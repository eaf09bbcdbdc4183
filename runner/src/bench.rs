//! `eggtimer bench`: the workloads of BENCH.md against a private redis-server, one JSON line each.
//!
//! The runner runs in this process with a recording handler in front of the real plugin host: it
//! notes, for every task, when its handler started (µs, this process's clock) and how many times it
//! ran, so lateness (start − due), missing and duplicate tasks are counted exactly. Due times are
//! written by this process too, so both sides use the same clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Args;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::executor::{Handler, Run, TaskHost, now_ms};
use crate::local_redis::LocalRedis;
use crate::metrics::Metrics;
use crate::plugins::{PluginOptions, Plugins, Registry, load_dir};
use crate::runner::{Runner, RunnerOptions};
use crate::store::{Claimed, NewTask, RedisTarget, ScheduleMode, Store, StoreOptions};

/// Flags of `eggtimer bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Directory of the built plugins (noop.wasm, order-cancel.wasm).
    #[arg(long, default_value = "target/plugins")]
    pub plugins_dir: std::path::PathBuf,
    /// Workloads to run, comma-separated (W0..W5).
    #[arg(long, default_value = "W0,W1,W2,W3,W4,W5")]
    pub only: String,
    /// Tasks per workload.
    #[arg(long, default_value_t = 100_000)]
    pub n: usize,
    /// Pending tasks far in the future for W3.
    #[arg(long, default_value_t = 10_000_000)]
    pub pending: usize,
    /// Number of shards.
    #[arg(long, default_value_t = 16)]
    pub shards: u32,
    /// Most tasks one claim takes (the runner's --claim-batch).
    #[arg(long, default_value_t = 256)]
    pub claim_batch: usize,
    /// Most tasks claimed beyond the free workers (the runner's --prefetch).
    #[arg(long, default_value_t = 1024)]
    pub prefetch: usize,
    /// Plugin calls at once (the runner's --workers).
    #[arg(long, default_value_t = 32)]
    pub workers: usize,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Notes when each bench task's handler started, then runs the real plugin.
struct Recorder {
    plugins: Arc<Plugins>,
    starts: Vec<AtomicI64>,
    runs: Vec<AtomicU32>,
}

impl Recorder {
    fn new(plugins: Arc<Plugins>, n: usize) -> Arc<Recorder> {
        Arc::new(Recorder {
            plugins,
            starts: (0..n).map(|_| AtomicI64::new(0)).collect(),
            runs: (0..n).map(|_| AtomicU32::new(0)).collect(),
        })
    }
}

impl Handler for Recorder {
    fn handle(self: Arc<Self>, task: Claimed, host: Arc<dyn TaskHost>) -> BoxFuture<'static, Run> {
        let started = now_us();
        if let Some(i) = task
            .id
            .strip_prefix('b')
            .and_then(|s| s.parse::<usize>().ok())
            && i < self.runs.len()
            && self.runs[i].fetch_add(1, Ordering::Relaxed) == 0
        {
            self.starts[i].store(started, Ordering::Relaxed);
        }
        Arc::clone(&self.plugins).handle(task, host)
    }

    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.plugins.runtime()
    }
}

struct Counts {
    executed: usize,
    missing: usize,
    duplicates: usize,
    early: usize,
    lateness_ms: Vec<f64>,
    first_start_us: i64,
    last_start_us: i64,
}

fn count(rec: &Recorder, dues: &[i64]) -> Counts {
    let mut c = Counts {
        executed: 0,
        missing: 0,
        duplicates: 0,
        early: 0,
        lateness_ms: Vec::with_capacity(dues.len()),
        first_start_us: i64::MAX,
        last_start_us: 0,
    };
    for (i, due) in dues.iter().enumerate() {
        let runs = rec.runs[i].load(Ordering::Relaxed) as usize;
        if runs == 0 {
            c.missing += 1;
            continue;
        }
        c.executed += 1;
        c.duplicates += runs - 1;
        let s = rec.starts[i].load(Ordering::Relaxed);
        c.first_start_us = c.first_start_us.min(s);
        c.last_start_us = c.last_start_us.max(s);
        let late = s as f64 / 1000.0 - *due as f64;
        if late < 0.0 {
            c.early += 1;
        }
        c.lateness_ms.push(late);
    }
    c.lateness_ms.sort_by(|a, b| a.total_cmp(b));
    c
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    (sorted[i] * 100.0).round() / 100.0
}

fn tasks(prefix_from: usize, dues: &[i64], plugin: &str) -> Vec<NewTask> {
    dues.iter()
        .enumerate()
        .map(|(i, d)| NewTask {
            id: format!("b{}", prefix_from + i),
            plugin: plugin.into(),
            payload: "null".into(),
            run_at: *d,
            owner: None,
            max_attempts: 5,
            unique_for_ms: 0,
        })
        .collect()
}

/// Schedules through the store in batches of 1000, a few batches in flight.
async fn schedule_all(store: &Store, tasks: Vec<NewTask>) -> Result<()> {
    use futures::StreamExt;
    let chunks: Vec<Vec<NewTask>> = tasks.chunks(1000).map(|c| c.to_vec()).collect();
    let mut s = futures::stream::iter(chunks.into_iter().map(|c| {
        let store = store.clone();
        async move { store.schedule(&c, ScheduleMode::Upsert).await }
    }))
    .buffer_unordered(8);
    while let Some(r) = s.next().await {
        r?;
    }
    Ok(())
}

struct Bench {
    store: Store,
    plugins: Arc<Plugins>,
    args: BenchArgs,
}

impl Bench {
    async fn flush(&self) -> Result<()> {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut self.store.conn())
            .await?;
        let _: () = redis::cmd("HSET")
            .arg(self.store.keys().meta())
            .arg("shards")
            .arg(self.store.shards())
            .query_async(&mut self.store.conn())
            .await?;
        Ok(())
    }

    fn runner(&self, rec: Arc<Recorder>) -> Runner {
        let mut opts = RunnerOptions::default();
        opts.poller.batch = self.args.claim_batch;
        opts.exec.prefetch = self.args.prefetch;
        opts.exec.workers = self.args.workers;
        Runner::start(self.store.clone(), rec, opts, Arc::new(Metrics::default()))
    }

    /// CPU seconds Redis has used so far.
    async fn redis_cpu(&self) -> Result<f64> {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut self.store.conn())
            .await?;
        let get = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Ok(get("used_cpu_sys:") + get("used_cpu_user:"))
    }

    /// Waits until every task ran once (or `limit`), then stops the runner.
    async fn finish(&self, runner: Runner, rec: &Recorder, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline && rec.runs.iter().any(|r| r.load(Ordering::Relaxed) == 0) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // let stragglers (duplicates) show
        tokio::time::sleep(Duration::from_millis(200)).await;
        runner.shutdown(Duration::from_secs(10)).await;
    }

    async fn w0(&self) -> Result<Value> {
        self.flush().await?;
        let registry = Registry::new(self.store.clone(), Arc::clone(&self.plugins), 16 << 20);
        let state = crate::api::AppState {
            store: self.store.clone(),
            registry,
            metrics: Arc::new(Metrics::default()),
            token: None,
            max_payload_bytes: 64 << 10,
            max_plugin_bytes: 16 << 20,
            max_body_bytes: 32 << 20,
            runners: Arc::new(|| Box::pin(async { Ok(Value::Array(vec![])) })),
            owned_shards: Arc::new(|| 0),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server =
            tokio::spawn(async move { axum::serve(listener, crate::api::router(state)).await });
        let n = self.args.n;
        let far = now_ms() + 86_400_000;
        let bodies: Vec<Vec<u8>> = (0..n)
            .collect::<Vec<_>>()
            .chunks(1000)
            .map(|c| {
                serde_json::to_vec(
                    &c.iter()
                        .map(|i| json!({"plugin": "noop", "id": format!("b{i}"), "run_at": far}))
                        .collect::<Vec<_>>(),
                )
                .expect("json")
            })
            .collect();
        let client = reqwest::Client::new();
        let url = format!("http://{addr}/v1/tasks");
        let t0 = Instant::now();
        use futures::StreamExt;
        let mut s = futures::stream::iter(bodies.into_iter().map(|b| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(b)
                    .send()
                    .await?
                    .error_for_status()
            }
        }))
        .buffer_unordered(4);
        while let Some(r) = s.next().await {
            r.context("POST /v1/tasks")?;
        }
        let secs = t0.elapsed().as_secs_f64();
        server.abort();
        let pending: u64 = self.store.shard_counts().await?.iter().map(|c| c.0).sum();
        Ok(
            json!({"workload": "W0", "n": n, "batch": 1000, "concurrency": 4, "seconds": round(secs), "tasks_per_s": (n as f64 / secs).round(), "stored": pending}),
        )
    }

    /// W1: N tasks due evenly over 10 s, starting after all are scheduled. `extra` names W3.
    async fn w1(&self, name: &str) -> Result<Value> {
        let n = self.args.n;
        let start = now_ms() + 3000 + (n as i64 / 50); // leave time to schedule (~100k/s)
        let dues: Vec<i64> = (0..n)
            .map(|i| start + (i as i64 * 10_000) / n as i64)
            .collect();
        let rec = Recorder::new(Arc::clone(&self.plugins), n);
        let runner = self.runner(Arc::clone(&rec));
        let t0 = Instant::now();
        schedule_all(&self.store, tasks(0, &dues, "noop")).await?;
        let scheduled_at = now_ms();
        if scheduled_at > start {
            bail!(
                "scheduling took {:?}, past the first due time; run with a smaller --n",
                t0.elapsed()
            );
        }
        self.finish(
            runner,
            &rec,
            Duration::from_millis((start - now_ms()).max(0) as u64 + 10_000 + 30_000),
        )
        .await;
        let c = count(&rec, &dues);
        let span = (c.last_start_us - c.first_start_us) as f64 / 1e6;
        Ok(json!({"workload": name, "n": n, "spread_s": 10,
            "lateness_ms": {"p50": pct(&c.lateness_ms, 0.5), "p95": pct(&c.lateness_ms, 0.95), "p99": pct(&c.lateness_ms, 0.99), "max": pct(&c.lateness_ms, 1.0)},
            "processed_per_s": (c.executed as f64 / span.max(1e-9)).round(), "executed": c.executed, "missing": c.missing, "duplicates": c.duplicates, "early": c.early}))
    }

    async fn w2(&self) -> Result<Value> {
        self.flush().await?;
        let n = self.args.n;
        let at = now_ms() + 3000 + (n as i64 / 50);
        let dues = vec![at; n];
        let rec = Recorder::new(Arc::clone(&self.plugins), n);
        let runner = self.runner(Arc::clone(&rec));
        schedule_all(&self.store, tasks(0, &dues, "noop")).await?;
        if now_ms() > at {
            bail!("scheduling took past the due instant; run with a smaller --n");
        }
        let cpu0 = self.redis_cpu().await?;
        self.finish(
            runner,
            &rec,
            Duration::from_millis((at - now_ms()).max(0) as u64 + 60_000),
        )
        .await;
        let redis_cpu_s = self.redis_cpu().await? - cpu0;
        let c = count(&rec, &dues);
        let drain = (c.last_start_us as f64 / 1000.0 - at as f64) / 1000.0;
        Ok(
            json!({"workload": "W2", "n": n, "drain_s": round(drain), "tasks_per_s": (c.executed as f64 / drain.max(1e-9)).round(),
            "lateness_ms": {"p50": pct(&c.lateness_ms, 0.5), "p99": pct(&c.lateness_ms, 0.99), "max": pct(&c.lateness_ms, 1.0)},
            "executed": c.executed, "missing": c.missing, "duplicates": c.duplicates, "early": c.early,
            "redis_cpu_s": round(redis_cpu_s)}),
        )
    }

    async fn used_memory(&self) -> Result<i64> {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut self.store.conn())
            .await?;
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .context("used_memory in INFO")
    }

    async fn w3(&self, w1_alone: Option<&Value>) -> Result<Value> {
        self.flush().await?;
        let m = self.args.pending;
        let before = self.used_memory().await?;
        let far = now_ms() + 365 * 86_400_000;
        let t0 = Instant::now();
        let step = 200_000;
        for from in (0..m).step_by(step) {
            let k = step.min(m - from);
            let dues: Vec<i64> = (0..k).map(|i| far + (from + i) as i64).collect();
            // ids past the W1 range, so the recorder ignores them
            let batch: Vec<NewTask> = tasks(0, &dues, "noop")
                .into_iter()
                .enumerate()
                .map(|(i, mut t)| {
                    t.id = format!("p{}", from + i);
                    t
                })
                .collect();
            schedule_all(&self.store, batch).await?;
        }
        let fill_s = t0.elapsed().as_secs_f64();
        let after = self.used_memory().await?;
        // the split, on shard 0: the due index vs the records
        let k = self.store.keys().shard(0);
        let mut split = serde_json::Map::new();
        let in_shard: u64 = redis::cmd("ZCARD")
            .arg(&k.due)
            .query_async(&mut self.store.conn())
            .await?;
        for (name, key) in [("due_zset", &k.due), ("tasks_hash", &k.tasks)] {
            let bytes: i64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut self.store.conn())
                .await?;
            split.insert(
                format!("{name}_bytes_per_task"),
                json!((bytes as f64 / in_shard.max(1) as f64).round()),
            );
        }
        let per_task = (after - before) as f64 / m as f64;
        let payload = "null".len() as f64;
        let w1 = self.w1("W3-W1").await?;
        let ratio = match (
            w1_alone.and_then(|v| v["lateness_ms"]["p99"].as_f64()),
            w1["lateness_ms"]["p99"].as_f64(),
        ) {
            (Some(a), Some(b)) if a > 0.0 => Some((b / a * 100.0).round() / 100.0),
            _ => None,
        };
        Ok(
            json!({"workload": "W3", "pending": m, "fill_s": round(fill_s), "bytes_per_pending_task": per_task.round(),
            "bytes_beyond_payload": (per_task - payload).round(), "split_on_shard_0": split, "w1_on_top": w1, "p99_ratio_vs_w1_alone": ratio}),
        )
    }

    /// W5: W1 across two runner processes (children of this one), one killed with SIGKILL in
    /// the middle. Counts and lateness come from the `bench-record` plugin's events.
    async fn w5(&self) -> Result<Value> {
        self.flush().await?;
        let n = self.args.n;
        let url = match self.store.target() {
            RedisTarget::Single(u) => u.clone(),
            RedisTarget::Cluster(_) => bail!("W5 runs on a single Redis"),
        };
        let exe = std::env::current_exe()?;
        let spawn = || -> Result<(std::process::Child, String)> {
            let port = crate::local_redis::free_port()?;
            let child = std::process::Command::new(&exe)
                .args([
                    "serve",
                    "--redis",
                    &url,
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                ])
                .arg("--plugins-dir")
                .arg(&self.args.plugins_dir)
                .args(["--lease", "2s", "--shard-lease", "1s", "--log", "warn"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()?;
            Ok((child, format!("http://127.0.0.1:{port}")))
        };
        let mut runners = vec![spawn()?, spawn()?];
        let client = reqwest::Client::new();
        for (_, base) in &runners {
            let deadline = Instant::now() + Duration::from_secs(60);
            while client.get(format!("{base}/healthz")).send().await.is_err() {
                if Instant::now() > deadline {
                    bail!("a W5 runner did not start");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await; // the two split the shards
        let start = now_ms() + 3000 + (n as i64 / 50);
        let dues: Vec<i64> = (0..n)
            .map(|i| start + (i as i64 * 10_000) / n as i64)
            .collect();
        schedule_all(&self.store, tasks(0, &dues, "bench-record")).await?;
        if now_ms() > start {
            bail!("scheduling took past the first due time; run with a smaller --n");
        }
        tokio::time::sleep(Duration::from_millis(
            (start - now_ms()).max(0) as u64 + 5000,
        ))
        .await;
        let (mut victim, _) = runners.remove(0);
        victim.kill()?; // SIGKILL, mid-stream
        let killed_at = now_ms();
        let _ = victim.wait();
        // wait for the rest and for the victim's in-flight tasks (lease 2 s) to run again
        let deadline = Instant::now() + Duration::from_secs(60);
        let key = format!("{{{}}}:events:bench", self.store.keys().ns());
        let mut events: Vec<(String, i64, i64)> = Vec::new();
        while Instant::now() < deadline {
            events = read_bench_stream(&self.store, &key).await?;
            let pending: u64 = self
                .store
                .shard_counts()
                .await?
                .iter()
                .map(|c| c.0 + c.1)
                .sum();
            if pending == 0 && now_ms() > start + 10_000 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for (mut c, _) in runners {
            let _ = c.kill();
            let _ = c.wait();
        }
        let mut runs = vec![0u32; n];
        let mut late = Vec::with_capacity(events.len());
        let mut early = 0;
        let (mut first, mut last) = (i64::MAX, 0);
        for (id, due, started) in &events {
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
        let duplicates: u32 = runs.iter().map(|r| r.saturating_sub(1)).sum();
        Ok(
            json!({"workload": "W5", "n": n, "runners": 2, "killed_at_s": round((killed_at - start) as f64 / 1000.0),
            "lateness_ms": {"p50": pct(&late, 0.5), "p95": pct(&late, 0.95), "p99": pct(&late, 0.99), "max": pct(&late, 1.0)},
            "processed_per_s": (late.len() as f64 / ((last - first) as f64 / 1000.0).max(1e-9)).round(),
            "executed": n - missing, "missing": missing, "duplicates": duplicates, "early": early,
            "note": "lateness in whole ms (the plugin's now()); the killed runner's in-flight tasks wait for their 2 s lease"}),
        )
    }

    async fn w4(&self) -> Result<Value> {
        struct NoKv;
        impl TaskHost for NoKv {
            fn kv_get<'a>(
                &'a self,
                _: &'a str,
                _: &'a str,
            ) -> BoxFuture<'a, Result<Option<String>, String>> {
                Box::pin(std::future::ready(Ok(None)))
            }
        }
        let host: Arc<dyn TaskHost> = Arc::new(NoKv);
        let mut out = serde_json::Map::new();
        for (plugin, payload) in [
            ("noop", "null"),
            ("order-cancel", r#"{"order_id":"o1","user_id":"u1"}"#),
        ] {
            let task = Claimed {
                id: "w4".into(),
                shard: 0,
                token: 1,
                attempt: 1,
                due: 0,
                max_attempts: 5,
                plugin: plugin.into(),
                owner: None,
                payload: payload.into(),
                created: 0,
            };
            // warm: an idle instance is reused, as the executor does
            let mut rounds = Vec::new();
            for _ in 0..5 {
                let iters = 20_000;
                let t = Instant::now();
                for _ in 0..iters {
                    let r = self.plugins.call(&task, Arc::clone(&host)).await;
                    assert!(r.outcome.is_ok(), "{:?}", r.outcome);
                }
                rounds.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
            }
            // cold: a fresh instance per task
            let mut cold = Vec::new();
            for _ in 0..5 {
                let iters = 2000;
                let t = Instant::now();
                for _ in 0..iters {
                    self.plugins.forget_warm();
                    let r = self.plugins.call(&task, Arc::clone(&host)).await;
                    assert!(r.outcome.is_ok(), "{:?}", r.outcome);
                }
                cold.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
            }
            out.insert(plugin.into(), json!({"warm_us_per_task": median(rounds), "fresh_instance_us_per_task": median(cold)}));
        }
        Ok(
            json!({"workload": "W4", "per_task": out, "note": "instantiate (fresh) or reuse (warm) + call + effects collected; no Redis"}),
        )
    }
}

/// (task id, due, start) of every entry of the W5 stream.
async fn read_bench_stream(store: &Store, key: &str) -> Result<Vec<(String, i64, i64)>> {
    let mut out = Vec::new();
    let mut from = "-".to_owned();
    loop {
        let page: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(key)
            .arg(&from)
            .arg("+")
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut store.conn())
            .await?;
        let Some((last_id, _)) = page.last() else {
            break;
        };
        from = format!("({last_id}");
        for (_, fields) in &page {
            let get = |k: &str| {
                fields
                    .iter()
                    .find(|(f, _)| f == k)
                    .map(|(_, v)| v.as_str())
                    .unwrap_or("")
            };
            let data: Value = serde_json::from_str(get("data")).unwrap_or(Value::Null);
            out.push((
                get("task_id").to_owned(),
                data["due"].as_i64().unwrap_or(0),
                data["start"].as_i64().unwrap_or(0),
            ));
        }
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    round(v[v.len() / 2])
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Runs the benchmark and prints one JSON line per workload.
pub fn main(args: BenchArgs) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("eggtimer-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let redis = LocalRedis::start(&dir, "everysec")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async {
        let store = Store::open(
            RedisTarget::Single(redis.url.clone()),
            StoreOptions {
                shards: args.shards,
                ..StoreOptions::default()
            },
        )
        .await?;
        let plugins = Plugins::new(PluginOptions::default())?;
        load_dir(&plugins, &args.plugins_dir)?;
        for p in ["noop", "order-cancel", "bench-record"] {
            if plugins.get(p).is_none() {
                bail!(
                    "{p}.wasm is not in {}: run `cargo xtask plugins` first",
                    args.plugins_dir.display()
                );
            }
        }
        let b = Bench {
            store,
            plugins,
            args: args.clone(),
        };
        let want = |w: &str| {
            args.only
                .split(',')
                .any(|x| x.trim().eq_ignore_ascii_case(w))
        };
        let mut w1_alone = None;
        for w in ["W4", "W0", "W1", "W2", "W3"] {
            if !want(w) {
                continue;
            }
            let v = match w {
                "W0" => b.w0().await?,
                "W1" => {
                    b.flush().await?;
                    let v = b.w1("W1").await?;
                    w1_alone = Some(v.clone());
                    v
                }
                "W2" => b.w2().await?,
                "W3" => b.w3(w1_alone.as_ref()).await?,
                _ => b.w4().await?,
            };
            println!("{v}");
        }
        if want("W5") {
            println!("{}", b.w5().await?);
        }
        Ok(())
    });
    drop(rt);
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
    result
}
