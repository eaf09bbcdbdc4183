//! Follow-up tasks: what a run asks the runner to schedule, with or without a priority of its
//! own, and the call that asks.

use serde::Serialize;

use crate::{Result, now, sys};

/// A follow-up task to schedule with [`schedule`].
///
/// ```
/// # use eggtimer_sdk::FollowUp;
/// let next = FollowUp::new("auto-feed", &serde_json::json!({"pet_id": "p1"}))
///     .unwrap()
///     .at(1_800_000_000_000)
///     .owner("user-42");
/// # let _ = next;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct FollowUp {
    pub plugin: String,
    /// JSON text.
    pub payload: String,
    /// ms since the Unix epoch (default: now).
    pub run_at: i64,
    pub owner: Option<String>,
    pub max_attempts: Option<u32>,
}

impl FollowUp {
    /// A follow-up of `plugin` with this payload, due now until [`FollowUp::at`] says otherwise.
    pub fn new<P: Serialize>(plugin: &str, payload: &P) -> Result<FollowUp> {
        Ok(FollowUp {
            plugin: plugin.to_owned(),
            payload: serde_json::to_string(payload)?,
            run_at: now(),
            owner: None,
            max_attempts: None,
        })
    }

    /// Due at this time (ms since the epoch).
    pub fn at(mut self, run_at: i64) -> Self {
        self.run_at = run_at;
        self
    }

    /// Belongs to this owner (for per-owner listing and shifting).
    pub fn owner(mut self, owner: &str) -> Self {
        self.owner = Some(owner.to_owned());
        self
    }

    /// At most this many attempts.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// Of this priority, 0 (lowest) to 9 (highest): among tasks due, a claim takes the higher
    /// first. Without it a follow-up has the priority of the task that schedules it; above 9,
    /// [`schedule`] answers an error.
    ///
    /// A plugin that gives a follow-up a priority imports the contract's
    /// `schedule-with-priority`, and loads only on runners that offer it; one that never does
    /// imports `schedule` alone, as before.
    pub fn priority(self, priority: u8) -> WithPriority {
        WithPriority {
            task: self,
            priority,
        }
    }
}

/// A follow-up with a priority of its own ([`FollowUp::priority`]).
#[derive(Clone, Debug, PartialEq)]
pub struct WithPriority {
    pub task: FollowUp,
    pub priority: u8,
}

/// What [`schedule`] takes: a [`FollowUp`], or one [`WithPriority`]. Each calls its own host
/// function, so a plugin imports only those it uses.
pub trait Schedulable: sealed::Sealed {
    #[doc(hidden)]
    fn schedule(self) -> Result<String>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::FollowUp {}
    impl Sealed for super::WithPriority {}
}

impl Schedulable for FollowUp {
    fn schedule(self) -> Result<String> {
        sys::schedule(self, None)
    }
}

impl Schedulable for WithPriority {
    fn schedule(self) -> Result<String> {
        sys::schedule(self.task, Some(self.priority))
    }
}

/// Schedules a follow-up task and returns its id. The id is derived from this task's id, its
/// occurrence (when it was scheduled) and the number of follow-ups scheduled so far in this run,
/// so a re-run of the same occurrence never schedules it twice, and a new occurrence (scheduled
/// again, run again, replayed) never loses it. See [`crate::testing::derive_id`].
///
/// ```
/// # use eggtimer_sdk::{FollowUp, schedule};
/// let id = schedule(FollowUp::new("noop", &()).unwrap()).unwrap();
/// assert!(!id.is_empty());
/// ```
pub fn schedule(task: impl Schedulable) -> Result<String> {
    task.schedule()
}
