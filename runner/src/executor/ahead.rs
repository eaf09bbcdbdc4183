//! Tasks claimed ahead of their due time wait here until it comes. Under a steady stream a
//! poller claims what falls due within a few ms in one script (see the poller's pace) instead of
//! one claim per task or two; each task still starts at its own due time, not at its claim.
//!
//! The wait is tokio's timer, itself a hierarchical timing wheel (ms ticks, as Netty's and
//! Kafka's): one timer task per claim goes through the claim's later tasks in due order and
//! queues each group for a worker when its time comes. A task waiting here is claimed: it holds
//! its slot, its lease is renewed, and to the store it is running. A cancel or a move of it is a
//! revocation (see the store's `revoke`): every runner hears of it, the one holding the task
//! takes it out of its wait here, so it can't start, and applies it; a task already started
//! refuses it (the cancel or move answers 409). On shutdown what waits is queued at once, and the
//! run's first check releases it back to due, unstarted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::warn;

use super::Executor;
use super::share::Slot;
use eggtimer_store::Claimed;

/// The tasks claimed ahead waiting for their due time, by shard and task key: each with its
/// slot and the instant it may start.
#[derive(Default)]
pub(super) struct Waiting(Mutex<HashMap<(u32, String), Wait>>);

type Wait = (Claimed, Slot, tokio::time::Instant);

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u32, String), Wait>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes out the task `key` of `shard` if it waits under the claim `token`.
    fn take(&self, shard: u32, key: &str, token: u64) -> Option<Wait> {
        let mut g = self.lock();
        let k = (shard, key.to_owned());
        if g.get(&k)?.0.token != token {
            return None;
        }
        g.remove(&k)
    }
}

impl Executor {
    /// Starts `later` (tasks due after `now`, the claim's Redis time: ms, and the µs past it)
    /// each at its due time, counted from `answered`, when the claim's answer had come: Redis
    /// read its clock before that, so the wait is never short (a task never starts before its
    /// due time by Redis's clock), and too long by at most the claim's round trip.
    pub(super) fn start_when_due(
        self: &Arc<Self>,
        later: Vec<(Claimed, Slot)>,
        (now, now_us): (i64, u16),
        answered: Instant,
    ) {
        if later.is_empty() {
            return;
        }
        self.metrics.observe_claimed_ahead(later.len() as u64);
        let mut order = Vec::with_capacity(later.len());
        {
            let mut waiting = self.waiting.lock();
            for (task, slot) in later {
                let wait = Duration::from_micros(
                    u64::try_from((task.due - now) * 1000 - i64::from(now_us)).unwrap_or(0),
                );
                let at = tokio::time::Instant::from_std(answered + wait);
                order.push((at, task.shard, task.id.clone(), task.token));
                waiting.insert((task.shard, task.id.clone()), (task, slot, at));
            }
        }
        order.sort_by_key(|(at, ..)| *at);
        self.start_at(order);
    }

    /// Queues each of `order` (start instant, shard, key, token; in start order) for a worker at
    /// its instant, if it still waits (not revoked); all at once when the runner stops.
    fn start_at(self: &Arc<Self>, order: Vec<(tokio::time::Instant, u32, String, u64)>) {
        let this = Arc::clone(self);
        let mut stopping = self.stopping.clone();
        tokio::spawn(async move {
            let mut order = order.into_iter().peekable();
            let mut stop = false;
            while let Some((at, ..)) = order.peek() {
                let at = *at;
                if !stop {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        _ = stopping.wait_for(|s| *s) => stop = true,
                    }
                }
                let mut due = Vec::new();
                while let Some((_, shard, key, token)) = order.next_if(|(t, ..)| stop || *t <= at) {
                    if let Some((task, slot, _)) = this.waiting.take(shard, &key, token) {
                        due.push((task, slot));
                    }
                }
                let mut queue = this.queue.lock();
                for (task, slot) in due {
                    queue.push(task, slot);
                }
                drop(queue);
                this.start_waiting();
            }
        });
    }

    /// A revocation of the task `key` of `shard`, claimed under `token`, was asked (a cancel or
    /// a move of it while it was claimed ahead). If this runner holds it waiting, it takes it
    /// out of its wait and applies the revocation (the task does not start, its slot is free);
    /// if the revocation may not be applied any more it starts the task after all, at its due
    /// time. If it holds it started, it refuses at once. Else the task is not this runner's.
    pub fn revoke(self: &Arc<Self>, shard: u32, key: &str, token: u64) {
        let taken = self.waiting.take(shard, key, token);
        if taken.is_none() && !self.held.holds(shard, key, token) {
            return;
        }
        let this = Arc::clone(self);
        let key = key.to_owned();
        tokio::spawn(async move {
            let Some((task, slot, at)) = taken else {
                if let Err(e) = this.store.refuse_revocation(shard, &key, token).await {
                    warn!(%key, "refusing a revocation of a started task failed: {e:#}");
                }
                return;
            };
            match this.store.apply_revocation(shard, &key, token).await {
                Ok(false) => {
                    this.waiting
                        .lock()
                        .insert((shard, key.clone()), (task, slot, at));
                    this.start_at(vec![(at, shard, key, token)]);
                    return;
                }
                Ok(true) => this.metrics.observe_revoked(),
                // (applied or not: unknown. Not started, and its lease no longer renewed: the
                // asker is told it runs, and it does, once its lease ends, unless it was applied)
                Err(e) => {
                    warn!(%key, "applying a revocation failed; the task runs again after its lease: {e:#}")
                }
            }
            this.held.remove(shard, &key, token);
            drop(slot);
            this.freed.notify_waiters();
        });
    }
}
