//! A host for unit tests of handlers, on your machine with `cargo test`: no wasm, no Redis.
//!
//! It records what the handler asked for (follow-ups, cancels, events, kv writes, logs) and keeps
//! the kv store across runs, so a test can run a handler twice and check it is idempotent.
//!
//! ```
//! use eggtimer_sdk::testing::{TestHost, task};
//! use eggtimer_sdk::{Outcome, Task};
//!
//! fn handle(t: Task<u32>) -> eggtimer_sdk::Result {
//!     eggtimer_sdk::emit("numbers", &t.payload)?;
//!     Ok(Outcome::Done)
//! }
//!
//! let mut host = TestHost::new();
//! assert_eq!(host.run(handle, task(7)), Ok(Outcome::Done));
//! assert_eq!(host.events, vec![("numbers".to_string(), serde_json::json!(7))]);
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::{FollowUp, Level, Outcome, Result, Task};

/// The recording host. Its fields are what the handler did so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TestHost {
    /// The id of the task being run (follow-up ids are derived from it).
    pub task_id: String,
    /// What `now()` returns.
    pub now: i64,
    pub logs: Vec<(Level, String)>,
    /// (derived id, follow-up)
    pub scheduled: Vec<(String, FollowUp)>,
    pub cancelled: Vec<String>,
    /// (topic, data)
    pub events: Vec<(String, serde_json::Value)>,
    /// The plugin's kv store (JSON text values).
    pub kv: BTreeMap<String, String>,
}

thread_local! {
    static HOST: RefCell<TestHost> = RefCell::new(TestHost::new());
}

/// Runs `f` with the current thread's test host.
#[cfg_attr(target_family = "wasm", allow(dead_code))]
pub(crate) fn with_host<R>(f: impl FnOnce(&mut TestHost) -> R) -> R {
    HOST.with(|h| f(&mut h.borrow_mut()))
}

/// A task with this payload, as the first attempt of `test-task` due at the test host's `now`.
///
/// ```
/// let t = eggtimer_sdk::testing::task("hello");
/// assert_eq!(t.attempt, 1);
/// ```
pub fn task<P>(payload: P) -> Task<P> {
    Task {
        id: "test-task".into(),
        plugin: "test-plugin".into(),
        attempt: 1,
        max_attempts: 5,
        due: TestHost::DEFAULT_NOW,
        owner: None,
        payload,
    }
}

impl TestHost {
    /// The default clock of a test host: 2023-11-14T22:13:20Z.
    pub const DEFAULT_NOW: i64 = 1_700_000_000_000;

    /// An empty host whose clock reads [`TestHost::DEFAULT_NOW`].
    pub fn new() -> Self {
        TestHost {
            now: Self::DEFAULT_NOW,
            ..Default::default()
        }
    }

    /// Runs the handler on `task` against this host; the host records what it did.
    ///
    /// ```
    /// # use eggtimer_sdk::{testing::{TestHost, task}, Outcome, Task};
    /// fn handle(_: Task<()>) -> eggtimer_sdk::Result { Ok(Outcome::Done) }
    /// assert_eq!(TestHost::new().run(handle, task(())), Ok(Outcome::Done));
    /// ```
    pub fn run<P>(&mut self, f: fn(Task<P>) -> Result, task: Task<P>) -> Result {
        self.task_id = task.id.clone();
        HOST.with(|h| std::mem::swap(&mut *h.borrow_mut(), self));
        let out = f(task);
        HOST.with(|h| std::mem::swap(&mut *h.borrow_mut(), self));
        out
    }

    /// Runs the handler on a payload given as JSON, as the runner would (a payload that does not
    /// decode fails the task).
    ///
    /// ```
    /// # use eggtimer_sdk::{testing::TestHost, Outcome, Task};
    /// fn handle(t: Task<u8>) -> eggtimer_sdk::Result { Ok(Outcome::Done) }
    /// let out = TestHost::new().run_json(handle, "\"not a number\"");
    /// assert!(matches!(out, Ok(Outcome::Fail(_))));
    /// ```
    pub fn run_json<P: serde::de::DeserializeOwned>(
        &mut self,
        f: fn(Task<P>) -> Result,
        payload: &str,
    ) -> Result {
        match serde_json::from_str::<P>(payload) {
            Ok(p) => self.run(f, task(p)),
            Err(e) => Ok(Outcome::Fail(format!(
                "the payload does not fit this plugin: {e}"
            ))),
        }
    }
}
