//! The task service: the one door every task comes through, whoever brings it.
//!
//! A request's batch, a debounced spec, a run's follow-ups and a recurring schedule's firing are
//! each one function here, and each does the same things in the same order: what the caller may
//! touch, whether the plugins exist, what their code says of the payloads, admission against
//! every budget (`max_pending`, the team's task bytes), the write, and the count. Nothing else
//! admits or writes a new task, so a new way in gets its limits by calling one of these; the
//! quota bypass a debounce once had (it returned before admission) can't be written again.
//!
//! Changes to tasks that exist (move, run now, cancel, retry, drop; an owner's or a plugin's tasks
//! at once) are here too, in [`changes`]: each finds the task the caller names among the plugins
//! its key may see and changes it in one script. So is a caller's publish, in [`events`]: the
//! events it may publish, within its key's budget, make the tasks listening for them act.
//!
//! The service speaks in [`Refusal`]s, not HTTP: the API turns them into its error replies, the
//! executor into a failed attempt, the recurring driver into a skipped firing.

mod changes;
mod events;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::metrics::Metrics;
use eggtimer_base::access::Caller;
use eggtimer_store::{
    Debounced, Met, NewTask, NotAdmitted, Refused, ScheduleMode, Scheduled, Store,
};

pub use changes::{Named, OwnerPauses};

/// How long follow-ups wait between tries while Redis is out of memory.
const FULL_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

/// One verdict per payload: `None` fits, `Some(message)` does not.
pub type Verdicts = Vec<Option<String>>;

/// Why a plugin's code could not say whether payloads fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unchecked {
    /// No check slot came free in time (try again); the message says how long it waited.
    Busy(String),
    /// The plugin's check trapped or ran past its time limit.
    Failed(String),
}

/// What the service asks of the plugins a runner serves (the plugin registry answers).
pub trait PluginChecks: Send + Sync {
    /// Whether a plugin of this name exists (loaded here, or stored).
    fn exists<'a>(&'a self, name: &'a str) -> BoxFuture<'a, anyhow::Result<bool>>;
    /// The plugins loaded here (from `--plugins-dir`), stored or not.
    fn loaded(&self) -> Vec<String>;
    /// What the current version of `plugin` says of each payload (a plugin without a check
    /// takes any).
    fn check<'a>(
        &'a self,
        plugin: &'a str,
        payloads: Vec<String>,
    ) -> BoxFuture<'a, Result<Verdicts, Unchecked>>;
}

/// Why a task was not scheduled or changed; nothing of its batch was written.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The caller's key does not cover the plugin.
    #[error("{at}{why}; nothing was scheduled")]
    OutOfScope {
        at: String,
        plugin: String,
        why: String,
    },
    #[error(
        "{at}no plugin named {plugin:?}; upload it with PUT /v1/plugins/{plugin}; nothing was scheduled"
    )]
    UnknownPlugin { at: String, plugin: String },
    /// The caller's key may not listen on a topic a spec's `on` names.
    #[error("{at}{why}; nothing was scheduled")]
    Topic { at: String, why: String },
    #[error("a batch is all debounced tasks or none; nothing was scheduled")]
    MixedDebounce,
    /// The plugin's code refused a payload.
    #[error("{at}: {message} (plugin {plugin:?} can't read it); {what}")]
    InvalidPayload {
        at: String,
        plugin: String,
        message: String,
        what: &'static str,
    },
    /// The plugin's code could not be asked.
    #[error("{}", match why {
        Unchecked::Busy(m) => m.clone(),
        Unchecked::Failed(m) => format!("{at}: plugin {plugin:?} could not check it: {m}; {what}"),
    })]
    Unchecked {
        at: String,
        plugin: String,
        why: Unchecked,
        what: &'static str,
    },
    /// A budget would be passed: the plugin's `max_pending` or its team's task bytes.
    #[error("{0}")]
    NotAdmitted(NotAdmitted),
    #[error(
        "{at}task {id:?} finished within its unique_for_ms window, so scheduling it again is a duplicate; nothing was scheduled"
    )]
    Duplicate { at: String, id: String },
    #[error("{at}task {id:?} is running, so it can't be replaced; nothing was scheduled")]
    Running { at: String, id: String },
    #[error("task {id:?} is running and is not debounced, so it can't be replaced")]
    DebouncedRunning { id: String },
    /// The caller's key does not cover the plugin it named.
    #[error("{why}")]
    Forbidden { plugin: String, why: String },
    /// No plugin the caller may see has a task of this id.
    #[error("no task {id:?}")]
    NoTask { id: String },
    /// Plugins the caller may see each have a task of this id.
    #[error("plugins {} each have a task {id:?}; name one with ?plugin=", plugins.join(", "))]
    AmbiguousId { id: String, plugins: Vec<String> },
    /// The task's state (running, done, dead) or the time asked refuses the change.
    #[error("task {id:?}: {why}{}", if *why == Refused::OutOfRange { "; nothing moved" } else { "" })]
    Unchangeable { id: String, why: Refused },
    /// The caller's key may not publish on the topic.
    #[error("{why}")]
    NoPublish { why: String },
    /// A publish would pass the key's event budget.
    #[error(
        "key {key:?} published {used} bytes of events in the last {retention_s} s, which Redis keeps for tasks' lookback; these {bytes} more would pass its budget of {budget} bytes (the key's event_bytes, else --events-max-bytes): nothing was published"
    )]
    EventBudget {
        key: String,
        used: u64,
        bytes: u64,
        budget: u64,
        retention_s: u64,
    },
    /// A task of the owner would leave the time range; the plugins shifted before it stay so.
    #[error(
        "shift_ms {shift_ms}: a task of owner {owner:?} would leave the time range ({why}); {moved} tasks of the plugins before it moved, no others"
    )]
    ShiftOutOfRange {
        owner: String,
        shift_ms: i64,
        moved: u64,
        why: Refused,
    },
    /// Redis could not be asked or answered.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl Refusal {
    /// The plugin it concerns, where it is one that exists (the audit records it).
    pub fn plugin(&self) -> Option<&str> {
        match self {
            Refusal::OutOfScope { plugin, .. }
            | Refusal::Forbidden { plugin, .. }
            | Refusal::InvalidPayload { plugin, .. }
            | Refusal::Unchecked { plugin, .. } => Some(plugin),
            Refusal::NotAdmitted(q) => Some(q.plugin()),
            _ => None,
        }
    }
}

/// What a batch came to.
#[derive(Debug)]
pub enum Written {
    /// Scheduled; the events already there that listening tasks met.
    Tasks(Vec<Met>),
    /// Debounced: what became of each spec, in order.
    Debounced(Vec<Debounced>),
}

/// The door. Cheap to clone.
#[derive(Clone)]
pub struct Tasks {
    store: Store,
    metrics: Arc<Metrics>,
}

impl Tasks {
    pub fn new(store: Store, metrics: Arc<Metrics>) -> Tasks {
        Tasks { store, metrics }
    }

    /// Schedules a caller's batch, all or none (`single`: it was one spec, not an array, so
    /// messages name `payload`, not `[3].payload`): the plugins in the key's scope and existing
    /// (each named with its first spec), the topics its `on` names within the key's `listen`,
    /// debounced specs all or none, the payloads as each plugin's code reads them, admitted,
    /// then written and counted.
    pub async fn schedule(
        &self,
        caller: &Caller,
        plugins: &dyn PluginChecks,
        specs: &[NewTask],
        single: bool,
    ) -> Result<Written, Refusal> {
        let at = |i: usize| {
            if single {
                String::new()
            } else {
                format!("[{i}] ")
            }
        };
        let mut seen = HashSet::new();
        for (i, t) in specs.iter().enumerate() {
            if !seen.insert(t.plugin.as_str()) {
                continue;
            }
            if let Some(why) = caller.refuses(&t.plugin) {
                return Err(Refusal::OutOfScope {
                    at: at(i),
                    plugin: t.plugin.clone(),
                    why,
                });
            }
            if !plugins.exists(&t.plugin).await? {
                return Err(Refusal::UnknownPlugin {
                    at: at(i),
                    plugin: t.plugin.clone(),
                });
            }
        }
        for (i, t) in specs.iter().enumerate() {
            if let Some(why) =
                t.on.iter()
                    .find_map(|l| caller.refuses_topic(&l.topic, false))
            {
                return Err(Refusal::Topic { at: at(i), why });
            }
        }
        let debounced = specs.iter().filter(|t| t.debounce.is_some()).count();
        if debounced > 0 && debounced < specs.len() {
            return Err(Refusal::MixedDebounce);
        }
        let items: Vec<(&str, &str)> = specs
            .iter()
            .map(|t| (t.plugin.as_str(), t.payload.as_str()))
            .collect();
        self.check_payloads(plugins, &items, single, "nothing was scheduled")
            .await?;
        if debounced > 0 {
            let verdicts = self.admitted(specs, self.store.debounce(specs)).await??;
            if let Some(i) = verdicts.iter().position(|v| *v == Debounced::Running) {
                return Err(Refusal::DebouncedRunning {
                    id: specs[i].id.clone(),
                });
            }
            return Ok(Written::Debounced(verdicts));
        }
        let met = match self
            .admitted(specs, self.store.schedule_all_or_none(specs))
            .await??
        {
            Ok(met) => met,
            Err((i, Scheduled::Duplicate)) => {
                return Err(Refusal::Duplicate {
                    at: at(i),
                    id: specs[i].id.clone(),
                });
            }
            Err((i, _)) => {
                return Err(Refusal::Running {
                    at: at(i),
                    id: specs[i].id.clone(),
                });
            }
        };
        self.count(specs);
        Ok(Written::Tasks(met))
    }

    /// Each (plugin, payload) asked of its plugin's current version, one call per plugin; the
    /// first refused by place is the refusal (`what` says what was not done).
    pub async fn check_payloads(
        &self,
        plugins: &dyn PluginChecks,
        items: &[(&str, &str)],
        single: bool,
        what: &'static str,
    ) -> Result<(), Refusal> {
        let mut by_plugin: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
        for (i, (plugin, _)) in items.iter().enumerate() {
            by_plugin.entry(plugin).or_default().push(i);
        }
        let at = |i: usize| {
            if single {
                "payload".to_owned()
            } else {
                format!("[{i}].payload")
            }
        };
        let mut refused: Option<(usize, String)> = None;
        for (plugin, idx) in by_plugin {
            let payloads = idx.iter().map(|&i| items[i].1.to_owned()).collect();
            let verdicts =
                plugins
                    .check(plugin, payloads)
                    .await
                    .map_err(|why| Refusal::Unchecked {
                        at: at(idx[0]),
                        plugin: plugin.to_owned(),
                        why,
                        what,
                    })?;
            if let Some((i, m)) = idx
                .iter()
                .zip(verdicts)
                .find_map(|(&i, v)| v.map(|m| (i, m)))
                && refused.as_ref().is_none_or(|(j, _)| i < *j)
            {
                refused = Some((i, m));
            }
        }
        match refused {
            None => Ok(()),
            Some((i, message)) => Err(Refusal::InvalidPayload {
                at: at(i),
                plugin: items[i].0.to_owned(),
                message,
                what,
            }),
        }
    }

    /// Admits `tasks` against every budget, then awaits `write` (which writes them, and may
    /// write more: a run's effects), then marks them written. Nothing is written when they are
    /// not admitted. Every new task passes here.
    pub async fn admitted<T>(
        &self,
        tasks: &[NewTask],
        write: impl Future<Output = T>,
    ) -> Result<T, Refusal> {
        if tasks.is_empty() {
            return Ok(write.await);
        }
        let admitted = self
            .store
            .admit(tasks)
            .await?
            .map_err(Refusal::NotAdmitted)?;
        let written = write.await;
        self.store.landed(admitted).await;
        Ok(written)
    }

    /// Writes a run's follow-ups (admitted by [`Tasks::admitted`] around the run's effects) and
    /// counts them. Only those not written yet are: a follow-up's id is derived from its parent's
    /// occurrence, so a run committed again writes none twice. While Redis is out of memory the
    /// write waits for it as long as `held` says the run's claim is held.
    pub async fn write_follow_ups(
        &self,
        tasks: &[NewTask],
        held: impl Fn() -> bool,
    ) -> anyhow::Result<()> {
        while let Err(e) = self.store.schedule(tasks, ScheduleMode::IfAbsent).await {
            if !eggtimer_store::is_full(&e) || !held() {
                return Err(e);
            }
            tracing::debug!("follow-ups wait for Redis to have memory");
            tokio::time::sleep(FULL_RETRY).await;
        }
        self.count(tasks);
        Ok(())
    }

    /// A recurring schedule's firing, admitted, created and counted: whether it was created
    /// (false: it existed already).
    pub async fn fire(&self, task: &NewTask) -> Result<bool, Refusal> {
        let task = std::slice::from_ref(task);
        let created = self.admitted(task, self.store.fire(&task[0])).await??;
        if created {
            self.count(task);
        }
        Ok(created)
    }

    /// Counts new tasks in this runner's metrics.
    pub fn count(&self, tasks: &[NewTask]) {
        for t in tasks {
            self.metrics.observe_scheduled(&t.plugin, 1);
        }
    }
}
