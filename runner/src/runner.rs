//! The runner: assembles the pollers, the wake-up listener, the scheduler, the metrics keeper,
//! membership, and the executor with its finisher and lease keeper, and stops them; a server
//! adds its own loops (the plugin registry's listener) through `start_loop`.
//!
//! Every long-lived loop is started the same way (`Loops::start`: a task named for the log, with
//! the runner's stop signal or ending on its own once what it serves is gone) and awaited by
//! name at shutdown, in order: the loops that claim and schedule first, then the executor drains,
//! then membership gives the shards back, then the lease keeper and the finisher end.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::executor::{Executor, ExecutorOptions, Handler};
use crate::membership::{self, Membership, MembershipOptions};
use crate::metrics::Metrics;
use crate::poller::{self, PollerOptions};
use crate::shards::Shards;
use eggtimer_store::{STATS_BUCKET_MS, Store};

/// Settings of a runner's task machinery.
#[derive(Clone, Debug)]
pub struct RunnerOptions {
    pub exec: ExecutorOptions,
    pub poller: PollerOptions,
    pub membership: MembershipOptions,
    /// How long dead tasks are kept (None: for good).
    pub keep_dead: Option<Duration>,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            exec: ExecutorOptions::default(),
            poller: PollerOptions::default(),
            membership: MembershipOptions {
                lease: std::time::Duration::from_secs(5),
                address: None,
            },
            keep_dead: None,
        }
    }
}

/// A runner id: host, pid and a random part.
pub fn new_runner_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "runner".into());
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// Long-lived loops, each a named task, awaited together.
#[derive(Default)]
struct Loops(Vec<(&'static str, JoinHandle<()>)>);

impl Loops {
    fn start(&mut self, name: &'static str, run: impl Future<Output = ()> + Send + 'static) {
        self.0.push((name, tokio::spawn(run)));
    }

    /// Awaits every loop (a loop that panicked is logged by name).
    async fn join(self) {
        for (name, j) in self.0 {
            if let Err(e) = j.await {
                warn!("the {name} loop ended abnormally: {e}");
            }
        }
    }
}

/// A running set of pollers and an executor over one store.
pub struct Runner {
    stop: watch::Sender<bool>,
    /// Stopped first: what claims, schedules and records metrics.
    work: Loops,
    exec: Arc<Executor>,
    /// Stopped once the executor has drained: membership (it gives the shards back).
    membership_stop: watch::Sender<bool>,
    membership_loop: Loops,
    /// End on their own once nothing is held and the executor is gone.
    keepers: Loops,
    pub store: Store,
    pub metrics: Arc<Metrics>,
    pub membership: Arc<Membership>,
}

impl Runner {
    /// Joins the namespace's runners, polls the shards it is given and runs due tasks through
    /// `handler`.
    pub fn start(
        store: Store,
        handler: Arc<dyn Handler>,
        opts: RunnerOptions,
        metrics: Arc<Metrics>,
    ) -> Runner {
        let (stop, stop_rx) = watch::channel(false);
        let mut work = Loops::default();
        work.start(
            "metrics keeper",
            keep_metrics(Arc::clone(&metrics), store.clone(), stop_rx.clone()),
        );
        let (exec, finisher, lease_keeper) = Executor::new(
            store.clone(),
            handler,
            opts.exec.clone(),
            Arc::clone(&metrics),
            stop_rx.clone(),
        );
        let mut keepers = Loops::default();
        keepers.start("finisher", finisher.run());
        keepers.start("lease keeper", lease_keeper.run());
        let shards = Shards::new(store.shards());
        let runner_id = new_runner_id();
        let member = Membership::new(runner_id.clone(), Arc::clone(&shards));
        let (membership_stop, membership_stop_rx) = watch::channel(false);
        let mut membership_loop = Loops::default();
        membership_loop.start(
            "membership",
            membership::run(
                store.clone(),
                Arc::clone(&member),
                opts.membership.clone(),
                membership_stop_rx,
            ),
        );
        work.start(
            "wake-up listener",
            poller::listen(
                store.clone(),
                Arc::clone(&shards),
                Arc::clone(&exec),
                stop_rx.clone(),
            ),
        );
        if let Some(keep) = opts.keep_dead {
            work.start(
                "dead-letter expiry",
                expire_dead(store.clone(), keep, stop_rx.clone()),
            );
        }
        work.start(
            "recurring schedules' driver",
            crate::recurring::driver::run(
                store.clone(),
                crate::tasks::Tasks::new(store.clone(), Arc::clone(&metrics)),
                Arc::clone(&shards),
                stop_rx.clone(),
            ),
        );
        work.start(
            "source reader",
            read_sources(store.clone(), runner_id, stop_rx.clone()),
        );
        work.start(
            "outbox sweeper",
            sweep_outboxes(store.clone(), Arc::clone(&shards), stop_rx.clone()),
        );
        work.start(
            "far tier promoter",
            promote_far(store.clone(), Arc::clone(&shards), stop_rx.clone()),
        );
        for shard in 0..store.shards() {
            work.start(
                "poller",
                poller::poll_shard(
                    shard,
                    store.clone(),
                    Arc::clone(&exec),
                    Arc::clone(&shards),
                    opts.poller.clone(),
                    stop_rx.clone(),
                ),
            );
        }
        Runner {
            stop,
            work,
            exec,
            membership_stop,
            membership_loop,
            keepers,
            store,
            metrics,
            membership: member,
        }
    }

    /// Starts one more long-lived loop beside the runner's own (the plugin registry's listener):
    /// it is given the runner's stop signal, must end soon after it, and is awaited with the
    /// loops that claim and schedule at shutdown.
    pub fn start_loop<F, Fut>(&mut self, name: &'static str, run: F)
    where
        F: FnOnce(watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.work.start(name, run(self.stop.subscribe()));
    }

    /// Stops claiming, lets running tasks finish within `grace` (tasks claimed but not started
    /// are released back to due), and returns whether everything finished in time. Whatever did
    /// not is recovered by lease expiry: nothing is lost either way.
    pub async fn shutdown(self, grace: Duration) -> bool {
        let _ = self.stop.send(true);
        self.work.join().await;
        let drained = self.exec.drain(grace).await;
        // only now give the shards back: everything claimed is finished or released
        let _ = self.membership_stop.send(true);
        self.membership_loop.join().await;
        drop(self.exec);
        if drained {
            // nothing is held: the lease keeper ends at its next tick, the finisher once the
            // executor's last run has let it go (bounded: what they would still do is moot)
            if tokio::time::timeout(Duration::from_secs(10), self.keepers.join())
                .await
                .is_err()
            {
                warn!("the finisher or the lease keeper did not end within 10 s of the drain");
            }
            info!("all claimed tasks finished or were released");
        } else {
            warn!(
                "tasks still running after {grace:?}; their leases will expire and they will run again"
            );
        }
        drained
    }
}

/// Every second adds what this runner did to the namespace's history in Redis (the dashboard's
/// charts), and every few seconds drains the metrics' histogram samples, until `stop`.
async fn keep_metrics(metrics: Arc<Metrics>, store: Store, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut n = 0u64;
    while !*stop.borrow() {
        tokio::select! {
            _ = tick.tick() => {}
            r = stop.changed() => if r.is_err() { return } else { continue },
        }
        n += 1;
        if n.is_multiple_of(5) {
            metrics.upkeep();
        }
        let fields = metrics.take_recent();
        let bucket = store.clock().now_ms().div_euclid(STATS_BUCKET_MS) * STATS_BUCKET_MS;
        if let Err(e) = store.add_stats(bucket, &fields).await {
            debug!("adding to the dashboard's history failed (those counts are dropped): {e:#}");
        }
    }
}

/// Drops dead tasks older than `keep`, every tenth of it (between 1 s and a minute). Every runner
/// does it for every shard: a sweep that finds nothing costs Redis one range read per shard.
/// Delivers what the outboxes of the shards this runner owns have held past their grace (the
/// runner that wrote them died before delivering; a task ended and its listeners are let go),
/// and drops expired events: every half second.
async fn sweep_outboxes(store: Store, shards: Arc<Shards>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.changed() => return,
        }
        for shard in 0..shards.count() {
            if !shards.get(shard).owned() {
                continue;
            }
            match store.sweep_outbox(shard).await {
                Ok(0) => {}
                Ok(n) => {
                    metrics::counter!("eggtimer_outbox_late_total", "shard" => shard.to_string())
                        .increment(n as u64);
                }
                Err(e) => warn!(
                    shard,
                    "delivering the outbox failed (will try again): {e:#}"
                ),
            }
        }
    }
}

/// Compaction calls of a shard each time the promoter looks at it (512 KiB of slots each).
const COMPACT_CALLS: usize = 8;

/// Moves the far tasks of the shards this runner owns into the live tier, half a horizon before
/// they fall due, once a second. A runner without a far tier moves every far task of its shards
/// back (another runner's, or its own before a restart without one) when it comes to own a
/// shard and once a minute after, so it costs an idle Redis next to nothing. Each call moves at
/// most `PROMOTE_CHUNK` tasks and is called again while it moves that many. A runner killed
/// between calls leaves the rest to the next owner of the shard: each call is one script.
/// Then it compacts the far slots scripts wrote to (`Store::compact_far`), at most
/// `COMPACT_CALLS` calls a shard each time.
async fn promote_far(store: Store, shards: Arc<Shards>, mut stop: watch::Receiver<bool>) {
    let every = if store.far_horizon_ms() > 0 {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(60)
    };
    // when each owned shard was last looked at (a shard lost and owned again is looked at anew)
    let mut looked: std::collections::HashMap<u32, std::time::Instant> = Default::default();
    loop {
        let owned = shards.owned();
        looked.retain(|s, _| owned.contains(s));
        for shard in owned {
            if looked.get(&shard).is_some_and(|t| t.elapsed() < every) {
                continue;
            }
            looked.insert(shard, std::time::Instant::now());
            loop {
                match store.promote_far(shard).await {
                    Ok(n) if n >= eggtimer_store::PROMOTE_CHUNK => {
                        eggtimer_base::failpoint::hit("far-promoted");
                        metrics::counter!("eggtimer_far_promoted_total").increment(n as u64);
                    }
                    Ok(n) => {
                        metrics::counter!("eggtimer_far_promoted_total").increment(n as u64);
                        break;
                    }
                    Err(e) => {
                        warn!(
                            shard,
                            "moving far tasks into the live tier failed (will try again): {e:#}"
                        );
                        break;
                    }
                }
            }
            // the slots written to since: each as long as its tasks again
            for _ in 0..COMPACT_CALLS {
                match store.compact_far(shard).await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        warn!(shard, "compacting far slots failed (will try again): {e:#}");
                        break;
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Reads every source's stream into events (as consumer `me` of each source's group): new
/// entries as they come (polled every 50 ms when there are none), and every 5 s the entries
/// another runner read and did not acknowledge (it died); the source list is read again every
/// second.
async fn read_sources(store: Store, me: String, mut stop: watch::Receiver<bool>) {
    let mut sources = Vec::new();
    let mut listed = std::time::Instant::now() - Duration::from_secs(60);
    let mut reclaimed = listed;
    loop {
        if listed.elapsed() >= Duration::from_secs(1) {
            match store.source_list().await {
                Ok(s) => sources = s,
                Err(e) => warn!("reading the sources failed (will try again): {e:#}"),
            }
            listed = std::time::Instant::now();
        }
        let reclaim = reclaimed.elapsed() >= Duration::from_secs(5);
        let mut busy = false;
        for s in &sources {
            match store.source_read(s, &me, 500, reclaim).await {
                Ok(r) => {
                    busy |= r.entries > 0;
                    metrics::counter!("eggtimer_source_entries_total", "source" => s.name.clone())
                        .increment(r.entries);
                    metrics::counter!("eggtimer_events_in_total", "topic" => s.topic.clone())
                        .increment(r.published.stored);
                    metrics::counter!("eggtimer_events_unmatched_total", "topic" => s.topic.clone())
                        .increment(r.published.unmatched);
                    metrics::counter!("eggtimer_events_matched_total", "topic" => s.topic.clone())
                        .increment(r.published.acted);
                    if r.skipped > 0 {
                        warn!(source = %s.name, skipped = r.skipped, "stream entries without the source's key field were acknowledged and published nothing");
                    }
                }
                Err(e) => {
                    warn!(source = %s.name, "reading the source failed (will try again): {e:#}")
                }
            }
            if reclaim && let Ok(Some(lag)) = store.source_lag(s).await {
                metrics::gauge!("eggtimer_source_lag", "source" => s.name.clone()).set(lag as f64);
            }
        }
        if reclaim {
            reclaimed = std::time::Instant::now();
        }
        if *stop.borrow() {
            return;
        }
        if !busy {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

async fn expire_dead(store: Store, keep: Duration, mut stop: watch::Receiver<bool>) {
    let every = (keep / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        let before = store
            .clock()
            .now_ms()
            .saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX));
        match store.expire_dead(before).await {
            Ok(0) => {}
            Ok(n) => info!(dropped = n, "dead tasks older than --keep-dead dropped"),
            Err(e) => warn!("dropping old dead tasks failed (will try again): {e:#}"),
        }
    }
}
