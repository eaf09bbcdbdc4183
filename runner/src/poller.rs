//! The pollers: when to claim. One loop per shard.
//!
//! A poller sleeps until the earliest time it knows of (the shard's next due time or next lease
//! expiry, both returned by the claim script in Redis time), and is woken early through Redis
//! pub/sub when a task is scheduled earlier than that (by any runner, this one included). A bounded
//! fallback poll covers a lost wake-up. While tasks are due it claims back to back, as many as the
//! executor has room for ([`Executor::reserve`]), so claimed tasks start at once.
//!
//! Architecture invariant: the wait is computed from Redis time differences (due − Redis now), so
//! a runner whose clock is off neither fires early nor late.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::executor::Executor;
use crate::shards::Shards;
use crate::store::{Heard, Store};

/// How often a claim is tried again while Redis is out of memory.
const FULL_RETRY: Duration = Duration::from_millis(250);

/// Settings of the pollers.
#[derive(Clone, Debug)]
pub struct PollerOptions {
    /// Most tasks one claim takes.
    pub batch: usize,
    /// Longest sleep without a claim, in case a wake-up was lost.
    pub fallback: Duration,
}

impl Default for PollerOptions {
    fn default() -> Self {
        PollerOptions {
            batch: 256,
            fallback: Duration::from_secs(2),
        }
    }
}

/// Listens for wake messages on Redis pub/sub until `stop`.
pub async fn listen(store: Store, shards: Arc<Shards>, mut stop: watch::Receiver<bool>) {
    let mut sub = store.subscribe(store.keys().wake_channel(), "wake-ups");
    loop {
        tokio::select! {
            heard = sub.next() => match heard {
                // anything published while we were away
                Heard::Subscribed => shards.wake_all(),
                Heard::Message(text) => shards.on_wake_message(&text),
            },
            _ = stop.changed() => return,
        }
    }
}

/// Polls one shard until `stop`.
pub async fn poll_shard(
    shard: u32,
    store: Store,
    exec: Arc<Executor>,
    shards: Arc<Shards>,
    opts: PollerOptions,
    mut stop: watch::Receiver<bool>,
) {
    let slot = shards.get(shard);
    let mut error_delay = Duration::from_millis(50);
    // what the last claim left: whether the shard's buckets have tasks due, when their next
    // task falls due, and whether tasks of a plugin under its part wait here (set aside)
    let (mut bucket_due, mut next_due, mut waiting_under_part) = (true, None::<Instant>, false);
    // whether a plugin under its part has tasks here (headroom is for them)
    let mut others_here = true;
    // whether Redis refused the last claim because it is out of memory
    let mut full = false;
    loop {
        if *stop.borrow() {
            return;
        }
        if !slot.owned() {
            if std::mem::take(&mut full) {
                exec.redis_full(false);
            }
            // another runner polls this shard; membership wakes us when it becomes ours
            slot.plan(i64::MIN);
            tokio::select! {
                _ = slot.woken() => { bucket_due = true; others_here = true; continue }
                _ = stop.changed() => return,
            }
        }
        slot.plan(i64::MAX);
        // Claim only what can start now: wait for room in the executor. Nothing due in the
        // buckets (more claimed than there was room for, or only tasks set aside waiting here):
        // room for them, or at the next due time (or a wake) room with headroom.
        let res = if !bucket_due {
            let until = next_due.unwrap_or_else(|| Instant::now() + opts.fallback);
            tokio::select! {
                r = exec.reserve(opts.batch, waiting_under_part) => match r { Some(r) => r, None => return },
                _ = tokio::time::sleep_until(until) => { bucket_due = true; continue }
                _ = slot.woken() => { bucket_due = true; others_here = true; continue }
                _ = stop.changed() => return,
            }
        } else {
            tokio::select! {
                r = exec.reserve(opts.batch, others_here) => match r { Some(r) => r, None => return },
                _ = stop.changed() => return,
            }
        };
        let limit = res.len();
        let sent = std::time::Instant::now();
        let share = exec.share(&res);
        let batch = match store
            .claim_shared(shard, limit, exec.lease_ms(), &share)
            .await
        {
            Ok(b) => {
                error_delay = Duration::from_millis(50);
                if std::mem::take(&mut full) {
                    info!(shard, "Redis takes writes again: claiming resumed");
                    exec.redis_full(false);
                }
                b
            }
            Err(e) if crate::store::is_full(&e) => {
                // Redis refused the whole claim: nothing changed, no attempt was used. Claims
                // wait for memory; runs already claimed go on and record their outcomes.
                drop(res);
                if !std::mem::replace(&mut full, true) {
                    warn!(
                        shard,
                        "Redis is out of memory (maxmemory reached): no task starts here until memory is freed: {e:#}"
                    );
                    exec.redis_full(true);
                }
                tokio::select! { _ = tokio::time::sleep(FULL_RETRY) => {}, _ = stop.changed() => return }
                continue;
            }
            Err(e) => {
                drop(res);
                warn!(shard, "claim failed, retrying in {error_delay:?}: {e:#}");
                tokio::select! { _ = tokio::time::sleep(error_delay) => {}, _ = stop.changed() => return }
                error_delay = (error_delay * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        exec.observe_share_waits(batch.set_aside);
        let claimed = batch.tasks.len();
        if claimed > 0 {
            debug!(shard, claimed, "claimed");
            exec.submit(batch.tasks, res, sent);
        } else {
            drop(res);
        }
        waiting_under_part = batch.waiting_under_part;
        others_here = batch.others_here;
        bucket_due = batch.next_due.is_some_and(|d| d <= batch.now);
        next_due = batch.next_due.map(|d| {
            Instant::now() + Duration::from_millis((d - batch.now).clamp(0, 3_600_000) as u64)
        });
        if claimed == limit || batch.waiting {
            continue; // more may be due: claim again when there is room
        }
        // Sleep until the next due time or lease expiry (Redis time), or the fallback. The wait
        // is whole ms from the claim's whole-ms time, so a poller wakes up to ~1 ms after the
        // due time (plus the timer's own ms): tasks due within that window share a claim. Kept
        // so on purpose: waking to the µs cut W1's p50 lateness by 0.2–0.6 ms but took Redis
        // 5–17% more CPU in claims, and made p99 worse at 30k tasks/s (docs/benchmarks-archive.md).
        let next = [batch.next_due, batch.next_lease_expiry.map(|l| l + 1)]
            .into_iter()
            .flatten()
            .min();
        let fallback_ms = opts.fallback.as_millis() as i64;
        let wait_ms = next.map_or(fallback_ms, |t| (t - batch.now).clamp(0, fallback_ms));
        if wait_ms == 0 {
            bucket_due = true;
            continue;
        }
        slot.plan(batch.now + wait_ms);
        let deadline = Instant::now() + Duration::from_millis(wait_ms as u64);
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = slot.woken() => others_here = true,
            _ = stop.changed() => return,
        }
        bucket_due = true;
    }
}
