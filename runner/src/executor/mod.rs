//! The executor: how many tasks run at once, the claims this runner holds, and what happens with
//! outcomes.
//!
//! Capacity: a runner holds at most `workers + prefetch` claimed tasks; pollers [`reserve`] room
//! before they claim, so a claimed task starts within moments instead of waiting in memory.
//! Every held claim's lease is renewed (one script per shard every third of the lease) until its
//! outcome is recorded, so a slow handler is never claimed twice while its runner lives, and the
//! lease can be short: a dead runner's tasks run again soon after it stops renewing.
//!
//! A run: the handler is called (the wasm host bounds every call); its effects are committed only
//! if the claim is still current and no kv entry it read has changed (else it runs again with
//! fresh reads); then its outcome goes to the finisher, which records outcomes with one `finish`
//! script per shard (group commit: a quiet shard's at once when nothing is being recorded, else
//! when there are 256 or the oldest has waited 2 ms; under a steady stream a shard's wait for
//! about 32, at most 40 ms, unless a poller waits for room).
//!
//! Files: `handler` (the seam and what a run returns), `run` (one run, from a claimed task to
//! its outcome), `ahead` (tasks claimed ahead, waiting for their due time), `commit` (a run's
//! effects), `held` (the
//! claims held, and the [`LeaseKeeper`] that renews their leases), `finisher` (the
//! [`Finisher`], recording outcomes). The runner starts the lease keeper and the finisher beside
//! the executor.
//!
//! Architecture invariant: effects are committed before the outcome, and finish, renew and
//! effects are fenced by the claim token; a task whose runner dies at any point is run again
//! (at least once), never lost.
//!
//! [`reserve`]: Executor::reserve

mod ahead;
mod commit;
mod finisher;
mod handler;
mod held;
mod limits;
mod run;
mod share;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tracing::{Instrument, debug_span, info_span, warn};

pub use finisher::Finisher;
use finisher::Pending;
pub use handler::{Effects, Handler, Outcome, Run, TaskHost};
use held::Held;
pub use held::LeaseKeeper;
use run::RunNotes;
pub use run::backoff_ms;
pub(crate) use share::Slot;
use share::{Shares, StartQueue};

use crate::counted::Counted;
use crate::metrics::Metrics;
use crate::trace;
use eggtimer_store::{Claimed, Store};

/// A panic's message (its payload when that is a string).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into())
}

/// Outcomes of one shard recorded by one finish script at most.
const FINISH_GROUP: usize = 256;
/// Longest an outcome waits for others of its shard before it is recorded: a finish script per
/// shard for many outcomes costs Redis far less per task than one per outcome.
const FINISH_WAIT: Duration = Duration::from_millis(2);
/// Tasks are claimed beyond the free workers only as many as the workers will start within this
/// horizon, judged from the recent run time: a deep prefetch for fast handlers, none for slow.
const PREFETCH_HORIZON_US: u64 = 20_000;
/// Slots beyond the target for plugins under their part while one plugin crowds the runner
/// (see [`Executor::reserve`]).
fn headroom(workers: usize) -> usize {
    (workers / 4).max(2)
}

/// Settings of the executor.
#[derive(Clone, Debug)]
pub struct ExecutorOptions {
    /// Handler calls at once.
    pub workers: usize,
    /// Most tasks claimed beyond the free workers (the prefetch adapts below this: see
    /// [`PREFETCH_HORIZON_US`]), so a worker that frees up starts the next at once.
    pub prefetch: usize,
    /// Lease of a claimed task (ms); renewed every third of it while the task is held.
    pub lease_ms: u64,
    pub retry_base_ms: u64,
    pub retry_cap_ms: u64,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        ExecutorOptions {
            workers: 32,
            prefetch: 1024,
            lease_ms: 5_000,
            retry_base_ms: 1000,
            retry_cap_ms: 3_600_000,
        }
    }
}

/// Room for claimed tasks, taken by a poller before it claims; what it does not use goes back
/// when it is dropped, and pollers waiting for room are woken.
pub struct Reservation {
    permits: OwnedSemaphorePermit,
    freed: Arc<Notify>,
    /// How many of the places are headroom (see [`Executor::reserve`]).
    headroom: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.permits.num_permits() > 0 {
            self.freed.notify_waiters();
        }
    }
}

impl Reservation {
    pub fn len(&self) -> usize {
        self.permits.num_permits()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Runs claimed tasks; shared by the shard pollers.
pub struct Executor {
    store: Store,
    handler: Arc<dyn Handler>,
    opts: ExecutorOptions,
    /// Claimed and not yet recorded (workers + prefetch).
    slots: Arc<Semaphore>,
    /// Of those, how many of each plugin.
    shares: Arc<Shares>,
    /// Handler calls at once.
    running: Arc<Semaphore>,
    /// Claimed tasks waiting for a worker.
    queue: StartQueue,
    /// Tasks claimed ahead waiting for their due time.
    waiting: ahead::Waiting,
    held: Arc<Held>,
    /// The reads a handler makes (kv), shared by every run.
    host: Arc<dyn TaskHost>,
    finisher: mpsc::UnboundedSender<Pending>,
    /// Signalled whenever slots are freed (reserve waits on it when the prefetch is full).
    freed: Arc<Notify>,
    /// Told by a poller that waits for room: while one does, the finisher records as it does
    /// for a quiet shard (under a steady stream it waits for groups, holding their places).
    room_wanted: Arc<Notify>,
    /// The pollers' turns at the room (one permit): they wait for it in the order they came, so
    /// no shard's poller is passed over while others claim again and again.
    turns: Arc<Semaphore>,
    /// How many pollers are waiting for room (in [`Executor::reserve`]).
    reserving: Arc<AtomicUsize>,
    /// Moving average of a run's time (µs), for the adaptive prefetch.
    run_us: AtomicU64,
    metrics: Arc<Metrics>,
    /// The door a run's follow-ups come through (admitted, counted).
    tasks: crate::tasks::Tasks,
    stopping: watch::Receiver<bool>,
}

/// What a run reads from the store (its plugin's kv entries and secrets).
pub struct StoreHost {
    pub store: Store,
}

impl TaskHost for StoreHost {
    fn kv_get<'a>(
        &'a self,
        plugin: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async move {
            self.store
                .kv_get(plugin, key)
                .await
                .map_err(|e| format!("{e:#}"))
        })
    }

    fn secret<'a>(
        &'a self,
        plugin: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async move {
            self.store
                .secret_get(plugin, name)
                .await
                .map_err(|e| format!("{e:#}"))
        })
    }
}

impl Executor {
    /// Creates the executor, with the finisher that records its outcomes and the lease keeper
    /// that renews its claims' leases, for the caller to start.
    pub fn new(
        store: Store,
        handler: Arc<dyn Handler>,
        opts: ExecutorOptions,
        metrics: Arc<Metrics>,
        stopping: watch::Receiver<bool>,
    ) -> (Arc<Self>, Finisher, LeaseKeeper) {
        let (tx, rx) = mpsc::unbounded_channel();
        let host: Arc<dyn TaskHost> = Arc::new(StoreHost {
            store: store.clone(),
        });
        let workers = opts.workers.max(1);
        let held = Arc::new(Held::default());
        let freed = Arc::new(Notify::new());
        let room_wanted = Arc::new(Notify::new());
        let reserving = Arc::new(AtomicUsize::new(0));
        let capacity = workers + opts.prefetch + headroom(workers);
        let slots = Arc::new(Semaphore::new(capacity));
        let finisher = Finisher::new(
            rx,
            store.clone(),
            Arc::clone(&held),
            Arc::clone(&metrics),
            Arc::clone(&freed),
            (Arc::clone(&room_wanted), Arc::clone(&reserving)),
        );
        let keeper = LeaseKeeper {
            store: store.clone(),
            held: Arc::clone(&held),
            slots: Arc::clone(&slots),
            capacity,
            lease_ms: opts.lease_ms,
            stopping: stopping.clone(),
        };
        let exec = Arc::new(Executor {
            tasks: crate::tasks::Tasks::new(store.clone(), Arc::clone(&metrics)),
            store,
            handler,
            slots,
            shares: Arc::default(),
            running: Arc::new(Semaphore::new(workers)),
            queue: StartQueue::new(workers),
            waiting: ahead::Waiting::default(),
            opts,
            held,
            host,
            finisher: tx,
            freed,
            room_wanted,
            turns: Arc::new(Semaphore::new(1)),
            reserving,
            run_us: AtomicU64::new(1_000),
            metrics,
            stopping,
        });
        (exec, finisher, keeper)
    }

    fn capacity(&self) -> usize {
        let workers = self.opts.workers.max(1);
        workers + self.opts.prefetch + headroom(workers)
    }

    /// A shard's claims are refused because Redis is out of memory (`full`), or taken again.
    pub fn redis_full(&self, full: bool) {
        self.metrics.redis_full(full);
    }

    /// The lease a claim should ask for (ms).
    pub fn lease_ms(&self) -> u64 {
        self.opts.lease_ms
    }

    /// How many tasks this runner should hold now: every worker busy, plus what the workers
    /// will start within the prefetch horizon at the recent run time.
    fn target_held(&self) -> usize {
        let workers = self.opts.workers.max(1);
        let run_us = self.run_us.load(Ordering::Relaxed).max(1);
        let prefetch = (workers as u64 * PREFETCH_HORIZON_US / run_us) as usize;
        workers + prefetch.min(self.opts.prefetch)
    }

    /// Waits for room and takes up to `max` slots: as many as bring the tasks held up to
    /// [`Self::target_held`]. Under load it waits for a useful amount (an eighth of the target)
    /// so claims stay batched; when idle that much is free at once. None once closed.
    ///
    /// The pollers of the shards take turns at the room, in the order they asked (`turns`):
    /// woken all at once when room frees, the one that claimed last would otherwise run first
    /// and claim again (the runtime starts the task it woke last first), and a shard whose
    /// poller keeps losing waits with its due tasks while others claim. A poller keeps its place
    /// in the line for as long as it waits, so the shards of a backlog claim in rotation and
    /// another owner's task due in one of them waits a round of claims, not several; and while
    /// others wait, a claim takes an eighth of the target at most, so a round is short.
    ///
    /// With `headroom` (the shard has due tasks that were not set aside) while one plugin is
    /// crowding the runner, it takes a few slots more at once when there is no other room
    /// (beyond the target, within the capacity), out of turn: a claim gives those places only
    /// to plugins under their part. So another plugin's task due behind a slow backlog is
    /// claimed when due, and starts on a worker of its plugin's share (see `share`). Out of
    /// turn it takes the headroom alone, never the room the line is waiting for.
    pub async fn reserve(&self, max: usize, headroom: bool) -> Option<Reservation> {
        let max = max.max(1);
        // (counted while it waits here, also when the wait is dropped for the next due time)
        let _counted = Counted::new(&self.reserving);
        let mut turn = None;
        // this poller's place in the line: asked once and kept while it waits for room (asked
        // again at each wake-up, it went to the back of the line each time room freed)
        let in_line = Arc::clone(&self.turns).acquire_owned();
        tokio::pin!(in_line);
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if turn.is_none()
                && let Some(t) = in_line.as_mut().now_or_never()
            {
                turn = Some(t.ok()?);
            }
            let held = self.capacity() - self.slots.available_permits();
            let target = self.target_held();
            // while other shards' pollers wait in line, a claim takes an eighth of the target,
            // so the line goes round within about two prefetch horizons and a task due in any
            // of those shards waits about that long, not sixteen claims of a whole batch
            let per_claim = if self.reserving.load(Ordering::Relaxed) > 1 {
                (target / 8).max(1)
            } else {
                max
            };
            let room = target.saturating_sub(held).min(max).min(per_claim);
            let reservation = |permits, spare| Reservation {
                permits,
                freed: Arc::clone(&self.freed),
                headroom: spare,
            };
            if turn.is_some()
                && room >= (target / 8).clamp(1, max)
                && let Ok(p) = Arc::clone(&self.slots).try_acquire_many_owned(room as u32)
            {
                return Some(reservation(p, 0));
            }
            // out of turn, the headroom alone: the room is the turn's
            let with_room = if turn.is_some() { room } else { 0 };
            let with_headroom = (with_room + self::headroom(self.opts.workers.max(1)))
                .min(max)
                .min(self.slots.available_permits());
            if headroom
                && with_headroom > with_room
                && self.crowded()
                && let Ok(p) = Arc::clone(&self.slots).try_acquire_many_owned(with_headroom as u32)
            {
                return Some(reservation(p, with_headroom - with_room));
            }
            if self.slots.is_closed() {
                return None;
            }
            // (headroom needs no turn: it is for other plugins' tasks, whose shards should not
            // wait behind the pollers of the plugin crowding the runner)
            self.room_wanted.notify_one();
            if turn.is_some() {
                freed.await;
            } else {
                tokio::select! {
                    () = &mut freed => {}
                    t = in_line.as_mut() => turn = Some(t.ok()?),
                }
            }
        }
    }

    /// Starts the claimed tasks, each holding one slot of the reservation; returns at once.
    /// A free worker starts a task of the plugin with the fewest runs going, the earliest
    /// claimed of it (claims return a plugin's tasks in due order); a task claimed ahead (due
    /// after `now`, the claim's Redis time in ms and the µs past it) waits for its due time
    /// first (see `ahead`).
    /// `sent`: when the claim's request was sent (its leases run at least a lease from then).
    pub fn submit(
        self: &Arc<Self>,
        tasks: Vec<Claimed>,
        mut res: Reservation,
        sent: Instant,
        now: (i64, u16),
    ) {
        let answered = Instant::now();
        if let Some(first) = tasks.first() {
            self.metrics.observe_claims(first.shard, tasks.len() as u64);
        }
        let mut later = Vec::new();
        let mut queue = self.queue.lock();
        for task in tasks {
            let Some(permit) = res.permits.split(1) else {
                // more tasks than slots can't happen (claims ask for res.len()); be safe anyway
                warn!(id = %task.id, "claimed more tasks than reserved; it runs again after its lease");
                continue;
            };
            self.held.insert(&task, sent);
            let slot = Slot::new(permit, &task.plugin, &self.shares);
            if task.due > now.0 {
                later.push((task, slot));
            } else {
                queue.push(task, slot);
            }
        }
        drop(queue);
        self.start_when_due(later, now, answered);
        self.start_waiting();
    }

    /// Runs one task on `rt` with its worker; its outcome goes to the finisher.
    fn start(
        self: &Arc<Self>,
        rt: &tokio::runtime::Handle,
        task: Claimed,
        slot: Slot,
        worker: OwnedSemaphorePermit,
    ) {
        let this = Arc::clone(self);
        // debug level: an info span per task costs the log subscriber real work at load
        let span =
            debug_span!("task", id = %task.id, plugin = %task.plugin, attempt = task.attempt);
        // the trace span (exported only with --otlp-endpoint; else disabled and free)
        let traced = info_span!(target: trace::TARGET, "task.run",
            task.id = %task.id, task.plugin = %task.plugin, task.attempt = task.attempt,
            task.shard = task.shard, claim = task.token);
        trace::set_parent(&traced, task.traceparent.as_deref());
        tracing::info!(target: trace::TARGET, parent: &traced,
            lateness_ms = self.store.clock().now_ms() - task.due, "claimed");
        rt.spawn(
            async move {
                this.metrics.running(1.0);
                // a panic in the run (a bug of the handler's host) fails this attempt, as a
                // trap does, instead of leaving the claim held and renewed for good
                // set once the run's kv writes and events are committed under its marker
                let mut notes = RunNotes::default();
                let outcome =
                    std::panic::AssertUnwindSafe(this.run_to_outcome(&task, &traced, &mut notes))
                        .catch_unwind()
                        .await
                        .unwrap_or_else(|panic| {
                            let why = panic_message(panic.as_ref());
                            warn!(id = %task.id, plugin = %task.plugin, "the run panicked: {why}");
                            Some(
                                this.retry(&task, format!("the runner panicked running it: {why}")),
                            )
                        });
                this.metrics.running(-1.0);
                drop(worker);
                this.queue.lock().ended(&task.plugin);
                this.start_waiting();
                match outcome {
                    Some(finish) => {
                        let log = notes.log.stored(task.attempt);
                        let bytes = task.payload.len()
                            + task.event.as_ref().map_or(0, String::len)
                            + log.as_ref().map_or(0, String::len);
                        let _ = this.finisher.send(Pending {
                            bytes,
                            shard: task.shard,
                            id: task.id,
                            token: task.token,
                            attempt: task.attempt,
                            plugin: task.plugin,
                            finish,
                            marker: notes.marked.then_some(task.effects_claim),
                            log,
                            slot_wait: notes.slot_wait,
                            traced,
                            _slot: slot,
                        });
                    }
                    None => {
                        this.held.remove(task.shard, &task.id, task.token);
                        drop(slot);
                        this.freed.notify_waiters();
                    }
                }
            }
            .instrument(span),
        );
    }

    /// Waits until every claimed task has been recorded (or `limit` passed); true when all did.
    pub async fn drain(&self, limit: Duration) -> bool {
        let all = self.capacity() as u32;
        tokio::time::timeout(limit, self.slots.acquire_many(all))
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effects_with_only_reads_write_nothing() {
        let mut fx = Effects::default();
        fx.ns.reads.push(eggtimer_store::KvRead {
            key: "k".into(),
            sha1: None,
        });
        assert!(fx.writes_nothing());
        fx.cancel.push("x".into());
        assert!(!fx.writes_nothing());
    }
}
