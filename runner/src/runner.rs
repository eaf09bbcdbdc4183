//! The runner: assembles the pollers, the wake-up listener, the scheduler and the executor, and
//! stops them.

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
use crate::store::{STATS_BUCKET_MS, Store};

/// Settings of a runner's task machinery.
#[derive(Clone, Debug)]
pub struct RunnerOptions {
    pub exec: ExecutorOptions,
    pub poller: PollerOptions,
    pub membership: MembershipOptions,
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

/// A running set of pollers and an executor over one store.
pub struct Runner {
    stop: watch::Sender<bool>,
    joins: Vec<JoinHandle<()>>,
    exec: Arc<Executor>,
    membership_task: JoinHandle<()>,
    membership_stop: watch::Sender<bool>,
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
        tokio::spawn(keep_metrics(
            Arc::clone(&metrics),
            store.clone(),
            stop_rx.clone(),
        ));
        let exec = Executor::new(
            store.clone(),
            handler,
            opts.exec.clone(),
            Arc::clone(&metrics),
            stop_rx.clone(),
        );
        let shards = Shards::new(store.shards());
        let member = Membership::new(new_runner_id(), Arc::clone(&shards));
        let (membership_stop, membership_stop_rx) = watch::channel(false);
        let membership_task = tokio::spawn(membership::run(
            store.clone(),
            Arc::clone(&member),
            opts.membership.clone(),
            membership_stop_rx,
        ));
        let mut joins = vec![
            tokio::spawn(poller::listen(
                store.clone(),
                Arc::clone(&shards),
                stop_rx.clone(),
            )),
            tokio::spawn(crate::scheduler::run(
                store.clone(),
                Arc::clone(&shards),
                stop_rx.clone(),
            )),
        ];
        for shard in 0..store.shards() {
            joins.push(tokio::spawn(poller::poll_shard(
                shard,
                store.clone(),
                Arc::clone(&exec),
                Arc::clone(&shards),
                opts.poller.clone(),
                stop_rx.clone(),
            )));
        }
        Runner {
            stop,
            joins,
            exec,
            membership_task,
            membership_stop,
            store,
            metrics,
            membership: member,
        }
    }

    /// Stops claiming, lets running tasks finish within `grace` (tasks claimed but not started
    /// are released back to due), and returns whether everything finished in time. Whatever did
    /// not is recovered by lease expiry: nothing is lost either way.
    pub async fn shutdown(self, grace: Duration) -> bool {
        let _ = self.stop.send(true);
        for j in self.joins {
            let _ = j.await;
        }
        let drained = self.exec.drain(grace).await;
        // only now give the shards back: everything claimed is finished or released
        let _ = self.membership_stop.send(true);
        let _ = self.membership_task.await;
        if drained {
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
        let bucket = crate::clock::now_ms().div_euclid(STATS_BUCKET_MS) * STATS_BUCKET_MS;
        if let Err(e) = store.add_stats(bucket, &fields).await {
            debug!("adding to the dashboard's history failed (those counts are dropped): {e:#}");
        }
    }
}
