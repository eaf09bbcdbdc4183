//! `eggtimer-bench`: the workloads of BENCH.md against a private redis-server (append-only,
//! fsync every second), the runner used as a library (W0–W4) and as processes (W5). Prints one
//! JSON line per workload (the types in `report`). `cargo xtask bench` builds and runs it.

/// The runner's allocator (see `runner/src/main.rs`), so the runner measured here is the one
/// that ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod nodes;
mod recorder;
mod report;
mod w10;
mod w11;
mod w12;
mod w13;
mod w4;
mod w5;
mod w6;
mod w8;
mod w9;
mod workloads;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Parser;
use eggtimer::plugins::{PluginOptions, Plugins, load_dir};
use eggtimer::store::{RedisTarget, Store, StoreOptions};
use eggtimer_tests::RedisCluster;
use eggtimer_tests::RedisServer;
use serde::Serialize;

use nodes::Nodes;
use workloads::Bench;

/// Flags of `eggtimer-bench`.
#[derive(Parser, Debug, Clone)]
#[command(name = "eggtimer-bench", about = "The benchmark workloads of BENCH.md")]
pub struct Args {
    /// Directory of the built plugins (noop.wasm, order-cancel.wasm, bench-record.wasm; W4 also
    /// times order-cancel-ts, order-cancel-py and test-flood when they are there).
    #[arg(long, default_value = "target/plugins")]
    pub plugins_dir: PathBuf,
    /// Workloads to run, comma-separated (W0..W13).
    #[arg(long, default_value = "W0,W1,W2,W3,W4,W5,W6,W7,W8,W9,W10,W11,W12,W13")]
    pub only: String,
    /// Tasks per workload.
    #[arg(long, default_value_t = 100_000)]
    pub n: usize,
    /// Pending tasks far in the future for W3.
    #[arg(long, default_value_t = 10_000_000)]
    pub pending: usize,
    /// Far tasks for W12 (a week ahead, in the far tier).
    #[arg(long, default_value_t = 20_000_000)]
    pub far: usize,
    /// Number of shards.
    #[arg(long, default_value_t = 16)]
    pub shards: u32,
    /// Most tasks one claim takes (the runner's --claim-batch).
    #[arg(long, default_value_t = 256)]
    pub claim_batch: usize,
    /// Furthest ahead of their due time tasks are claimed under a steady stream, ms (the
    /// runner's --claim-ahead; 0: only what is due).
    #[arg(long, default_value_t = 60)]
    pub claim_ahead_ms: u64,
    /// Most tasks claimed beyond the free workers (the runner's --prefetch).
    #[arg(long, default_value_t = 1024)]
    pub prefetch: usize,
    /// Plugin calls at once (the runner's --workers).
    #[arg(long, default_value_t = 32)]
    pub workers: usize,
    /// Threads of the runner's engine (the runner's --engine-threads).
    #[arg(long, default_value_t = 1)]
    pub engine_threads: u16,
    /// W8's tasks waiting for the plugin it deploys.
    #[arg(long, default_value_t = 1_000_000)]
    pub w8_waiting: usize,
    /// W9's tasks listening for events (at least 100,000).
    #[arg(long, default_value_t = 1_000_000)]
    pub w9_listening: usize,
    /// Tasks of another plugin (`order-cancel`) each listening for an event, scheduled a day
    /// away before W0, W1 and W2: what this round's features cost the tasks that don't use them.
    #[arg(long, default_value_t = 0)]
    pub neighbours: usize,
    /// The `--neighbours` tasks without `on`: another plugin present, without events.
    #[arg(long)]
    pub neighbours_plain: bool,
    /// Run on a local Redis Cluster of this many masters (no replicas) instead of one
    /// redis-server; W0, W1, W2 and W4 only.
    #[arg(long)]
    pub cluster: Option<usize>,
}

fn print(report: &impl Serialize) -> Result<()> {
    println!("{}", serde_json::to_string(report)?);
    Ok(())
}

/// The Redis the run uses: one redis-server, or a local cluster; held to the end (dropping it
/// stops the servers).
enum Servers {
    Single(RedisServer),
    Cluster(RedisCluster),
}

fn main() -> Result<()> {
    let args = Args::parse();
    let want = |w: &str| {
        args.only
            .split(',')
            .any(|x| x.trim().eq_ignore_ascii_case(w))
    };
    let everysec = ["--appendfsync", "everysec"];
    let servers = match args.cluster {
        None => Servers::Single(RedisServer::start_with(&everysec)),
        Some(m) => {
            if m == 0
                || [
                    "W3", "W5", "W6", "W7", "W8", "W9", "W10", "W11", "W12", "W13",
                ]
                .iter()
                .any(|w| want(w))
            {
                bail!("--cluster N needs N >= 1 and runs W0, W1, W2 and W4 only (pass --only)");
            }
            Servers::Cluster(RedisCluster::start_with(m, 0, &everysec))
        }
    };
    let (target, node_urls) = match &servers {
        Servers::Single(r) => (RedisTarget::Single(r.url()), vec![r.url()]),
        Servers::Cluster(c) => (
            RedisTarget::parse(&c.url())?,
            c.nodes.iter().map(|n| n.url()).collect(),
        ),
    };
    // the runner's own runtimes: the runner on the engine's, W0's API on the HTTP one
    let rts = eggtimer::serve::Runtimes::new(args.engine_threads.into())?;
    let http = rts.http.handle().clone();
    rts.engine.block_on(async {
        let store = Store::open(
            target,
            StoreOptions {
                shards: args.shards,
                ..StoreOptions::default()
            },
        )
        .await?;
        // which node holds which shard
        let mut shards = vec![Vec::new(); node_urls.len()];
        for s in 0..store.shards() {
            let node = match &servers {
                Servers::Single(_) => 0,
                Servers::Cluster(c) => c.master_of(&store.keys().shard(s).tasks),
            };
            shards[node].push(s);
        }
        let nodes = Nodes::connect(&node_urls, shards.clone()).await?;
        let plugins = Plugins::new(PluginOptions::default())?;
        load_dir(&plugins, &args.plugins_dir)?;
        let w6_plugin = want("W6").then_some("test-sleep");
        for p in ["noop", "noop-plain", "order-cancel", "bench-record"]
            .into_iter()
            .chain(w6_plugin)
        {
            if plugins.get(p).is_none() {
                bail!(
                    "{p}.wasm is not in {}: run `cargo xtask plugins` first",
                    args.plugins_dir.display()
                );
            }
        }
        let b = Bench::new(
            store.clone(),
            Arc::clone(&plugins),
            args.clone(),
            nodes,
            &node_urls[0],
            http.clone(),
        )
        .await?;
        if want("W4") {
            print(&b.w4().await?)?;
        }
        let mut w0 = None;
        if want("W0") {
            let r = b.w0("noop").await?;
            print(&r)?;
            w0 = Some(r.tasks_per_s);
            // the same without a payload check: what a check costs per task
            b.flush().await?;
            let plain = b.w0("noop-plain").await?;
            print(&plain)?;
            print(&report::CheckCost::of(&r, &plain))?;
        }
        let mut w1_alone = None;
        if want("W1") {
            b.flush_with_neighbours().await?;
            let w1 = b.w1("W1").await?;
            print(&w1)?;
            w1_alone = Some(w1);
        }
        let (mut w2, mut w2_report) = (None, None);
        if want("W2") {
            let r = b.w2().await?;
            print(&r)?;
            w2 = Some(r.tasks_per_s);
            w2_report = Some(r);
        }
        if want("W8") {
            print(&b.w8().await?)?;
        }
        if want("W9") {
            print(&b.w9().await?)?;
        }
        if want("W10") {
            print(&b.w10(w2_report.as_ref()).await?)?;
        }
        if want("W3") {
            print(&b.w3(w1_alone.as_ref()).await?)?;
        }
        if want("W12") {
            // a store of its own, with the far tier (a runner without one would bring every
            // far task back at once), opened on an empty Redis (it checks the data layout)
            b.flush().await?;
            let far = Store::open(
                store.target().clone(),
                StoreOptions {
                    far_horizon_ms: w12::HORIZON_MS,
                    ..store.options().clone()
                },
            )
            .await?;
            let b12 = Bench::new(
                far,
                Arc::clone(&plugins),
                args.clone(),
                Nodes::connect(&node_urls, shards.clone()).await?,
                &node_urls[0],
                http.clone(),
            )
            .await?;
            print(&b12.w12(w1_alone.as_ref()).await?)?;
        }
        if want("W5") {
            print(&b.w5().await?)?;
        }
        if want("W6") {
            print(&b.w6().await?)?;
        }
        if want("W13") {
            print(&b.w13().await?)?;
        }
        if want("W11") {
            print(&b.w11().await?)?;
        }
        if want("W7") {
            let Servers::Single(master) = &servers else {
                unreachable!("W7 runs on one redis-server")
            };
            print(&w7(master, &store, plugins, &args, http, (w0, w2)).await?)?;
        }
        Ok(())
    })
}

/// W7: W0 and W2 again with a replica of the Redis and `--min-replicas-acked 1`: every API write
/// waits for the replica (`WAIT`); the runner's own writes are replicated, not waited for.
/// `alone`: W0's and W2's tasks/s without the replica, when they ran, for the ratios.
async fn w7(
    master: &RedisServer,
    store: &Store,
    plugins: Arc<Plugins>,
    args: &Args,
    http: tokio::runtime::Handle,
    alone: (Option<f64>, Option<f64>),
) -> Result<report::W7> {
    let port = master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut master.conn())?;
        if info.contains("state=online") {
            break;
        }
        if Instant::now() > deadline {
            bail!("the replica did not sync");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // a fresh namespace, as each workload starts with (W0 or W2 may have left tasks)
    let () = redis::cmd("FLUSHALL").query(&mut master.conn())?;
    let store = Store::open(
        store.target().clone(),
        StoreOptions {
            min_replicas_acked: 1,
            ..store.options().clone()
        },
    )
    .await?;
    let nodes = Nodes::connect(&[master.url()], vec![(0..store.shards()).collect()]).await?;
    let b = Bench::new(store, plugins, args.clone(), nodes, &master.url(), http).await?;
    let w0 = b.w0("noop").await?.tasks_per_s;
    let w2 = b.w2().await?.tasks_per_s;
    drop(replica);
    Ok(report::W7 {
        workload: "W7",
        n: args.n,
        w0_tasks_per_s: w0,
        w2_tasks_per_s: w2,
        w0_ratio: alone.0.map(|a| w0 / a),
        w2_ratio: alone.1.map(|a| w2 / a),
    })
}
