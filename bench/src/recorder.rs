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
}

impl Recorder {
    pub fn new(plugins: Arc<Plugins>, n: usize) -> Arc<Recorder> {
        Arc::new(Recorder {
            plugins,
            starts: (0..n).map(|_| AtomicI64::new(0)).collect(),
            runs: (0..n).map(|_| AtomicU32::new(0)).collect(),
        })
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
