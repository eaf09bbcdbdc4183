//! One run: from a claimed task to the outcome the finisher records — the checks before it starts
//! (shutdown, its plugin or owner paused, `start_by`, its plugin loaded, the limits), the
//! handler's rounds (again while the kv entries it read change), and what its outcome records.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tracing::{Instrument, Span, debug, info_span, warn};

use super::Executor;
use super::commit::NotCommitted;
use super::handler::Outcome;
use super::limits::SlotWait;
use crate::trace;
use eggtimer_store::{AttemptLog, Claimed, Finish, SlotsOf};

/// Retry backoff: `base · 2^(attempt−1)`, capped, with jitter in its upper half. Pure.
pub fn backoff_ms(attempt: u32, base_ms: u64, cap_ms: u64, unit_random: f64) -> u64 {
    let exp = base_ms
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(40))
        .min(cap_ms);
    let half = exp / 2;
    half + ((exp - half) as f64 * unit_random.clamp(0.0, 1.0)) as u64
}

/// How many times a run whose kv reads went stale is run again before the attempt fails.
const MAX_CONFLICT_ROUNDS: u32 = 8;

/// What a run leaves for the finisher beside its outcome.
#[derive(Default)]
pub(super) struct RunNotes {
    /// Its kv writes and events were committed under its marker.
    pub(super) marked: bool,
    /// What the plugin logged in its last round (kept with the task).
    pub(super) log: AttemptLog,
    /// Put back because a concurrency limit had no slot free: it waits for one.
    pub(super) slot_wait: Option<SlotWait>,
}

impl Executor {
    /// Runs the task until it has an outcome to record; None when nothing may be recorded (the
    /// claim was lost, or its effects could not be committed: the lease then expires and the
    /// task runs again).
    pub(super) async fn run_to_outcome(
        &self,
        task: &Claimed,
        traced: &Span,
        notes: &mut RunNotes,
    ) -> Option<Finish> {
        if *self.stopping.borrow() {
            return Some(Finish::Release); // not started: back to due
        }
        // (an owner's pause counts for a task claimed before this runner heard of it: one claimed
        // after, that its shard's claim did not park, its shard does not hold paused, and runs)
        let owner_paused = || {
            let owner = task.owner.as_deref()?;
            let at = self.held.claimed_at(task)?;
            Some(self.store.owner_paused(owner, &task.plugin, at))
        };
        if self.store.policy(&task.plugin).paused || owner_paused() == Some(true) {
            // paused since its claim (claimed ahead, or waiting for a worker), the plugin or the
            // task's owner: back to due, unstarted and its attempt given back; the next claim
            // parks it
            return Some(Finish::Release);
        }
        if let Some(by) = task.start_by
            && self.store.clock().now_ms() > by
        {
            let when = chrono::DateTime::from_timestamp_millis(by).map_or(by.to_string(), |t| {
                t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
            });
            return Some(Finish::Dead {
                error: format!("expired: not started by its start_by, {when}"),
            });
        }
        if let Some(wait) = self.not_loaded_yet(task).await {
            return Some(wait);
        }
        if let Some(wait) = self.over_rate(task).await {
            return Some(wait);
        }
        let limits = self.slot_limits(task);
        if limits.is_empty() {
            return self.run_rounds(task, None, traced, notes).await;
        }
        // a concurrency slot per limit per run, across all runners; one not free: back to
        // scheduled, the attempt given back, and the worker is free for other plugins' tasks at
        // once; it waits among that limit's runs until a slot is given back (or its lease's
        // time at most, should that word be lost)
        let holder = format!("{}#{}", task.id, task.token);
        if let Err(full) = self.take_slots(task, &holder, &limits).await {
            let wait = self.slot_wait(task, &limits[full]);
            let after_ms = i64::try_from(wait.within_ms).unwrap_or(i64::MAX);
            notes.slot_wait = Some(wait);
            return Some(Finish::Defer { after_ms });
        }
        let finish = self
            .run_rounds(task, Some((&holder, &limits)), traced, notes)
            .await;
        self.give_slots(task, &holder, &limits).await;
        finish
    }

    /// Runs the handler (again while the kv entries it read change), holding the slots if any.
    async fn run_rounds(
        &self,
        task: &Claimed,
        slots: Option<(&str, &[(SlotsOf<'_>, u32)])>,
        traced: &Span,
        notes: &mut RunNotes,
    ) -> Option<Finish> {
        let lateness = self.store.clock().now_ms() - task.due;
        for round in 0..MAX_CONFLICT_ROUNDS {
            if round > 0
                && let Some((holder, limits)) = slots
            {
                self.renew_slots(task, holder, limits).await;
            }
            let t0 = Instant::now();
            let run = Arc::clone(&self.handler)
                .handle(task.clone(), Arc::clone(&self.host))
                .instrument(info_span!(target: trace::TARGET, parent: traced, "plugin.call", round))
                .await;
            let took = t0.elapsed();
            // moving average (1/8 weight), for the adaptive prefetch
            let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            let avg = self.run_us.load(Ordering::Relaxed);
            self.run_us
                .store((avg - avg / 8).saturating_add(us / 8), Ordering::Relaxed);
            if round == 0 {
                self.metrics.observe_run(&task.plugin, lateness, took);
            }
            notes.log = run.log;
            let outcome = match run.outcome {
                Ok(o) => o,
                Err(error) => {
                    warn!(id = %task.id, plugin = %task.plugin, attempt = task.attempt, %error, "the task failed");
                    return Some(self.retry(task, error));
                }
            };
            if !run.effects.writes_nothing() {
                match self
                    .commit_run(task, run.effects, traced, &mut notes.marked)
                    .await
                {
                    Ok(()) => {}
                    Err(NotCommitted::Conflict) => {
                        debug!(
                            round,
                            "a kv entry the run read has changed: running it again"
                        );
                        continue;
                    }
                    Err(NotCommitted::Lost) => {
                        warn!(id = %task.id, "the claim was lost before its effects were committed; dropped them");
                        return None;
                    }
                    Err(NotCommitted::Failed(e)) => {
                        warn!(id = %task.id, "committing effects failed, the task will run again: {e:#}");
                        return None;
                    }
                    Err(NotCommitted::OverQuota(error)) => {
                        warn!(id = %task.id, plugin = %task.plugin, %error, "the task failed");
                        return Some(self.retry(task, error));
                    }
                }
            }
            return Some(self.finish_of(task, outcome));
        }
        Some(self.retry(
            task,
            format!(
                "the kv entries this run read were changed by other runs {MAX_CONFLICT_ROUNDS} times in a row"
            ),
        ))
    }

    /// What a handler's outcome records (an outcome out of bounds is a failed attempt).
    fn finish_of(&self, task: &Claimed, outcome: Outcome) -> Finish {
        match outcome {
            Outcome::Done => Finish::Done,
            Outcome::RunAgainAt(at) => match eggtimer_base::limits::time("run_again_at", at) {
                Ok(at) => Finish::Again { at },
                Err(e) => self.retry(task, format!("the handler's outcome is out of bounds: {e}")),
            },
            Outcome::RetryAfter(ms) => {
                match i64::try_from(ms)
                    .map_err(|_| eggtimer_base::limits::OutOfBounds(String::new()))
                    .and_then(|ms| eggtimer_base::limits::duration("retry_after", ms))
                {
                    Ok(after_ms) => Finish::Retry {
                        after_ms,
                        error: format!("the handler asked to retry in {ms} ms"),
                    },
                    Err(_) => self.retry(
                        task,
                        format!(
                            "the handler's outcome is out of bounds: retry_after must be from 0 to {} ms (10 years), got {ms}",
                            eggtimer_base::limits::MAX_DURATION_MS
                        ),
                    ),
                }
            }
            Outcome::Fail(reason) => Finish::Dead {
                error: eggtimer_base::limits::error_message(reason),
            },
        }
    }

    pub(super) fn retry(&self, task: &Claimed, error: String) -> Finish {
        let after_ms = backoff_ms(
            task.attempt,
            self.opts.retry_base_ms,
            self.opts.retry_cap_ms,
            rand::random::<f64>(),
        )
        .min(eggtimer_base::limits::MAX_DURATION_MS as u64) as i64;
        Finish::Retry {
            after_ms,
            error: eggtimer_base::limits::error_message(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff_ms(1, 1000, 60_000, 1.0), 1000);
        assert_eq!(backoff_ms(2, 1000, 60_000, 1.0), 2000);
        assert_eq!(backoff_ms(3, 1000, 60_000, 0.0), 2000);
        assert_eq!(backoff_ms(30, 1000, 60_000, 1.0), 60_000);
        assert_eq!(backoff_ms(u32::MAX, 1000, 60_000, 0.5), 45_000);
    }
}
