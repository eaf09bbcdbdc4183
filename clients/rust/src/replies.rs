//! What the API answers: tasks, schedules' answers, an owner's counts.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A task's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Scheduled,
    Running,
    Done,
    Dead,
}

/// A task as the API shows it. Times are milliseconds since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub plugin: String,
    pub payload: Value,
    pub run_at: i64,
    #[serde(default)]
    pub owner: Option<String>,
    pub max_attempts: u32,
    pub state: TaskState,
    pub attempts: u32,
    #[serde(default)]
    pub last_error: Option<String>,
    pub created_at: i64,
    #[serde(default)]
    pub finished_at: Option<i64>,
    #[serde(default)]
    pub traceparent: Option<String>,
    /// The events it listens for (`{"topic", "key", "then"}`).
    #[serde(default)]
    pub on: Vec<Value>,
    /// The event that made it run, if one did.
    #[serde(default)]
    pub event: Option<Value>,
    /// A debounced task's payloads.
    #[serde(default)]
    pub batch: Vec<Value>,
    /// 0 to 9 (absent in the reply: 0).
    #[serde(default)]
    pub priority: u8,
}

/// What scheduling or moving answers: the task's id and its due time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scheduled {
    pub id: String,
    pub run_at: i64,
    /// An event of its lookback that was already there when it was scheduled: the task was
    /// cancelled at once or runs now with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub met: Option<Met>,
}

/// An owner's tasks per plugin ([`crate::Client::owner_stats`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerStats {
    pub owner: String,
    /// The plugins the key sees that hold tasks of the owner, by name.
    pub plugins: Vec<OwnerPluginStats>,
    pub scheduled: u64,
    pub running: u64,
    pub dead: u64,
    pub paused: OwnerPauses,
}

/// One plugin's tasks of an owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerPluginStats {
    pub plugin: String,
    pub scheduled: u64,
    pub running: u64,
    pub dead: u64,
    /// What the plugin's `max_pending_per_owner` counts of the owner (0 from a runner before
    /// 0.3.0).
    #[serde(default)]
    pub pending: u64,
}

/// What of an owner is paused: all its tasks, or those of some plugins.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerPauses {
    pub all: bool,
    pub plugins: Vec<String>,
}

/// An event a task met when it was scheduled (`then`: `cancel` or `run`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Met {
    pub topic: String,
    pub key: String,
    pub then: String,
}

/// What scheduling a debounced spec ([`crate::TaskSpec::debounce`]) did with its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DebounceVerdict {
    /// A new window: the task is due in `quiet_ms`.
    New,
    /// Joined the waiting task, which moved.
    Merged,
    /// The task runs, so the payload waits for its next window.
    Queued,
}

/// What [`crate::Client::schedule_debounced`] answers: the task's id (its debounce key) and what became
/// of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Debounced {
    pub id: String,
    pub debounced: DebounceVerdict,
}
