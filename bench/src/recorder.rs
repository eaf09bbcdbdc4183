//! A handler in front of the real plugin host that notes, for every bench task (`b<i>`), when its
//! handler started (µs, this process's clock) and how many times it ran, so lateness, missing and
//! duplicate tasks are counted exactly. Due times are written by this process too, so both sides
//! use one clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use eggtimer::executor::{Handler, Run, TaskHost};
use eggtimer::plugins::Plugins;
use eggtimer::store::Claimed;
use futures::future::BoxFuture;

use crate::report::Outcomes;

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

pub struct Recorder {
    plugins: Arc<Plugins>,
    starts: Vec<AtomicI64>,
    runs: Vec<AtomicU32>,
    /// W9: runs of each listening task `e<i>`, and when each run that an event started began
    /// after the event arrived (ms).
    event_runs: Vec<AtomicU32>,
    event_ms: std::sync::Mutex<Vec<f64>>,
}

impl Recorder {
    pub fn new(plugins: Arc<Plugins>, n: usize) -> Arc<Recorder> {
        Self::with_events(plugins, n, 0)
    }

    /// A recorder that also notes the runs of `m` listening tasks `e<i>` (W9).
    pub fn with_events(plugins: Arc<Plugins>, n: usize, m: usize) -> Arc<Recorder> {
        Arc::new(Recorder {
            plugins,
            starts: (0..n).map(|_| AtomicI64::new(0)).collect(),
            runs: (0..n).map(|_| AtomicU32::new(0)).collect(),
            event_runs: (0..m).map(|_| AtomicU32::new(0)).collect(),
            event_ms: Default::default(),
        })
    }

    /// Of the first `sent` listening tasks (those an event was sent for): the sorted times from
    /// event to start (ms) of the runs events started, how many of the `run` ones (odd) ran, and
    /// how many ran more than once.
    pub fn event_runs(&self, sent: usize) -> (Vec<f64>, u64, u64) {
        let mut ms = self
            .event_ms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        ms.sort_by(|a, b| a.total_cmp(b));
        let (mut ran, mut twice) = (0, 0);
        for r in self.event_runs.iter().take(sent) {
            let k = r.load(Ordering::Relaxed);
            ran += u64::from(k > 0);
            twice += u64::from(k > 1);
        }
        (ms, ran, twice)
    }

    /// When task `b<i>` first started (µs), if it ran.
    pub fn start_us(&self, i: usize) -> Option<i64> {
        (self.runs.get(i)?.load(Ordering::Relaxed) > 0)
            .then(|| self.starts[i].load(Ordering::Relaxed))
    }

    /// Whether every task ran at least once.
    pub fn all_ran(&self) -> bool {
        self.runs.iter().all(|r| r.load(Ordering::Relaxed) > 0)
    }
}

impl Handler for Recorder {
    fn handle(self: Arc<Self>, task: Claimed, host: Arc<dyn TaskHost>) -> BoxFuture<'static, Run> {
        let started = now_us();
        if let Some(i) = task
            .task_id()
            .strip_prefix('b')
            .and_then(|s| s.parse::<usize>().ok())
            && i < self.runs.len()
            && self.runs[i].fetch_add(1, Ordering::Relaxed) == 0
        {
            self.starts[i].store(started, Ordering::Relaxed);
        }
        if let Some(i) = task
            .task_id()
            .strip_prefix('e')
            .and_then(|s| s.parse::<usize>().ok())
            && i < self.event_runs.len()
        {
            self.event_runs[i].fetch_add(1, Ordering::Relaxed);
            let at = task
                .event
                .as_deref()
                .and_then(|e| serde_json::from_str::<serde_json::Value>(e).ok())
                .and_then(|e| e["at"].as_f64());
            if let Some(at) = at {
                let ms = started as f64 / 1000.0 - at;
                self.event_ms
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(ms);
            }
        }
        Arc::clone(&self.plugins).handle(task, host)
    }

    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.plugins.runtime()
    }
}

/// What the recorder saw of tasks due at `dues` (task `b<i>` due at `dues[i]`).
pub struct Counts {
    pub outcomes: Outcomes,
    /// Sorted, ms.
    pub lateness_ms: Vec<f64>,
    pub first_start_us: i64,
    pub last_start_us: i64,
}

pub fn count(rec: &Recorder, dues: &[i64]) -> Counts {
    let mut c = Counts {
        outcomes: Outcomes {
            executed: 0,
            missing: 0,
            duplicates: 0,
            early: 0,
        },
        lateness_ms: Vec::with_capacity(dues.len()),
        first_start_us: i64::MAX,
        last_start_us: 0,
    };
    for (i, due) in dues.iter().enumerate() {
        let runs = rec.runs[i].load(Ordering::Relaxed) as usize;
        if runs == 0 {
            c.outcomes.missing += 1;
            continue;
        }
        c.outcomes.executed += 1;
        c.outcomes.duplicates += runs - 1;
        let s = rec.starts[i].load(Ordering::Relaxed);
        c.first_start_us = c.first_start_us.min(s);
        c.last_start_us = c.last_start_us.max(s);
        let late = s as f64 / 1000.0 - *due as f64;
        if late < 0.0 {
            c.outcomes.early += 1;
        }
        c.lateness_ms.push(late);
    }
    c.lateness_ms.sort_by(|a, b| a.total_cmp(b));
    c
}
