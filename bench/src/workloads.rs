//! The workloads W0–W3: the runner in this process (W1–W3 with the recording handler in front of
//! the real plugin host). W4 is in `w4.rs`, W5 in `w5.rs`, W6 in `w6.rs`. Every wait is on a
//! condition with a deadline.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eggtimer::clock::system_ms as now_ms;
use eggtimer::metrics::Metrics;
use eggtimer::plugins::{Plugins, Registry};
use eggtimer::runner::{Runner, RunnerOptions};
use eggtimer::store::{Finish, Finished, Listener, NewTask, ScheduleMode, Store, Then};
use futures::StreamExt;
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};

use crate::Args;
use crate::nodes::{Nodes, info_field, until};
use crate::recorder::{Recorder, count};
use crate::report::{self, lateness, per_task, round};

/// W1 lists what held Redis's thread this long or longer (ms; see `report::W1::redis_stalls_ms`).
const STALL_MS: u32 = 2;
/// The commands a script runs as: its function (`FCALL`), or its text where a Redis could not
/// load the function (`EVAL`, `EVALSHA`).
const SCRIPT_CALLS: &[&str] = &["fcall", "eval", "evalsha"];

pub struct Bench {
    pub(crate) store: Store,
    pub(crate) plugins: Arc<Plugins>,
    pub(crate) args: Args,
    /// The bench's own connection to the (first) node, for what is not the store's business
    /// (MEMORY USAGE, reading W5's stream).
    pub(crate) redis: MultiplexedConnection,
    pub(crate) redis_url: String,
    /// Every node, for FLUSHALL and INFO.
    pub(crate) nodes: Nodes,
    /// The HTTP runtime W0's API is served on, as `eggtimer serve` serves it.
    pub(crate) http: tokio::runtime::Handle,
}

/// Tasks `b<from + i>` of `plugin` due at `dues[i]`.
pub(crate) fn tasks(from: usize, dues: &[i64], plugin: &str) -> Vec<NewTask> {
    dues.iter()
        .enumerate()
        .map(|(i, d)| NewTask {
            id: format!("b{}", from + i),
            plugin: plugin.into(),
            payload: "null".into(),
            run_at: *d,
            owner: None,
            max_attempts: 5,
            unique_for_ms: 0,
            traceparent: None,
            start_by: None,
            ..Default::default()
        })
        .collect()
}

/// Schedules through the store in batches of 1000, 8 batches in flight.
pub(crate) async fn schedule_all(store: &Store, tasks: Vec<NewTask>) -> Result<()> {
    let chunks: Vec<Vec<NewTask>> = tasks.chunks(1000).map(<[NewTask]>::to_vec).collect();
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

/// CPU seconds (user + system) this process has used so far: the runner inside it, its plugin
/// calls and the recorder (Linux: /proc/self/stat, in ticks of 1/100 s).
fn process_cpu_s() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    // the fields after the command name (which is in parentheses and may hold spaces)
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64> {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .context("utime/stime in /proc/self/stat")
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

impl Bench {
    pub async fn new(
        store: Store,
        plugins: Arc<Plugins>,
        args: Args,
        nodes: Nodes,
        redis_url: &str,
        http: tokio::runtime::Handle,
    ) -> Result<Bench> {
        let redis = redis::Client::open(redis_url)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Bench {
            store,
            plugins,
            args,
            redis,
            redis_url: redis_url.to_owned(),
            nodes,
            http,
        })
    }

    /// Tasks scheduled in every shard.
    pub(crate) async fn scheduled(&self) -> Result<u64> {
        Ok(self
            .store
            .shard_counts()
            .await?
            .iter()
            .map(|c| c.scheduled)
            .sum())
    }

    /// Empties Redis (every node), keeping the namespace's shard count.
    pub async fn flush(&self) -> Result<()> {
        self.nodes.flush_all().await?;
        self.store.check_shards().await
    }

    /// Flushes, then schedules `--neighbours` tasks of another plugin (`order-cancel`), a day
    /// away, each listening for an event of its own key: this round's features present on
    /// another plugin than the benchmarked one, which should cost its tasks nothing.
    pub async fn flush_with_neighbours(&self) -> Result<()> {
        self.flush().await?;
        let m = self.args.neighbours;
        if m == 0 {
            return Ok(());
        }
        let far = now_ms() + 86_400_000;
        let mut all = tasks(0, &vec![far; m], "order-cancel");
        for (i, t) in all.iter_mut().enumerate() {
            t.id = format!("n{i}");
            t.payload = format!(r#"{{"order_id":"o{i}","user_id":"u{i}"}}"#);
            if self.args.neighbours_plain {
                continue;
            }
            t.on = vec![Listener {
                topic: "neighbours".into(),
                key: t.id.clone(),
                then: Then::Cancel,
            }];
        }
        schedule_all(&self.store, all).await
    }

    pub(crate) fn runner(&self, rec: Arc<Recorder>) -> Runner {
        let mut opts = RunnerOptions::default();
        opts.poller.batch = self.args.claim_batch;
        opts.poller.ahead = std::time::Duration::from_millis(self.args.claim_ahead_ms);
        opts.exec.prefetch = self.args.prefetch;
        opts.exec.workers = self.args.workers;
        Runner::start(self.store.clone(), rec, opts, Arc::new(Metrics::default()))
    }

    /// A number field of the (first) node's INFO.
    pub(crate) async fn info(&self, section: &str, field: &str) -> Result<f64> {
        self.nodes.info(0, section, field).await
    }

    /// Waits (up to 600 s) until Redis rewrites no AOF (a fill's writes start one); the
    /// seconds waited.
    pub(crate) async fn aof_quiet(&self) -> Result<f64> {
        let t = Instant::now();
        let quiet = until(
            Duration::from_secs(600),
            Duration::from_millis(100),
            || async {
                let info: String = redis::cmd("INFO")
                    .arg("persistence")
                    .query_async(&mut self.redis.clone())
                    .await?;
                let idle = |f| info_field(&info, f) == Some(0.0);
                Ok(idle("aof_rewrite_in_progress") && idle("aof_rewrite_scheduled"))
            },
        )
        .await?;
        anyhow::ensure!(quiet, "Redis still rewriting its AOF 600 s after the fill");
        Ok(t.elapsed().as_secs_f64())
    }

    /// CPU seconds Redis (every node together) has used so far.
    pub(crate) async fn redis_cpu(&self) -> Result<f64> {
        self.nodes.cpu_total().await
    }

    /// Waits until every task ran (or `limit`), then stops the runner; its graceful stop lets
    /// anything still running (a duplicate too) finish and be counted.
    pub(crate) async fn finish(
        &self,
        runner: Runner,
        rec: &Recorder,
        limit: Duration,
    ) -> Result<()> {
        until(limit, Duration::from_millis(20), || async {
            Ok(rec.all_ran())
        })
        .await?;
        runner.shutdown(Duration::from_secs(10)).await;
        Ok(())
    }

    /// W0: N tasks of `plugin` through `POST /v1/tasks`, batches of 1000, 4 requests in flight
    /// (`noop` checks their payloads, `noop-plain` has no check).
    pub async fn w0(&self, plugin: &'static str) -> Result<report::W0> {
        self.flush_with_neighbours().await?;
        let (addr, server) = self.api().await?;
        let n = self.args.n;
        let far = now_ms() + 86_400_000;
        let bodies: Vec<Vec<u8>> = (0..n)
            .collect::<Vec<_>>()
            .chunks(1000)
            .map(|c| {
                serde_json::to_vec(
                    &c.iter()
                        .map(|i| json!({"plugin": plugin, "id": format!("b{i}"), "run_at": far}))
                        .collect::<Vec<_>>(),
                )
                .expect("json")
            })
            .collect();
        let url = format!("http://{addr}/v1/tasks");
        let cpu0 = self.redis_cpu().await?;
        let t0 = Instant::now();
        // the clients on a thread of their own, as another process would be: not on the
        // runner's engine thread
        let post_all = async move {
            let client = reqwest::Client::new();
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
            anyhow::Ok(())
        };
        tokio::task::spawn_blocking(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(post_all)
        })
        .await??;
        let secs = t0.elapsed().as_secs_f64();
        let cpu = self.redis_cpu().await? - cpu0;
        server.abort();
        let stored = self.scheduled().await? - self.args.neighbours as u64; // W0's own
        Ok(report::W0 {
            workload: "W0",
            plugin,
            n,
            batch: 1000,
            concurrency: 4,
            seconds: round(secs),
            tasks_per_s: (n as f64 / secs).round(),
            stored,
            redis_cpu_us_per_task: per_task(cpu, n),
        })
    }

    /// The API served on the HTTP runtime as `eggtimer serve` serves it (no token), on a port of
    /// its own: its address and the server's task (abort it when done).
    pub(crate) async fn api(
        &self,
    ) -> Result<(
        std::net::SocketAddr,
        tokio::task::JoinHandle<std::io::Result<()>>,
    )> {
        // the API's store on a connection of the HTTP runtime
        let store = self.store.clone();
        let store = self
            .http
            .spawn(async move { store.own_connection().await })
            .await??;
        let registry = Registry::new(store.clone(), Arc::clone(&self.plugins), 16 << 20);
        let cursors = Arc::new(eggtimer::api::Cursors::new(store.clone()));
        let metrics = Arc::new(Metrics::default());
        let state = eggtimer::api::AppState {
            access: Arc::new(eggtimer::api::Access::new(store.clone(), None, None)),
            scrape: Default::default(),
            tasks: eggtimer::tasks::Tasks::new(store.clone(), Arc::clone(&metrics)),
            store,
            registry,
            metrics,
            max_payload_bytes: 64 << 10,
            max_plugin_bytes: 16 << 20,
            max_plugin_timeout_ms: 60_000,
            max_check_timeout_ms: 10_000,
            events_max_bytes: 16 << 20,
            max_plugin_memory: 512 << 20,
            max_body_bytes: 32 << 20,
            internal_hosts: vec![],
            cursors,
            runners: Arc::new(|| Box::pin(async { Ok(Value::Array(vec![])) })),
            owned_shards: Arc::new(|| 0),
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let server = self.http.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            axum::serve(listener, eggtimer::api::router(state)).await
        });
        Ok((addr, server))
    }

    /// W1: N tasks due evenly over 10 s, starting after all are scheduled.
    pub async fn w1(&self, name: &'static str) -> Result<report::W1> {
        self.w1_of(name, "noop").await
    }

    /// W1 with the tasks of `plugin`.
    pub async fn w1_of(&self, name: &'static str, plugin: &str) -> Result<report::W1> {
        let rec = Recorder::new(Arc::clone(&self.plugins), self.args.n);
        self.w1_with(name, plugin, rec).await
    }

    /// W1 with the tasks of `plugin`, run by a runner in front of `rec`.
    pub async fn w1_with(
        &self,
        name: &'static str,
        plugin: &str,
        rec: Arc<Recorder>,
    ) -> Result<report::W1> {
        self.steady(name, plugin, rec, self.args.n, 10).await
    }

    /// `n` tasks of `plugin` due evenly over `spread_s` seconds, starting after all are
    /// scheduled, run by a runner in front of `rec` (W1, and each step of W11).
    pub async fn steady(
        &self,
        name: &'static str,
        plugin: &str,
        rec: Arc<Recorder>,
        n: usize,
        spread_s: u32,
    ) -> Result<report::W1> {
        let spread_ms = i64::from(spread_s) * 1000;
        let start = now_ms() + 3000 + (n as i64 / 50); // leave time to schedule (~100k/s)
        let dues: Vec<i64> = (0..n)
            .map(|i| start + (i as i64 * spread_ms) / n as i64)
            .collect();
        let runner = self.runner(Arc::clone(&rec));
        let forks0 = self.nodes.forks().await?;
        let t0 = Instant::now();
        schedule_all(&self.store, tasks(0, &dues, plugin)).await?;
        if now_ms() > start {
            bail!(
                "scheduling took {:?}, past the first due time; run with a smaller --n",
                t0.elapsed()
            );
        }
        let limit = Duration::from_millis((start - now_ms()).max(0) as u64 + 40_000);
        // the load from here on is the runner's (nothing is due until `start`)
        let (cpu0, own0) = (self.redis_cpu().await?, process_cpu_s()?);
        let calls0 = self.nodes.calls(SCRIPT_CALLS).await?;
        self.nodes.latency_reset(STALL_MS).await?;
        self.finish(runner, &rec, limit).await?;
        let wall = (now_ms() - start).max(1) as f64 / 1000.0;
        let cpu = self.redis_cpu().await? - cpu0;
        let own = process_cpu_s()? - own0;
        let calls = self.nodes.calls(SCRIPT_CALLS).await? - calls0;
        let forks = self.nodes.forks().await? - forks0;
        let c = count(&rec, &dues);
        let span = (c.last_start_us - c.first_start_us) as f64 / 1e6;
        Ok(report::W1 {
            workload: name,
            n,
            spread_s,
            lateness_ms: lateness(&c.lateness_ms),
            processed_per_s: (c.outcomes.executed as f64 / span.max(1e-9)).round(),
            outcomes: c.outcomes,
            redis_cpu_share: round(cpu / wall),
            runner_cpu_share: round(own / wall),
            scripts_per_task: round(calls / n as f64),
            forks,
            redis_stalls_ms: self.nodes.latency_max().await?,
        })
    }

    /// W2: N tasks due at the same instant; then, without a runner, the same tasks scheduled,
    /// claimed and finished by the store alone, one step after another, to split Redis's CPU
    /// between the three.
    pub async fn w2(&self) -> Result<report::W2> {
        self.flush_with_neighbours().await?;
        let n = self.args.n;
        let at = now_ms() + 3000 + (n as i64 / 50);
        let dues = vec![at; n];
        let rec = Recorder::new(Arc::clone(&self.plugins), n);
        let runner = self.runner(Arc::clone(&rec));
        let cpu0 = self.nodes.cpu().await?;
        schedule_all(&self.store, tasks(0, &dues, "noop")).await?;
        let cpu1 = self.nodes.cpu().await?;
        if now_ms() > at {
            bail!("scheduling took past the due instant; run with a smaller --n");
        }
        let limit = Duration::from_millis((at - now_ms()).max(0) as u64 + 60_000);
        let own0 = process_cpu_s()?;
        self.finish(runner, &rec, limit).await?;
        let own = process_cpu_s()? - own0;
        let cpu2 = self.nodes.cpu().await?;
        let c = count(&rec, &dues);
        let drain = (c.last_start_us as f64 / 1000.0 - at as f64) / 1000.0;
        let spent = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| y - x).sum::<f64>();
        // the tasks each node held: `b<i>` lives on shard_of(b<i>)
        let node_of: BTreeMap<u32, usize> = self
            .nodes
            .shards
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.iter().map(move |&sh| (sh, i)))
            .collect();
        let mut on_node = vec![0usize; self.nodes.len()];
        for i in 0..n {
            on_node[node_of[&self.store.shard_of(&format!("b{i}"))]] += 1;
        }
        let nodes = (0..self.nodes.len())
            .map(|i| report::NodeCpu {
                shards: self.nodes.shards[i].len(),
                tasks: on_node[i],
                redis_cpu_s_drain: round(cpu2[i] - cpu1[i]),
                redis_cpu_us_per_task_claim_and_finish: per_task(cpu2[i] - cpu1[i], on_node[i]),
            })
            .collect();
        let split = self.split(n).await?;
        Ok(report::W2 {
            workload: "W2",
            n,
            drain_s: round(drain),
            tasks_per_s: (c.outcomes.executed as f64 / drain.max(1e-9)).round(),
            lateness_ms: lateness(&c.lateness_ms),
            outcomes: c.outcomes,
            redis_cpu_us_per_task_schedule: per_task(spent(&cpu0, &cpu1), n),
            redis_cpu_us_per_task_claim_and_finish: per_task(spent(&cpu1, &cpu2), n),
            runner_cpu_us_per_task: per_task(own, n),
            split_without_runner: split,
            nodes,
        })
    }

    /// `n` tasks already due scheduled through the store, then all claimed a batch at a time,
    /// then all recorded done a batch at a time: Redis CPU per task of each step. No runner,
    /// so the steps never overlap and nothing else runs on Redis.
    async fn split(&self, n: usize) -> Result<report::Split> {
        self.flush().await?;
        let past = vec![now_ms() - 1000; n];
        let cpu0 = self.redis_cpu().await?;
        schedule_all(&self.store, tasks(0, &past, "noop")).await?;
        let cpu1 = self.redis_cpu().await?;
        let batch = self.args.claim_batch;
        let mut claimed = Vec::with_capacity(n);
        for shard in 0..self.store.shards() {
            loop {
                let b = self.store.claim(shard, batch, 600_000).await?;
                if b.tasks.is_empty() {
                    break;
                }
                claimed.extend(b.tasks);
            }
        }
        let cpu2 = self.redis_cpu().await?;
        if claimed.len() != n {
            bail!("the store claimed {} of {n} due tasks", claimed.len());
        }
        let mut by_shard: BTreeMap<u32, Vec<(&str, u64, &Finish)>> = BTreeMap::new();
        for t in &claimed {
            by_shard
                .entry(t.shard)
                .or_default()
                .push((t.id.as_str(), t.token, &Finish::Done));
        }
        for (shard, items) in &by_shard {
            for chunk in items.chunks(batch) {
                let verdicts = self.store.finish(*shard, chunk).await?;
                if let Some(v) = verdicts.iter().find(|v| **v != Finished::Done) {
                    bail!("a claimed task finished as {v:?}, not done");
                }
            }
        }
        let cpu3 = self.redis_cpu().await?;
        Ok(report::Split {
            redis_cpu_us_per_task_schedule: per_task(cpu1 - cpu0, n),
            redis_cpu_us_per_task_claim: per_task(cpu2 - cpu1, n),
            redis_cpu_us_per_task_finish: per_task(cpu3 - cpu2, n),
        })
    }

    /// W3: `--pending` tasks far in the future, then W1 on top of them.
    pub async fn w3(&self, w1_alone: Option<&report::W1>) -> Result<report::W3> {
        self.flush().await?;
        let m = self.args.pending;
        let before = self.info("memory", "used_memory").await?;
        let rewrites0 = self.info("persistence", "aof_rewrites").await?;
        let far = now_ms() + 365 * 86_400_000;
        let t0 = Instant::now();
        let step = 200_000;
        for from in (0..m).step_by(step) {
            let k = step.min(m - from);
            let dues: Vec<i64> = (0..k).map(|i| far + (from + i) as i64).collect();
            // ids outside the W1 range (`p<i>`), so the recorder ignores them
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
        let after = self.info("memory", "used_memory").await?;
        let k = self.store.keys().shard(0);
        let mut c = self.redis.clone();
        let in_shard = self.store.due_len(0).await?;
        // the due buckets (layout 5): the index and every bucket it names, with how many there are
        let names: Vec<String> = redis::cmd("ZRANGE")
            .arg(&k.duex)
            .arg(0)
            .arg(-1)
            .query_async(&mut c)
            .await?;
        let mut p = redis::pipe();
        for n in &names {
            p.cmd("MEMORY")
                .arg("USAGE")
                .arg(k.due_bucket(n))
                .arg("SAMPLES")
                .arg(0);
        }
        let buckets: Vec<Option<i64>> = p.query_async(&mut c).await?;
        let mut split = BTreeMap::new();
        split.insert("due_buckets".to_owned(), names.len() as f64);
        split.insert(
            "due_buckets_bytes_per_task".to_owned(),
            (buckets.iter().flatten().sum::<i64>() as f64 / in_shard.max(1) as f64).round(),
        );
        for (name, key) in [
            ("due_index_zset", &k.duex),
            ("tasks_hash", &k.tasks),
            ("byplugin_zset", &k.byplugin),
            ("scheduled_counts_hash", &k.scheduled),
        ] {
            let bytes: Option<i64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut c)
                .await?;
            split.insert(
                format!("{name}_bytes_per_task"),
                (bytes.unwrap_or(0) as f64 / in_shard.max(1) as f64).round(),
            );
        }
        let per_task = (after - before) / m as f64;
        let rewrites1 = self.info("persistence", "aof_rewrites").await?;
        let waited = self.aof_quiet().await?;
        let w1 = self.w1("W3-W1").await?;
        let ratio = w1_alone
            .map(|a| a.lateness_ms.p99)
            .filter(|a| *a > 0.0)
            .map(|a| round(w1.lateness_ms.p99 / a));
        Ok(report::W3 {
            workload: "W3",
            pending: m,
            fill_s: round(fill_s),
            bytes_per_pending_task: per_task.round(),
            bytes_beyond_payload: (per_task - "null".len() as f64).round(),
            split_on_shard_0: split,
            aof_rewrites_during_fill: rewrites1 - rewrites0,
            waited_for_aof_rewrite_s: round(waited),
            w1_on_top: w1,
            p99_ratio_vs_w1_alone: ratio,
        })
    }
}
