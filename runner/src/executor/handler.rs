//! What a handler is: the seam between the executor and whatever runs a task (the wasm plugin
//! host, or a native handler in tests and benchmarks), and what a run returns.

use std::sync::Arc;

use futures::future::BoxFuture;

use eggtimer_store::{AttemptLog, Claimed, NewTask, NsEffects};

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

/// The effects a handler asked for, committed before its outcome is recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Effects {
    /// Follow-up tasks, created only if their (derived) id does not exist yet.
    pub schedule: Vec<NewTask>,
    /// Ids of tasks to cancel (only tasks of the same plugin, or of one `cancel_also` covers,
    /// are cancelled).
    pub cancel: Vec<String>,
    /// Plugin patterns whose tasks the cancels may also touch (the plugin's `may_schedule`).
    pub cancel_also: Option<std::sync::Arc<[String]>>,
    /// kv reads (checked at commit), kv writes and events.
    pub ns: NsEffects,
}

impl Effects {
    /// Whether there is anything to write (reads alone are not).
    pub fn writes_nothing(&self) -> bool {
        self.schedule.is_empty()
            && self.cancel.is_empty()
            && self.ns.kv.is_empty()
            && self.ns.events.is_empty()
    }

    /// Bytes written: kv values, events and follow-up payloads (for the effect-bytes metric).
    pub fn bytes(&self) -> u64 {
        let kv: usize = self
            .ns
            .kv
            .iter()
            .map(|w| match w {
                eggtimer_store::KvWrite::Set { key, value, .. } => key.len() + value.len(),
                eggtimer_store::KvWrite::Delete { key } => key.len(),
            })
            .sum();
        let events: usize = self.ns.events.iter().map(|(t, d)| t.len() + d.len()).sum();
        let follow: usize = self.schedule.iter().map(|t| t.payload.len()).sum();
        (kv + events + follow) as u64
    }
}

/// One run of a handler.
#[derive(Debug)]
pub struct Run {
    /// `Err` is a failure of the run itself (trap, timeout, unknown plugin, over budget): retried
    /// with backoff; its effects are dropped.
    pub outcome: Result<Outcome, String>,
    pub effects: Effects,
    /// What the plugin logged and printed (kept with the task, whatever the outcome).
    pub log: AttemptLog,
}

impl Run {
    /// A run that failed before it could decide anything (retried with backoff).
    pub fn failed(error: impl Into<String>) -> Run {
        Run {
            outcome: Err(error.into()),
            effects: Effects::default(),
            log: AttemptLog::default(),
        }
    }

    /// A run with an outcome and no effects.
    pub fn outcome(outcome: Outcome) -> Run {
        Run {
            outcome: Ok(outcome),
            effects: Effects::default(),
            log: AttemptLog::default(),
        }
    }

    /// This run with the lines its plugin logged.
    pub fn logged(self, log: AttemptLog) -> Run {
        Run { log, ..self }
    }
}

/// Reads a handler may make while it runs.
pub trait TaskHost: Send + Sync {
    /// One entry of the plugin's key-value store.
    fn kv_get<'a>(
        &'a self,
        plugin: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>>;

    /// One of the plugin's secrets, opened (None: it has none of that name).
    fn secret<'a>(
        &'a self,
        _plugin: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async { Err("this host keeps no secrets".to_owned()) })
    }
}

/// Runs tasks. The future must end (the wasm host bounds every call by its time limit).
pub trait Handler: Send + Sync + 'static {
    fn handle(self: Arc<Self>, task: Claimed, host: Arc<dyn TaskHost>) -> BoxFuture<'static, Run>;

    /// The runtime each task's run is spawned on (None: the caller's). The wasm host has its own,
    /// so guest code never runs on the threads of the pollers, the API and the finisher.
    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        None
    }

    /// Whether this runner has `plugin` loaded (false: its tasks can't run here yet).
    fn has_plugin(&self, _plugin: &str) -> bool {
        true
    }
}

impl<F> Handler for F
where
    F: Fn(&Claimed, &Arc<dyn TaskHost>) -> Run + Send + Sync + 'static,
{
    fn handle(self: Arc<Self>, task: Claimed, host: Arc<dyn TaskHost>) -> BoxFuture<'static, Run> {
        Box::pin(std::future::ready(self(&task, &host)))
    }
}
