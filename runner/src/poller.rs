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

use crate::executor::{Executor, Reservation};
use crate::pace::Pace;
use crate::shards::{ShardSlot, Shards};
use eggtimer_store::{ClaimBatch, Heard, Store, revocation_of};

/// How often a claim is tried again while Redis is out of memory.
const FULL_RETRY: Duration = Duration::from_millis(250);

/// Settings of the pollers.
#[derive(Clone, Debug)]
pub struct PollerOptions {
    /// Most tasks one claim takes.
    pub batch: usize,
    /// Longest sleep without a claim, in case a wake-up was lost.
    pub fallback: Duration,
    /// Furthest ahead of their due time tasks are claimed under a steady stream (see
    /// [`AHEAD_TASKS`]); zero: only what is due.
    pub ahead: Duration,
}

impl Default for PollerOptions {
    fn default() -> Self {
        PollerOptions {
            batch: 256,
            fallback: Duration::from_secs(2),
            ahead: Duration::from_millis(60),
        }
    }
}

/// About how many tasks a claim under a steady stream should take: a claim costs Redis mostly
/// its fixed cost, so one claim for this many tasks instead of one each cuts its work severalfold.
/// A poller claims ahead as far as the shard's [`Pace`] says so many take to fall due, never past
/// `--claim-ahead`; nothing ahead while the shard is quiet (fewer than two tasks would fall in
/// that window: a claim then costs little) or has a backlog (claims are full anyway, and the
/// room is for what is due). A task claimed ahead is still cancelled or moved on request (a
/// revocation, see the executor's `ahead`), so the window can hold this many: 48 halved W1's
/// script calls per task against 16 (0.19 → 0.09).
const AHEAD_TASKS: f64 = 48.0;

/// Listens for wake messages on Redis pub/sub until `stop`, and for revocations of tasks claimed
/// ahead (on the same channel: see the executor's `ahead`).
pub async fn listen(
    store: Store,
    shards: Arc<Shards>,
    exec: Arc<Executor>,
    mut stop: watch::Receiver<bool>,
) {
    let mut sub = store.subscribe(store.keys().wake_channel(), "wake-ups");
    loop {
        tokio::select! {
            heard = sub.next() => match heard {
                // anything published while we were away
                Heard::Subscribed => shards.wake_all(),
                Heard::Message(text) => match revocation_of(&text) {
                    Some((shard, token, key)) => exec.revoke(shard, key, token),
                    None => shards.on_wake_message(&text),
                },
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
    stop: watch::Receiver<bool>,
) {
    let mut poller = ShardPoller {
        shard,
        store,
        exec,
        shards,
        opts,
        stop,
        error_delay: Duration::from_millis(50),
        full: false,
        last: LastClaim::default(),
        pace: Pace::default(),
        backlog: false,
    };
    while poller.step().await.is_ok() {}
}

/// The poller is stopping (its stop signal, or the executor closed).
struct Stopped;

/// What the last claim left, which decides how the next one waits.
struct LastClaim {
    /// Whether the shard's buckets have tasks due.
    bucket_due: bool,
    /// When the shard's next task falls due, if it has one.
    next_due: Option<Instant>,
    /// Whether tasks of a plugin under its part wait here (set aside).
    waiting_under_part: bool,
    /// Whether a plugin under its part may have tasks due here (headroom is for them).
    others_here: bool,
    /// When not: the earliest one of its tasks may fall due here, if it has tasks here.
    others_due: Option<Instant>,
}

impl Default for LastClaim {
    /// Before the first claim, and after a wake-up: anything may be due.
    fn default() -> Self {
        LastClaim {
            bucket_due: true,
            next_due: None,
            waiting_under_part: false,
            others_here: true,
            others_due: None,
        }
    }
}

/// One shard's poller: each [`step`](Self::step) is one claim, or one wait.
struct ShardPoller {
    shard: u32,
    store: Store,
    exec: Arc<Executor>,
    shards: Arc<Shards>,
    opts: PollerOptions,
    stop: watch::Receiver<bool>,
    error_delay: Duration,
    /// Whether Redis refused the last claim because it is out of memory.
    full: bool,
    last: LastClaim,
    pace: Pace,
    /// Whether the last claim left due tasks it had no room for.
    backlog: bool,
}

impl ShardPoller {
    fn slot(&self) -> &ShardSlot {
        self.shards.get(self.shard)
    }

    /// Claims once what can start now, or waits: for the shard to be this runner's, for room in
    /// the executor, after an error, or until the next due time.
    async fn step(&mut self) -> Result<(), Stopped> {
        if *self.stop.borrow() {
            return Err(Stopped);
        }
        if !self.slot().owned() {
            return self.wait_for_ownership().await;
        }
        self.slot().plan(i64::MAX);
        let Some(room) = self.room().await? else {
            return Ok(());
        };
        let limit = room.len();
        let sent = std::time::Instant::now();
        let mut share = self.exec.share(&room);
        share.ahead_ms = self.ahead_ms(self.backlog);
        let claimed = self
            .store
            .claim_shared(self.shard, limit, self.exec.lease_ms(), &share)
            .await;
        let mut batch = match claimed {
            Ok(batch) => batch,
            Err(e) => {
                drop(room); // the places go back while the claim waits to be tried again
                return self.back_off(e).await;
            }
        };
        self.claim_succeeded();
        self.exec.observe_share_waits(batch.set_aside);
        self.remember(&batch);
        let more = batch.tasks.len() == limit || batch.waiting;
        self.backlog = more;
        self.pace.note(batch.tasks.len());
        let tasks = std::mem::take(&mut batch.tasks);
        if tasks.is_empty() {
            drop(room);
        } else {
            debug!(shard = self.shard, claimed = tasks.len(), "claimed");
            self.exec
                .submit(tasks, room, sent, (batch.now, batch.now_us));
        }
        if more {
            return Ok(()); // more may be due: claim again when there is room
        }
        self.sleep_until_next(&batch).await
    }

    /// Another runner polls this shard; membership wakes this poller when it becomes ours.
    async fn wait_for_ownership(&mut self) -> Result<(), Stopped> {
        if std::mem::take(&mut self.full) {
            self.exec.redis_full(false);
        }
        self.slot().plan(i64::MIN);
        tokio::select! {
            _ = self.shards.get(self.shard).woken() => { self.last = LastClaim::default(); Ok(()) }
            _ = self.stop.changed() => Err(Stopped),
        }
    }

    /// Waits for room in the executor: claim only what can start now. `None` when the wait ended
    /// first for another reason (the next due time, a wake-up) and the step is to begin again.
    /// Nothing due in the buckets (more was claimed than there was room for, or only tasks set
    /// aside wait here): room for them, or at the next due time (or a wake) room with headroom.
    async fn room(&mut self) -> Result<Option<Reservation>, Stopped> {
        let exec = &self.exec;
        let last = &mut self.last;
        let slot = self.shards.get(self.shard);
        let room = if !last.bucket_due {
            let until = last
                .next_due
                .unwrap_or_else(|| Instant::now() + self.opts.fallback);
            tokio::select! {
                r = exec.reserve(self.opts.batch, last.waiting_under_part) => r,
                _ = tokio::time::sleep_until(until) => { last.bucket_due = true; return Ok(None) }
                _ = slot.woken() => { *last = LastClaim::default(); return Ok(None) }
                _ = self.stop.changed() => None,
            }
        } else {
            // (a plugin under its part whose first task falls due while this shard's tasks wait
            // for room: at that time the claim may use headroom)
            let others_due = last.others_due.filter(|_| !last.others_here);
            tokio::select! {
                r = exec.reserve(self.opts.batch, last.others_here) => r,
                _ = tokio::time::sleep_until(others_due.unwrap_or_else(Instant::now)), if others_due.is_some() => {
                    last.others_here = true;
                    return Ok(None);
                }
                _ = self.stop.changed() => None,
            }
        };
        room.map(Some).ok_or(Stopped)
    }

    /// How far ahead (ms) the next claim takes (see [`AHEAD_TASKS`]).
    fn ahead_ms(&self, backlog: bool) -> u64 {
        if backlog {
            return 0;
        }
        self.pace
            .window_ms(AHEAD_TASKS, self.opts.ahead)
            .unwrap_or(0)
    }

    fn claim_succeeded(&mut self) {
        self.error_delay = Duration::from_millis(50);
        if std::mem::take(&mut self.full) {
            info!(
                shard = self.shard,
                "Redis takes writes again: claiming resumed"
            );
            self.exec.redis_full(false);
        }
    }

    /// After a failed claim: waits to try again, longer after each error in a row. Redis refused
    /// the whole claim: nothing changed, no attempt was used. While it is out of memory claims
    /// wait for memory; runs already claimed go on and record their outcomes.
    async fn back_off(&mut self, e: anyhow::Error) -> Result<(), Stopped> {
        let delay = if eggtimer_store::is_full(&e) {
            if !std::mem::replace(&mut self.full, true) {
                warn!(
                    shard = self.shard,
                    "Redis is out of memory (maxmemory reached): no task starts here until memory is freed: {e:#}"
                );
                self.exec.redis_full(true);
            }
            FULL_RETRY
        } else {
            let delay = self.error_delay;
            warn!(
                shard = self.shard,
                "claim failed, retrying in {delay:?}: {e:#}"
            );
            self.error_delay = (delay * 2).min(Duration::from_secs(2));
            delay
        };
        tokio::select! {
            _ = tokio::time::sleep(delay) => Ok(()),
            _ = self.stop.changed() => Err(Stopped),
        }
    }

    /// Keeps what a claim said of the shard for the next wait.
    fn remember(&mut self, batch: &ClaimBatch) {
        // a Redis time as an instant here (at most an hour on: the poller looks again by then)
        let at = |t: i64| {
            Instant::now() + Duration::from_millis((t - batch.now).clamp(0, 3_600_000) as u64)
        };
        self.last = LastClaim {
            bucket_due: batch.next_due.is_some_and(|d| d <= batch.now),
            next_due: batch.next_due.map(at),
            waiting_under_part: batch.waiting_under_part,
            others_here: batch.others_here,
            others_due: batch.others_due.map(at),
        };
    }

    /// Sleeps until the shard's next due time or lease expiry (Redis time), as the claim said, or
    /// the fallback. The wait is whole ms from the claim's whole-ms time, so a poller wakes up to
    /// ~1 ms after the due time (plus the timer's own ms): tasks due within that window share a
    /// claim. Kept so on purpose: waking to the µs cut W1's p50 lateness by 0.2–0.6 ms but took
    /// Redis 5–17% more CPU in claims, and made p99 worse at 30k tasks/s
    /// (docs/benchmarks-archive.md).
    /// Claiming ahead, it wakes a ms before the next due time: that task too is claimed ahead
    /// and starts on time.
    async fn sleep_until_next(&mut self, batch: &ClaimBatch) -> Result<(), Stopped> {
        let now = batch.now;
        let fallback_ms = self.opts.fallback.as_millis() as i64;
        let lead = i64::from(self.ahead_ms(false) >= 2);
        let next = [
            batch.next_due.map(|d| d - lead),
            batch.next_lease_expiry.map(|l| l + 1),
        ]
        .into_iter()
        .flatten()
        .min();
        let wait_ms = next.map_or(fallback_ms, |t| (t - now).clamp(0, fallback_ms));
        self.last.bucket_due = true;
        if wait_ms == 0 {
            return Ok(());
        }
        self.slot().plan(now + wait_ms);
        let deadline = Instant::now() + Duration::from_millis(wait_ms as u64);
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => Ok(()),
            _ = self.shards.get(self.shard).woken() => { self.last.others_here = true; Ok(()) }
            _ = self.stop.changed() => Err(Stopped),
        }
    }
}
