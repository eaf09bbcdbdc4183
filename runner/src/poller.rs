//! The pollers: when to claim. One loop per shard.
//!
//! A poller sleeps until the earliest time it knows of (the shard's next due time or next lease
//! expiry, both returned by the claim script in Redis time), and is woken early through Redis
//! pub/sub when a task is scheduled earlier than that (by any runner, this one included). A bounded
//! fallback poll covers a lost wake-up. While tasks are due it claims back to back, as many as the
//! executor has room for.
//!
//! Architecture invariant: the wait is computed from Redis time differences (due − Redis now), so
//! a runner whose clock is off neither fires early nor late.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::executor::Executor;
use crate::membership::Membership;
use crate::store::Store;

/// Settings of the pollers.
#[derive(Clone, Debug)]
pub struct PollerOptions {
    /// Most tasks one claim takes.
    pub batch: usize,
    /// Lease of a claimed task (ms): after it a task whose runner died is run again.
    pub lease_ms: u64,
    /// Longest sleep without a claim, in case a wake-up was lost.
    pub fallback: Duration,
}

impl Default for PollerOptions {
    fn default() -> Self {
        PollerOptions {
            batch: 256,
            lease_ms: 30_000,
            fallback: Duration::from_secs(2),
        }
    }
}

/// The wake-up state of one shard, shared between its poller and the pub/sub listener.
pub struct ShardWake {
    notify: Notify,
    /// The Redis time (ms) the poller plans to wake at; i64::MAX while it works.
    planned: AtomicI64,
}

impl ShardWake {
    fn new() -> Self {
        ShardWake {
            notify: Notify::new(),
            planned: AtomicI64::new(i64::MAX),
        }
    }

    /// Wakes the poller now.
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// Wakes the poller if `due` is earlier than its planned wake-up.
    pub fn offer(&self, due: i64) {
        if due < self.planned.load(Ordering::Acquire) {
            self.notify.notify_one();
        }
    }
}

/// Wake-up handles of all shards.
pub struct Wakes(Vec<ShardWake>);

impl Wakes {
    pub fn new(shards: u32) -> Arc<Self> {
        Arc::new(Wakes((0..shards).map(|_| ShardWake::new()).collect()))
    }

    pub fn shard(&self, shard: u32) -> &ShardWake {
        &self.0[shard as usize]
    }

    /// Handles a wake message `<shard>:<due>`.
    pub fn on_message(&self, msg: &str) {
        let Some((s, d)) = msg.split_once(':') else {
            return;
        };
        if let (Ok(s), Ok(d)) = (s.parse::<usize>(), d.parse::<i64>())
            && let Some(w) = self.0.get(s)
        {
            w.offer(d);
        }
    }

    /// Wakes every poller (after a reconnect, when messages may have been missed).
    pub fn all(&self) {
        for w in &self.0 {
            w.wake();
        }
    }
}

/// Listens for wake messages on Redis pub/sub until `stop`, reconnecting with backoff.
pub async fn listen(store: Store, wakes: Arc<Wakes>, mut stop: watch::Receiver<bool>) {
    let channel = store.keys().wake_channel();
    let mut delay = Duration::from_millis(100);
    let mut attempt = 0usize;
    loop {
        let sub = async {
            let client = store.pubsub_client(attempt)?;
            let mut ps = client.get_async_pubsub().await?;
            ps.subscribe(&channel).await?;
            Ok::<_, anyhow::Error>(ps)
        };
        match tokio::select! { r = sub => r, _ = stop.changed() => return } {
            Ok(mut ps) => {
                delay = Duration::from_millis(100);
                wakes.all(); // anything published while we were away
                let mut msgs = ps.on_message();
                loop {
                    tokio::select! {
                        m = msgs.next() => match m {
                            Some(m) => {
                                if let Ok(text) = m.get_payload::<String>() {
                                    wakes.on_message(&text);
                                }
                            }
                            None => break,
                        },
                        _ = stop.changed() => return,
                    }
                }
                attempt += 1;
                warn!("the wake-up subscription dropped; resubscribing");
            }
            Err(e) => {
                attempt += 1;
                warn!("subscribing to wake-ups failed, retrying in {delay:?}: {e:#}")
            }
        }
        tokio::select! { _ = tokio::time::sleep(delay) => {}, _ = stop.changed() => return }
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// Polls one shard until `stop`.
pub async fn poll_shard(
    shard: u32,
    store: Store,
    exec: Arc<Executor>,
    wakes: Arc<Wakes>,
    member: Arc<Membership>,
    opts: PollerOptions,
    mut stop: watch::Receiver<bool>,
) {
    let wake = wakes.shard(shard);
    let mut error_delay = Duration::from_millis(50);
    loop {
        if *stop.borrow() {
            return;
        }
        if !member.owns(shard) {
            // another runner polls this shard; membership wakes us when it becomes ours
            wake.planned.store(i64::MIN, Ordering::Release);
            tokio::select! {
                _ = wake.notify.notified() => continue,
                _ = stop.changed() => return,
            }
        }
        wake.planned.store(i64::MAX, Ordering::Release);
        // Room in the executor: wait for at least one free slot.
        let permits = tokio::select! {
            p = exec.inflight.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stop.changed() => return,
        };
        let mut permits = permits;
        let extra = exec
            .inflight
            .available_permits()
            .min(opts.batch.saturating_sub(1)) as u32;
        if extra > 0
            && let Ok(more) = exec.inflight.clone().try_acquire_many_owned(extra)
        {
            permits.merge(more);
        }
        let limit = permits.num_permits();
        let batch = match store.claim(shard, limit, opts.lease_ms).await {
            Ok(b) => {
                error_delay = Duration::from_millis(50);
                b
            }
            Err(e) => {
                drop(permits);
                warn!(shard, "claim failed, retrying in {error_delay:?}: {e:#}");
                tokio::select! { _ = tokio::time::sleep(error_delay) => {}, _ = stop.changed() => return }
                error_delay = (error_delay * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        let claimed = batch.tasks.len();
        if claimed > 0 {
            debug!(shard, claimed, "claimed");
            let used = permits
                .split(claimed)
                .expect("claimed no more than the permits held");
            exec.dispatch(batch.tasks, used);
        }
        drop(permits);
        if claimed == limit {
            continue; // more may be due: claim again at once
        }
        // Sleep until the next due time or lease expiry (Redis time), or the fallback.
        let next = [batch.next_due, batch.next_lease_expiry.map(|l| l + 1)]
            .into_iter()
            .flatten()
            .min();
        let fallback_ms = opts.fallback.as_millis() as i64;
        let wait_ms = next.map_or(fallback_ms, |t| (t - batch.now).clamp(0, fallback_ms));
        if wait_ms == 0 {
            continue;
        }
        wake.planned.store(batch.now + wait_ms, Ordering::Release);
        let deadline = Instant::now() + Duration::from_millis(wait_ms as u64);
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = wake.notify.notified() => {}
            _ = stop.changed() => return,
        }
    }
}
