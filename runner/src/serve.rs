//! `eggtimer serve`: wires config, Redis (or a private redis-server), the plugin host and
//! registry, the runner and the API together, and shuts them down in order.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::api::{self, Access, AppState, HttpLimits};
use crate::config::ServeArgs;
use crate::executor::ExecutorOptions;
use crate::local_redis::LocalRedis;
use crate::membership::MembershipOptions;
use crate::metrics::Metrics;
use crate::plugins::{Budget, CompileLimits, PluginOptions, Plugins, Registry};
use crate::poller::PollerOptions;
use crate::runner::{Runner, RunnerOptions};
use eggtimer_store::{RedisTarget, Store, StoreOptions};

/// Runs `eggtimer serve` until SIGTERM or ctrl-c.
pub fn main(args: ServeArgs) -> Result<()> {
    if args.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        anyhow::bail!(
            "--token (or EGGTIMER_TOKEN) is empty: give a token, or leave it out to run without auth"
        );
    }
    // The API's address first: a port in use is said before Redis starts and plugins load. It
    // is let go again until the API serves (a client meanwhile is refused at once rather than
    // left waiting in the listen queue); should another program take it in between, serving
    // says so then.
    drop(bind(args.listen)?);
    // The private redis-server is started from the main thread: its parent-death signal is tied
    // to the thread that spawned it.
    let local = match &args.redis {
        Some(_) => None,
        None => {
            let r = LocalRedis::start(&args.data_dir, &args.redis_fsync)?;
            info!(url = %r.shown_url(), dir = %args.data_dir.display(), "started a private redis-server");
            Some(r)
        }
    };
    let url = args
        .redis
        .clone()
        .or_else(|| local.as_ref().map(|l| l.url.clone()))
        .expect("a Redis URL");
    let rts = Runtimes::new(args.engine_threads.into())?;
    let http = rts.http.handle().clone();
    let result = rts.engine.block_on(serve(args, url, local.is_some(), http));
    rts.engine.shutdown_timeout(Duration::from_secs(1));
    rts.http.shutdown_timeout(Duration::from_secs(1));
    drop(local);
    result
}

/// The runner's two async runtimes. The engine's few threads (`--engine-threads`, 1 by default)
/// do the Redis I/O, the shard pollers, lease renewal and recording outcomes; the HTTP API has
/// its own, one per core, so a request's parsing or a large body does not queue on the engine's
/// thread. Plugin calls run on the plugin host's runtime.
///
/// Why one engine thread: with Redis on the same machine, a second engine thread costs more
/// than it brings. Each claim's reply then wakes whichever thread is free and work moves
/// between them, and Redis's own thread has less of the CPU. In W2 (ten alternated runs) one
/// engine thread did 136k tasks/s against 118k with two, the runner spending 5.65 µs of CPU per
/// task against 6.6 (BENCHMARKS.md).
pub struct Runtimes {
    pub engine: tokio::runtime::Runtime,
    pub http: tokio::runtime::Runtime,
}

impl Runtimes {
    pub fn new(engine_threads: usize) -> Result<Runtimes> {
        let engine = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(engine_threads.max(1))
            .thread_name("eggtimer-engine")
            .enable_all()
            .build()
            .context("starting the engine's runtime")?;
        let http = tokio::runtime::Builder::new_multi_thread()
            .thread_name("eggtimer-http")
            .enable_all()
            .build()
            .context("starting the HTTP runtime")?;
        Ok(Runtimes { engine, http })
    }
}

/// Opens the namespace, retrying while Redis is unreachable (until `stop`): the engine's store,
/// and the API's and the plugin registry's, the same namespace on a connection whose I/O runs on
/// the HTTP runtime (so neither a request nor a plugin's megabytes pass through the engine's
/// connection or thread).
async fn open_stores(
    target: RedisTarget,
    opts: StoreOptions,
    http_rt: &tokio::runtime::Handle,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<(Store, Store)>> {
    let mut delay = Duration::from_millis(200);
    loop {
        let opened = match Store::open(target.clone(), opts.clone()).await {
            Ok(s) => {
                let engine = s.clone();
                http_rt
                    .spawn(async move { s.own_connection().await })
                    .await?
                    .map(|api| (engine, api))
            }
            Err(e) => Err(e),
        };
        match opened {
            Ok(stores) => return Ok(Some(stores)),
            // (a refusal, such as another shard count or data of an older build, is final)
            Err(e) if eggtimer_store::is_full(&e) => {
                warn!("Redis is out of memory (maxmemory reached), retrying in {delay:?}: {e:#}")
            }
            Err(e) if !eggtimer_store::is_unreachable(&e) => return Err(e),
            Err(e) => warn!("Redis is not reachable yet, retrying in {delay:?}: {e:#}"),
        }
        tokio::select! { _ = tokio::time::sleep(delay) => {}, _ = stop.changed() => return Ok(None) }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

async fn serve(
    args: ServeArgs,
    url: String,
    private: bool,
    http_rt: tokio::runtime::Handle,
) -> Result<()> {
    let (stop_tx, mut stop) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        info!("shutting down: no new claims; running tasks finish");
        let _ = stop_tx.send(true);
    });
    if let Some(point) = args.failpoint.clone() {
        eggtimer_base::failpoint::arm(point);
    }
    let target = RedisTarget::parse(&url)?;
    let store_opts = StoreOptions {
        namespace: args.namespace.clone(),
        shards: args.shards,
        keep_done_ms: args.keep_done.as_millis().max(1) as u64,
        stream_maxlen: args.events_max_len,
        max_topics: args.max_topics,
        kv_max_keys: args.kv_max_keys,
        kv_max_bytes: args.kv_max_bytes,
        keep_versions: args.keep_versions,
        min_replicas_acked: args.min_replicas_acked,
        replica_ack_timeout_ms: args.replica_ack_timeout.as_millis().max(1) as u64,
        secrets_key: secrets_key(&args, private)?,
        event_retention_ms: args.event_retention.as_millis().max(1) as u64,
        team_task_bytes: args.team_task_bytes as u64,
        emitted_max_bytes: args.emitted_max_bytes as u64,
        team_kv_bytes: args.team_kv_bytes as u64,
        team_emitted_bytes: args.team_emitted_bytes as u64,
        priority_aging_ms: args.priority_aging_ms,
        far_horizon_ms: args.far_horizon.as_millis() as u64,
        clock: eggtimer_base::clock::Clock::skewed(args.test_clock_skew_ms),
    };
    let Some((store, api_store)) = open_stores(target, store_opts, &http_rt, &mut stop).await?
    else {
        return Ok(());
    };
    // this process's clock follows Redis's before anything reads it (membership keeps it so)
    store.follow_redis_clock().await?;
    let plugins = Plugins::new(plugin_options(&args, store.clock())?)?;
    let registry = load_plugins(&args, &api_store, &plugins).await?;
    let metrics = Arc::new(Metrics::new());
    metrics.install();
    let listener = {
        // registered with the HTTP runtime's reactor: its connections are served on that
        // runtime's threads
        let _in_http = http_rt.enter();
        tokio::net::TcpListener::from_std(bind(args.listen)?)
            .context("serving the API's address")?
    };
    let addr = listener.local_addr()?;
    if args.token.is_none() && !addr.ip().is_loopback() {
        warn!(
            "listening on {addr} beyond loopback without --token: anyone who can reach it can schedule tasks and upload code"
        );
    }
    let mut runner = Runner::start(
        store.clone(),
        plugins.clone(),
        runner_options(&args, addr),
        Arc::clone(&metrics),
    );
    let listening = Arc::clone(&registry);
    runner.start_loop("plugin registry", |stop| listening.listen(stop));
    let heads = store.clone();
    runner.start_loop("owner heads", |mut stop| async move {
        tokio::select! {
            r = heads.backfill_owner_heads() => match r {
                Ok(0) => {}
                Ok(n) => info!("owners' heads given to {n} owners' tasks of an earlier build"),
                Err(e) => warn!("giving earlier owned tasks their owners' heads failed (they come in due order): {e:#}"),
            },
            _ = stop.changed() => {}
        }
    });
    let state = app_state(&args, api_store, registry, metrics, &runner);
    info!(
        "eggtimer listening on http://{addr} (namespace {}, {} shards, redis {}{})",
        args.namespace,
        store.shards(),
        eggtimer_store::redact(&url),
        if private { ", private" } else { "" }
    );
    let http = http_rt.spawn(api::serve(
        listener,
        api::router(state),
        http_limits(&args),
        stop.clone(),
    ));
    let _ = stop.wait_for(|s| *s).await;
    // Stop claiming at once, whatever HTTP clients still hold connections; then let both drain.
    let drained = runner.shutdown(args.shutdown_grace).await;
    if !drained {
        warn!(
            "tasks were still running after {:?}; they will run again after their lease",
            args.shutdown_grace
        );
    }
    let _ = http.await;
    info!("stopped");
    Ok(())
}

/// The plugin registry, loaded: `--plugins-dir` seeded into it, every plugin of the namespace
/// compiled or read from the cache, and a word logged for each secret this runner can't open.
async fn load_plugins(
    args: &ServeArgs,
    api_store: &Store,
    plugins: &Arc<Plugins>,
) -> Result<Arc<Registry>> {
    let registry = Registry::new(
        api_store.clone(),
        Arc::clone(plugins),
        args.max_plugin_bytes,
    );
    if let Some(dir) = &args.plugins_dir {
        let seeded = registry.seed_dir(dir).await?;
        info!(dir = %dir.display(), ?seeded, "plugins directory loaded");
    }
    registry.sync_all().await?;
    let names: Vec<String> = api_store
        .plugin_list()
        .await?
        .into_iter()
        .map(|e| e.name)
        .collect();
    for problem in api_store.secrets_check(&names).await? {
        tracing::error!("{problem}");
    }
    Ok(registry)
}

/// The API's connection limits and timeouts.
fn http_limits(args: &ServeArgs) -> HttpLimits {
    HttpLimits {
        max_connections: args.http_max_connections,
        header_timeout: args.http_header_timeout,
        body_timeout: args.http_body_timeout,
        request_timeout: args.http_request_timeout,
        idle_timeout: args.http_idle_timeout,
        ..HttpLimits::default()
    }
}

/// The secrets key: `--secrets-key-file`, else (with the private redis-server) one in the data
/// dir, made on first start; else none (secrets can't be set or read).
fn secrets_key(args: &ServeArgs, private: bool) -> Result<Option<eggtimer_store::SecretsKey>> {
    use eggtimer_store::SecretsKey;
    match (&args.secrets_key_file, private) {
        (Some(path), _) => SecretsKey::read(path).map(Some),
        (None, true) => SecretsKey::read_or_create(&args.data_dir.join("secrets.key")).map(Some),
        (None, false) => Ok(None),
    }
}

fn plugin_options(args: &ServeArgs, clock: &eggtimer_base::clock::Clock) -> Result<PluginOptions> {
    Ok(PluginOptions {
        timeout: args.plugin_timeout,
        check_timeout: args.check_timeout,
        memory: args.plugin_memory,
        cache_dir: Some(
            args.plugin_cache
                .clone()
                .unwrap_or_else(|| args.data_dir.join("plugin-cache")),
        ),
        cache_keep: args.plugin_cache_keep,
        compiler: Some(CompileLimits::this_binary(
            args.plugin_compile_timeout,
            args.plugin_compile_memory as u64,
        )?),
        max_payload_bytes: args.max_payload_bytes,
        default_max_attempts: 5,
        workers: args.workers.max(1),
        warm_instances: args.warm_instances,
        budget: Budget {
            effect_bytes: args.max_effect_bytes,
            follow_ups: args.max_follow_ups,
            cancels: args.max_cancels,
            http_requests: args.max_http_requests,
            ..Budget::default()
        },
        http_ca_file: args.http_ca_file.clone(),
        clock: clock.clone(),
    })
}

fn runner_options(args: &ServeArgs, addr: SocketAddr) -> RunnerOptions {
    RunnerOptions {
        exec: ExecutorOptions {
            workers: args.workers.max(1),
            prefetch: args.prefetch,
            lease_ms: args.lease.as_millis().max(30) as u64,
            retry_base_ms: args.retry_base.as_millis() as u64,
            retry_cap_ms: args.retry_cap.as_millis() as u64,
        },
        poller: PollerOptions {
            batch: args.claim_batch,
            fallback: args.fallback_poll,
            ahead: args.claim_ahead,
        },
        membership: MembershipOptions {
            lease: args.shard_lease,
            address: Some(format!("http://{addr}")),
        },
        keep_dead: Some(args.keep_dead),
    }
}

/// The API's listener (non-blocking, for tokio). A port in use names the flag that moves it.
fn bind(listen: SocketAddr) -> Result<std::net::TcpListener> {
    match std::net::TcpListener::bind(listen) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => anyhow::bail!(
            "{listen} is in use (another eggtimer, or another program, listens there): stop it, or listen elsewhere with --listen {}:{}",
            listen.ip(),
            listen.port().wrapping_add(1).max(1)
        ),
        r => r
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .with_context(|| format!("listening on {listen}")),
    }
}

fn app_state(
    args: &ServeArgs,
    api_store: Store,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    runner: &Runner,
) -> AppState {
    let member = Arc::clone(&runner.membership);
    let runners_store = api_store.clone();
    let mut access = Access::new(api_store.clone(), args.token.clone(), Some(args.listen));
    access.audit_keep_ms = args.audit_retention.as_millis() as i64;
    access.audit_max_len = args.audit_max_len;
    access.metrics_token = args.metrics_token.clone();
    let cursors = Arc::new(api::Cursors::new(api_store.clone()));
    AppState {
        tasks: crate::tasks::Tasks::new(api_store.clone(), Arc::clone(&metrics)),
        store: api_store,
        registry,
        metrics,
        access: Arc::new(access),
        scrape: Default::default(),
        max_payload_bytes: args.max_payload_bytes,
        max_plugin_bytes: args.max_plugin_bytes,
        max_plugin_timeout_ms: args.max_plugin_timeout.as_millis() as u64,
        max_check_timeout_ms: args.max_check_timeout.as_millis() as u64,
        events_max_bytes: args.events_max_bytes as u64,
        max_plugin_memory: args.max_plugin_memory as u64,
        max_body_bytes: (args.max_payload_bytes * 16).max(32 << 20),
        internal_hosts: internal_hosts(args),
        cursors,
        runners: Arc::new(move || {
            let s = runners_store.clone();
            Box::pin(async move {
                let infos = s.runners().await?;
                let infos: Vec<eggtimer_store::RunnerInfo> = infos
                    .iter()
                    .filter_map(|i| serde_json::from_str(i).ok())
                    .collect();
                Ok(serde_json::to_value(infos).expect("serializes"))
            })
        }),
        owned_shards: Arc::new(move || member.owned().len()),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The hosts of this runner's listen address and of its Redis (every node a URL names), which no
/// team may let a plugin call: `redis://h:p`, `redis+sentinel://[pw@]h:p,h:p/master`,
/// `redis+cluster://h:p,h:p`.
fn internal_hosts(args: &ServeArgs) -> Vec<String> {
    let mut hosts = vec![args.listen.ip().to_string()];
    if let Some(url) = &args.redis {
        let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
        let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
        let rest = rest.split(['/', '?']).next().unwrap_or("");
        for node in rest.split(',') {
            let host = match node.rsplit_once(':') {
                Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
                _ => node,
            };
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if !host.is_empty() {
                hosts.push(host.to_ascii_lowercase());
            }
        }
    }
    hosts
}
