//! The runner: assembles the pollers, the wake-up listener and the executor, and stops them.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::executor::{Executor, ExecutorOptions, Handler};
use crate::metrics::Metrics;
use crate::poller::{self, PollerOptions, Wakes};
use crate::store::Store;

/// Settings of a runner's task machinery.
#[derive(Clone, Debug, Default)]
pub struct RunnerOptions {
    pub exec: ExecutorOptions,
    pub poller: PollerOptions,
}

/// A running set of pollers and an executor over one store.
pub struct Runner {
    stop: watch::Sender<bool>,
    joins: Vec<JoinHandle<()>>,
    exec: Arc<Executor>,
    pub store: Store,
    pub metrics: Arc<Metrics>,
}

impl Runner {
    /// Starts polling every shard of `store` and running due tasks through `handler`.
    pub fn start(
        store: Store,
        handler: Arc<dyn Handler>,
        opts: RunnerOptions,
        metrics: Arc<Metrics>,
    ) -> Runner {
        let (stop, stop_rx) = watch::channel(false);
        let exec = Executor::new(
            store.clone(),
            handler,
            opts.exec.clone(),
            Arc::clone(&metrics),
            stop_rx.clone(),
        );
        let wakes = Wakes::new(store.shards());
        let mut joins = vec![tokio::spawn(poller::listen(
            store.clone(),
            Arc::clone(&wakes),
            stop_rx.clone(),
        ))];
        for shard in 0..store.shards() {
            joins.push(tokio::spawn(poller::poll_shard(
                shard,
                store.clone(),
                Arc::clone(&exec),
                Arc::clone(&wakes),
                opts.poller.clone(),
                stop_rx.clone(),
            )));
        }
        Runner {
            stop,
            joins,
            exec,
            store,
            metrics,
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
