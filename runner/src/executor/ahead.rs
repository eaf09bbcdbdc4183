//! Tasks claimed ahead of their due time wait here until it comes. Under a steady stream a
//! poller claims what falls due within a few ms in one script (see the poller's pace) instead of
//! one claim per task or two; each task still starts at its own due time, not at its claim.
//!
//! The wait is tokio's timer, itself a hierarchical timing wheel (ms ticks, as Netty's and
//! Kafka's): one timer task per claim goes through the claim's later tasks in due order and
//! queues each group for a worker when its time comes. A task waiting here is claimed: it holds
//! its slot, its lease is renewed, and to the store it is running (a cancel or a move answers
//! 409, as for a task claimed a moment before it starts). On shutdown what waits is queued at
//! once, and the run's first check releases it back to due, unstarted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Executor;
use super::share::Slot;
use crate::store::Claimed;

impl Executor {
    /// Starts `later` (tasks due after `now`, the claim's Redis time: ms, and the µs past it)
    /// each at its due time, counted from `answered`, when the claim's answer had come: Redis
    /// read its clock before that, so the wait is never short (a task never starts before its
    /// due time by Redis's clock), and too long by at most the claim's round trip.
    pub(super) fn start_when_due(
        self: &Arc<Self>,
        mut later: Vec<(Claimed, Slot)>,
        (now, now_us): (i64, u16),
        answered: Instant,
    ) {
        if later.is_empty() {
            return;
        }
        self.metrics.observe_claimed_ahead(later.len() as u64);
        later.sort_by_key(|(t, _)| t.due);
        let this = Arc::clone(self);
        let mut stopping = self.stopping.clone();
        tokio::spawn(async move {
            let mut later = later.into_iter().peekable();
            let mut stop = false;
            while let Some((first, _)) = later.peek() {
                let due = first.due;
                if !stop {
                    let wait = Duration::from_micros(
                        u64::try_from((due - now) * 1000 - i64::from(now_us)).unwrap_or(0),
                    );
                    let at = tokio::time::Instant::from_std(answered + wait);
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        _ = stopping.wait_for(|s| *s) => stop = true,
                    }
                }
                let mut queue = this.queue.lock();
                while let Some((task, slot)) = later.next_if(|(t, _)| stop || t.due <= due) {
                    queue.push(task, slot);
                }
                drop(queue);
                this.start_waiting();
            }
        });
    }
}
