//! The executor: how many tasks run at once, and what happens with their outcomes.
//!
//! A claimed batch is split into chunks that run on blocking threads (at most `workers` at once),
//! each task through the [`Handler`] seam (the wasm plugin host, or a native handler in tests).
//! After a chunk has run, its effects are applied (idempotently) and then its outcomes are recorded
//! with one `finish` script for the chunk: acks are batched.
//!
//! Architecture invariant: effects are applied before the ack, and an outcome is recorded only
//! through the fenced `finish` script, so a task whose runner dies at any point is run again
//! (at least once), never lost.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tracing::{Instrument, debug, info_span, warn};

use crate::metrics::Metrics;
use crate::store::{Claimed, Finish, Finished, NewTask, NsEffects, ScheduleMode, Store};

/// What a handler decided about its task.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Done,
    /// Run again after this many ms (counts as a failed attempt).
    RetryAfter(u64),
    /// Give up: dead-letter with this reason.
    Fail(String),
    /// Run the same task again at this time (ms), attempts reset.
    RunAgainAt(i64),
}

/// The effects a handler asked for, applied before its outcome is recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Effects {
    /// Follow-up tasks, created only if their (derived) id does not exist yet.
    pub schedule: Vec<NewTask>,
    /// Ids of tasks to cancel.
    pub cancel: Vec<String>,
    /// kv writes and events.
    pub ns: NsEffects,
}

/// One run of a handler.
#[derive(Debug)]
pub struct Run {
    /// `Err` is a failure of the run itself (trap, timeout, unknown plugin): retried with backoff.
    pub outcome: Result<Outcome, String>,
    pub effects: Effects,
}

impl Run {
    /// A run that failed before it could decide anything (retried with backoff).
    pub fn failed(error: impl Into<String>) -> Run {
        Run {
            outcome: Err(error.into()),
            effects: Effects::default(),
        }
    }

    /// A run with an outcome and no effects.
    pub fn outcome(outcome: Outcome) -> Run {
        Run {
            outcome: Ok(outcome),
            effects: Effects::default(),
        }
    }
}

/// Reads a handler may make while it runs.
pub trait TaskHost: Send + Sync {
    /// One entry of the plugin's key-value store.
    fn kv_get(&self, plugin: &str, key: &str) -> Result<Option<String>, String>;
}

/// Runs tasks. Called on a blocking thread; it must return (the wasm host bounds every call).
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, task: &Claimed, host: &Arc<dyn TaskHost>) -> Run;
}

impl<F> Handler for F
where
    F: Fn(&Claimed, &Arc<dyn TaskHost>) -> Run + Send + Sync + 'static,
{
    fn handle(&self, task: &Claimed, host: &Arc<dyn TaskHost>) -> Run {
        self(task, host)
    }
}

/// Retry backoff: `base · 2^(attempt−1)`, capped, with jitter in its upper half. Pure.
pub fn backoff_ms(attempt: u32, base_ms: u64, cap_ms: u64, unit_random: f64) -> u64 {
    let exp = base_ms
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(40))
        .min(cap_ms);
    let half = exp / 2;
    half + ((exp - half) as f64 * unit_random.clamp(0.0, 1.0)) as u64
}

/// Settings of the executor.
#[derive(Clone, Debug)]
pub struct ExecutorOptions {
    /// Tasks run at once (blocking threads).
    pub workers: usize,
    /// Tasks claimed and not yet finished, per runner.
    pub max_inflight: usize,
    pub retry_base_ms: u64,
    pub retry_cap_ms: u64,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        ExecutorOptions {
            workers: cores * 2,
            max_inflight: 2048,
            retry_base_ms: 1000,
            retry_cap_ms: 3_600_000,
        }
    }
}

/// Runs claimed tasks; shared by the shard pollers.
pub struct Executor {
    store: Store,
    handler: Arc<dyn Handler>,
    opts: ExecutorOptions,
    /// Claimed-but-unfinished tasks: a poller claims only as many as it holds permits for.
    pub inflight: Arc<Semaphore>,
    workers: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    stopping: watch::Receiver<bool>,
}

struct StoreHost {
    store: Store,
    rt: tokio::runtime::Handle,
}

impl TaskHost for StoreHost {
    fn kv_get(&self, plugin: &str, key: &str) -> Result<Option<String>, String> {
        self.rt
            .block_on(self.store.kv_get(plugin, key))
            .map_err(|e| format!("{e:#}"))
    }
}

/// Milliseconds since the Unix epoch, by this process's clock.
///
/// `EGGTIMER_TEST_CLOCK_SKEW_MS` shifts it, so that tests can run a runner whose clock is wrong;
/// nothing that decides when a task fires depends on it (that is Redis time).
pub fn now_ms() -> i64 {
    static SKEW: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let skew = *SKEW.get_or_init(|| {
        std::env::var("EGGTIMER_TEST_CLOCK_SKEW_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
        + skew
}

impl Executor {
    pub fn new(
        store: Store,
        handler: Arc<dyn Handler>,
        opts: ExecutorOptions,
        metrics: Arc<Metrics>,
        stopping: watch::Receiver<bool>,
    ) -> Arc<Self> {
        Arc::new(Executor {
            store,
            handler,
            inflight: Arc::new(Semaphore::new(opts.max_inflight)),
            workers: Arc::new(Semaphore::new(opts.workers.max(1))),
            opts,
            metrics,
            stopping,
        })
    }

    /// Starts running a claimed batch (holding one in-flight permit per task) and returns at once.
    pub fn dispatch(self: &Arc<Self>, tasks: Vec<Claimed>, mut permits: OwnedSemaphorePermit) {
        if tasks.is_empty() {
            return;
        }
        let chunks = self.opts.workers.clamp(1, tasks.len());
        let per = tasks.len().div_ceil(chunks);
        let mut tasks = tasks.into_iter().peekable();
        while tasks.peek().is_some() {
            let chunk: Vec<Claimed> = tasks.by_ref().take(per).collect();
            // one permit per task, released when its chunk is recorded
            let p = permits.split(chunk.len());
            let this = Arc::clone(self);
            tokio::spawn(async move {
                this.run_chunk(chunk).await;
                drop(p);
            });
        }
    }

    async fn run_chunk(&self, chunk: Vec<Claimed>) {
        let Ok(_worker) = self.workers.clone().acquire_owned().await else {
            return;
        };
        let handler = Arc::clone(&self.handler);
        let host: Arc<dyn TaskHost> = Arc::new(StoreHost {
            store: self.store.clone(),
            rt: tokio::runtime::Handle::current(),
        });
        let stopping = self.stopping.clone();
        let metrics = Arc::clone(&self.metrics);
        let (chunk, runs) = tokio::task::spawn_blocking(move || {
            let mut runs = Vec::with_capacity(chunk.len());
            for task in &chunk {
                if *stopping.borrow() {
                    runs.push(None); // not started: released back
                    continue;
                }
                let lateness = now_ms() - task.due;
                let t0 = std::time::Instant::now();
                let run = handler.handle(task, &host);
                metrics.observe_run(&task.plugin, lateness, t0.elapsed());
                runs.push(Some(run));
            }
            (chunk, runs)
        })
        .await
        .expect("a handler panicked: handlers must turn failures into errors");
        drop(_worker);
        self.record(chunk, runs).await;
    }

    /// Applies the effects of a chunk's runs, then records their outcomes (one script per chunk).
    async fn record(&self, chunk: Vec<Claimed>, runs: Vec<Option<Run>>) {
        let mut outcomes: Vec<(usize, Finish)> = Vec::with_capacity(chunk.len());
        for (i, (task, run)) in chunk.iter().zip(runs).enumerate() {
            let Some(run) = run else {
                outcomes.push((i, Finish::Release));
                continue;
            };
            let span =
                || info_span!("task", id = %task.id, plugin = %task.plugin, attempt = task.attempt);
            if run.effects != Effects::default()
                && let Err(e) = self
                    .apply_effects(task, &run.effects)
                    .instrument(span())
                    .await
            {
                // Not recorded: the lease expires and the task runs again, effects re-applied
                // idempotently. Nothing is lost.
                span()
                    .in_scope(|| warn!("applying effects failed, the task will run again: {e:#}"));
                continue;
            }
            let finish = match run.outcome {
                Ok(Outcome::Done) => Finish::Done,
                Ok(Outcome::RunAgainAt(at)) => Finish::Again { at },
                Ok(Outcome::RetryAfter(ms)) => Finish::Retry {
                    after_ms: ms as i64,
                    error: format!("the handler asked to retry in {ms} ms"),
                },
                Ok(Outcome::Fail(reason)) => Finish::Dead { error: reason },
                Err(error) => {
                    let after_ms = backoff_ms(
                        task.attempt,
                        self.opts.retry_base_ms,
                        self.opts.retry_cap_ms,
                        rand::random::<f64>(),
                    ) as i64;
                    span().in_scope(|| warn!(%error, "the task failed"));
                    Finish::Retry { after_ms, error }
                }
            };
            outcomes.push((i, finish));
        }
        if outcomes.is_empty() {
            return;
        }
        let items: Vec<(&str, u32, &Finish)> = outcomes
            .iter()
            .map(|(i, f)| (chunk[*i].id.as_str(), chunk[*i].attempt, f))
            .collect();
        match self.store.finish(chunk[0].shard, &items).await {
            Ok(verdicts) => {
                self.metrics.observe_finishes(
                    outcomes
                        .iter()
                        .zip(&verdicts)
                        .map(|((i, _), v)| (chunk[*i].plugin.as_str(), *v)),
                );
                for ((i, _), v) in outcomes.iter().zip(verdicts) {
                    let task = &chunk[*i];
                    if v == Finished::Stale {
                        warn!(id = %task.id, attempt = task.attempt, "outcome refused: the lease was lost");
                    } else {
                        debug!(id = %task.id, attempt = task.attempt, ?v, "recorded");
                    }
                }
            }
            Err(e) => warn!(
                "recording outcomes failed; the leases will expire and the tasks run again: {e:#}"
            ),
        }
    }

    async fn apply_effects(&self, task: &Claimed, fx: &Effects) -> anyhow::Result<()> {
        if !fx.schedule.is_empty() {
            self.store
                .schedule(&fx.schedule, ScheduleMode::IfAbsent)
                .await?;
            for t in &fx.schedule {
                self.metrics.observe_scheduled(&t.plugin, 1);
            }
        }
        for id in &fx.cancel {
            let _ = self.store.cancel(id).await?;
        }
        self.store.apply_ns_effects(task, &fx.ns).await?;
        Ok(())
    }

    /// Waits until every claimed task has finished (or `limit` passed); true when all did.
    pub async fn drain(&self, limit: Duration) -> bool {
        let all = self.opts.max_inflight as u32;
        tokio::time::timeout(limit, self.inflight.acquire_many(all))
            .await
            .is_ok()
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
