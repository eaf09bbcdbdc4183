//! The finisher: records outcomes, buffered per shard and group-committed, one finish script per
//! shard per recording.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tracing::{debug, info_span, warn};

use super::held::Held;
use super::{FINISH_GROUP, FINISH_WAIT};
use crate::metrics::Metrics;
use crate::pace::Pace;
use crate::trace;
use eggtimer_store::{Finish, Finished, Store};

/// An outcome waiting for the finisher; its slot is freed once it is recorded.
pub(super) struct Pending {
    pub(super) shard: u32,
    pub(super) id: String,
    pub(super) token: u64,
    pub(super) attempt: u32,
    pub(super) plugin: String,
    pub(super) finish: Finish,
    /// The claim whose marker the run's kv writes and events were committed under (None: it
    /// committed none): once the outcome is recorded the marker is dropped.
    pub(super) marker: Option<u64>,
    /// The log lines of the run, as the task keeps them (None: it logged nothing, or it did not
    /// run).
    pub(super) log: Option<String>,
    /// Put back to wait for a concurrency slot: it joins the runs waiting once that is recorded.
    pub(super) slot_wait: Option<super::limits::SlotWait>,
    /// The task's trace span: it ends once the outcome is recorded.
    pub(super) traced: tracing::Span,
    pub(super) _slot: super::Slot,
    /// About the bytes its record holds (payload, event) and its log: what recording its
    /// outcome copies in Redis.
    pub(super) bytes: usize,
}

/// About the most bytes of records and logs one finish script takes (a call takes one task past
/// it): 256 outcomes of tasks of 60 KB were one call of 15–30 ms, 1 MiB of them 8–11 ms.
const FINISH_CALL_BYTES: usize = 256 << 10;

/// A group cut into the calls of the finish script that record it, in order.
fn finish_calls(group: &[Pending]) -> Vec<&[Pending]> {
    let mut calls = Vec::new();
    let (mut from, mut bytes) = (0, 0);
    for (i, p) in group.iter().enumerate() {
        if i > from && bytes + p.bytes > FINISH_CALL_BYTES {
            calls.push(&group[from..i]);
            (from, bytes) = (i, 0);
        }
        bytes += p.bytes;
    }
    if from < group.len() {
        calls.push(&group[from..]);
    }
    calls
}

/// Records the executor's outcomes: started by the runner, it ends once the executor is gone
/// (every sender dropped) and what it received is recorded.
pub struct Finisher {
    rx: mpsc::UnboundedReceiver<Pending>,
    recorder: Arc<Recorder>,
    /// Told when a poller waits for room, and how many do (the executor's count): while one does,
    /// no shard waits for a steady group.
    room_wanted: (Arc<Notify>, Arc<std::sync::atomic::AtomicUsize>),
}

/// About how many outcomes of a shard a recording waits for under a steady stream: a finish
/// script costs Redis mostly its fixed cost.
const STEADY_GROUP: f64 = 32.0;
/// The longest a shard's outcomes wait for such a group (its tasks' places are held meanwhile;
/// a poller waiting for room has them recorded at once).
const STEADY_WAIT: Duration = Duration::from_millis(40);

/// How long a shard's buffer may wait before it is recorded, by its pace: None while the shard
/// is quiet or a poller waits for room (`starved`: recorded when no recording is in flight, else
/// within [`FINISH_WAIT`]); under a steady stream, as long as about [`STEADY_GROUP`] outcomes
/// take to come, at most [`STEADY_WAIT`].
fn steady_wait(pace: Option<&Pace>, starved: bool) -> Option<Duration> {
    if starved {
        return None;
    }
    let ms = pace?.window_ms(STEADY_GROUP, STEADY_WAIT)?;
    Some(Duration::from_millis(ms).max(FINISH_WAIT))
}

/// What recording a group of outcomes needs (shared by the recordings in flight).
struct Recorder {
    store: Store,
    held: Arc<Held>,
    metrics: Arc<Metrics>,
    /// Told when recorded tasks' slots are free (pollers waiting for room wake).
    freed: Arc<Notify>,
}

impl Finisher {
    pub(super) fn new(
        rx: mpsc::UnboundedReceiver<Pending>,
        store: Store,
        held: Arc<Held>,
        metrics: Arc<Metrics>,
        freed: Arc<Notify>,
        room_wanted: (Arc<Notify>, Arc<std::sync::atomic::AtomicUsize>),
    ) -> Finisher {
        Finisher {
            room_wanted,
            rx,
            recorder: Arc::new(Recorder {
                store,
                held,
                metrics,
                freed,
            }),
        }
    }

    /// Records outcomes as they come, buffered per shard (group commit). A quiet shard's buffer
    /// is recorded at once when no recording is in flight, else when it holds [`FINISH_GROUP`]
    /// outcomes or its oldest has waited [`FINISH_WAIT`]; a shard under a steady stream waits
    /// for a group instead (see [`steady_wait`]), unless a poller waits for room (the places
    /// the group holds). Each recording is one finish script; shards are recorded concurrently.
    pub async fn run(self) {
        let Finisher {
            mut rx,
            recorder,
            room_wanted: (woken, waiting),
        } = self;
        let mut bufs: HashMap<u32, (Instant, Vec<Pending>)> = HashMap::new();
        let mut paces: HashMap<u32, Pace> = HashMap::new();
        let recording = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        loop {
            let starved = waiting.load(Ordering::Relaxed) > 0;
            let due = bufs
                .iter()
                .map(|(shard, (since, _))| {
                    *since + steady_wait(paces.get(shard), starved).unwrap_or(FINISH_WAIT)
                })
                .min();
            let recv = async {
                match due {
                    Some(d) => tokio::time::timeout_at(d, rx.recv()).await.ok(),
                    None => Some(rx.recv().await),
                }
            };
            let got = tokio::select! {
                got = recv => got,
                () = woken.notified() => None,
            };
            let closed = matches!(got, Some(None));
            let mut push = |p: Pending| {
                paces.entry(p.shard).or_default().note(1);
                bufs.entry(p.shard)
                    .or_insert_with(|| (Instant::now(), Vec::new()))
                    .1
                    .push(p)
            };
            if let Some(Some(p)) = got {
                push(p);
            }
            while let Ok(p) = rx.try_recv() {
                push(p);
            }
            let now = Instant::now();
            let idle = recording.load(Ordering::Acquire) == 0;
            // (read again: a poller may have begun waiting for room meanwhile)
            let starved = waiting.load(Ordering::Relaxed) > 0;
            let ready: Vec<u32> = bufs
                .iter()
                .filter(|(shard, (since, b))| {
                    let steady = steady_wait(paces.get(shard), starved);
                    (idle && steady.is_none())
                        || closed
                        || b.len() >= FINISH_GROUP
                        || *since + steady.unwrap_or(FINISH_WAIT) <= now
                })
                .map(|(s, _)| *s)
                .collect();
            for shard in ready {
                let (_, group) = bufs.remove(&shard).expect("listed");
                let this = Arc::clone(&recorder);
                let recording = Arc::clone(&recording);
                recording.fetch_add(1, Ordering::AcqRel);
                tokio::spawn(async move {
                    this.record(shard, group).await;
                    recording.fetch_sub(1, Ordering::AcqRel);
                    // the recorded tasks' slots are free: wake pollers waiting for room
                    this.freed.notify_waiters();
                });
            }
            if closed {
                return;
            }
        }
    }
}

impl Recorder {
    /// The outcomes recorded end their tasks' rerun chains: the markers their effects were
    /// committed under are dropped (a few seconds later, for a runner stalled between its claim
    /// check and its commit; until then they still keep its effects from landing twice).
    async fn drop_markers(&self, markers: Vec<(String, u64)>) {
        let refs: Vec<(&str, u64)> = markers.iter().map(|(id, m)| (id.as_str(), *m)).collect();
        if let Err(e) = self.store.expire_markers(&refs).await {
            debug!("dropping effect markers failed (they expire on their own): {e:#}");
        }
    }

    async fn record(&self, shard: u32, mut group: Vec<Pending>) {
        let spans = finish_spans(&group);
        let verdicts = self.finish(shard, &group).await;
        self.report(&group, &verdicts, &spans);
        // the markers of the runs recorded (not of those refused or given back)
        let markers: Vec<(String, u64)> = group
            .iter()
            .zip(&verdicts)
            .filter(|(_, v)| !matches!(v, Finished::Stale | Finished::Release | Finished::Defer))
            .filter_map(|(p, _)| Some((p.id.clone(), p.marker?)))
            .collect();
        for p in &group {
            self.held.remove(shard, &p.id, p.token);
        }
        // runs put back for a slot wait among that limit's runs (a run not recorded as put back
        // is not waiting)
        let waits: Vec<super::limits::SlotWait> = group
            .iter_mut()
            .zip(&verdicts)
            .filter(|(_, v)| **v == Finished::Defer)
            .filter_map(|(p, _)| p.slot_wait.take())
            .collect();
        // dropping `group` frees the slots: before the markers' round trip, if there is one
        drop(group);
        if !markers.is_empty() {
            self.freed.notify_waiters();
            self.drop_markers(markers).await;
        }
        for w in waits {
            w.enter(&self.store).await;
        }
    }

    /// Records the group's outcomes, in calls of the finish script of about FINISH_CALL_BYTES
    /// (one call for a group of small tasks): the verdicts of the first calls that were
    /// recorded, in order (a call Redis could not take ends them: the leases of the rest expire
    /// and those tasks run again).
    async fn finish(&self, shard: u32, group: &[Pending]) -> Vec<Finished> {
        let mut verdicts = Vec::with_capacity(group.len());
        for call in finish_calls(group) {
            let got = self.finish_call(shard, call).await;
            let whole = got.len() == call.len();
            verdicts.extend(got);
            if !whole {
                break;
            }
        }
        verdicts
    }

    /// Records outcomes with one finish script, tried up to five times: the verdict of each, or
    /// none when Redis could not be reached (the leases expire and the tasks run again). A
    /// finish that was applied but whose answer was lost answers `stale` when sent again (the
    /// claim is over): retrying is safe.
    async fn finish_call(&self, shard: u32, group: &[Pending]) -> Vec<Finished> {
        let items: Vec<(&str, u64, &Finish)> = group
            .iter()
            .map(|p| (p.id.as_str(), p.token, &p.finish))
            .collect();
        let logs: Vec<(&str, &str)> = group
            .iter()
            .filter_map(|p| Some((p.id.as_str(), p.log.as_deref()?)))
            .collect();
        let mut delay = Duration::from_millis(50);
        let mut tries = 0;
        loop {
            match self.store.finish_logged(shard, &items, &logs).await {
                Ok(v) => return v,
                Err(e) if tries < 4 => {
                    warn!(
                        shard,
                        "recording outcomes failed, retrying in {delay:?}: {e:#}"
                    );
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                    tries += 1;
                }
                Err(e) => {
                    warn!(
                        shard,
                        "recording outcomes failed; the leases will expire and the tasks run again: {e:#}"
                    );
                    return Vec::new();
                }
            }
        }
    }

    /// The verdicts in the tasks' spans, metrics and log.
    fn report(&self, group: &[Pending], verdicts: &[Finished], spans: &[tracing::Span]) {
        for (s, v) in spans.iter().zip(verdicts) {
            s.record("outcome", tracing::field::debug(v));
        }
        self.metrics.observe_finishes(
            group
                .iter()
                .zip(verdicts)
                .map(|(p, v)| (p.plugin.as_str(), *v)),
        );
        for (p, v) in group.iter().zip(verdicts) {
            if *v == Finished::Stale {
                warn!(id = %p.id, attempt = p.attempt, "outcome refused: the claim was lost");
            } else {
                debug!(id = %p.id, attempt = p.attempt, ?v, "recorded");
            }
        }
    }
}

/// A span per outcome, only when traces are exported (no allocation per group otherwise).
fn finish_spans(group: &[Pending]) -> Vec<tracing::Span> {
    if !tracing::enabled!(target: trace::TARGET, tracing::Level::INFO) {
        return Vec::new();
    }
    group
        .iter()
        .map(|p| info_span!(target: trace::TARGET, parent: &p.traced, "task.finish", outcome = tracing::field::Empty))
        .collect()
}
