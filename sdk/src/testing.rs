//! A host for unit tests of handlers, on your machine with `cargo test`: no wasm, no Redis.
//!
//! It records what the handler asked for (follow-ups, cancels, events, kv writes, logs) and keeps
//! the kv store across runs, so a test can run a handler twice and check it is idempotent. It
//! behaves like the runner where a handler can tell: follow-up ids are derived the same way,
//! topics, keys, times and TTLs are checked the same way, and a run that goes over the runner's
//! default budget fails with the runner's message (and, as in the runner, the effects it asked
//! for are not applied).
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

use crate::http::{Request, Response};
use crate::{Error, FollowUp, Level, Outcome, Result, Task};

/// The runner's default budget of one run: HTTP requests.
pub const BUDGET_HTTP_REQUESTS: usize = 20;

/// The `Idempotency-Key` the runner gives the `index`-th HTTP request of the occurrence of task
/// `task` scheduled at `occurrence` (ms): the same on every attempt and rerun of it.
///
/// ```
/// use eggtimer_sdk::testing::idempotency_key;
/// assert_eq!(idempotency_key("a", 1, 0), idempotency_key("a", 1, 0));
/// assert_ne!(idempotency_key("a", 1, 0), idempotency_key("a", 1, 1));
/// ```
pub fn idempotency_key(task: &str, occurrence: i64, index: usize) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"http\n");
    h.update(task.as_bytes());
    h.update(b"\n");
    h.update(occurrence.to_string().as_bytes());
    h.update(b"\n");
    h.update(index.to_string().as_bytes());
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The runner's default budget of one run: bytes of kv writes, events, logs and follow-ups.
pub const BUDGET_BYTES: usize = 1 << 20;
/// The runner's default budget of one run: follow-ups.
pub const BUDGET_FOLLOW_UPS: usize = 100;
/// The runner's default budget of one run: cancels.
pub const BUDGET_CANCELS: usize = 100;
/// The highest priority a task may have (0, the default, the lowest).
pub const MAX_PRIORITY: u8 = 9;

/// The latest time a follow-up may be due (9999-12-31T23:59:59.999Z).
pub const MAX_TIME_MS: i64 = 253_402_300_799_999;
/// The longest kv TTL (10 years), in ms.
pub const MAX_TTL_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

/// The id the runner gives the `index`-th follow-up scheduled by the occurrence of task `parent`
/// that was scheduled at `occurrence` (ms). A re-run of the same occurrence derives the same ids.
///
/// ```
/// use eggtimer_sdk::testing::derive_id;
/// assert_eq!(derive_id("a", 1, 0), derive_id("a", 1, 0));
/// assert_ne!(derive_id("a", 1, 0), derive_id("a", 1, 1));
/// ```
pub fn derive_id(parent: &str, occurrence: i64, index: usize) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(parent.as_bytes());
    h.update(b"\n");
    h.update(occurrence.to_string().as_bytes());
    h.update(b"\n");
    h.update(index.to_string().as_bytes());
    h.finalize()[..10]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The recording host. Its fields are what the handler did so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TestHost {
    /// The id of the task being run (follow-up ids are derived from it).
    pub task_id: String,
    /// When the task's current occurrence was scheduled (follow-up ids are derived from it).
    pub created: i64,
    /// What `now()` returns.
    pub now: i64,
    pub logs: Vec<(Level, String)>,
    /// (derived id, follow-up)
    pub scheduled: Vec<(String, FollowUp)>,
    /// The priority each of `scheduled` was given ([`FollowUp::priority`]; `None`: its task's).
    pub priorities: Vec<Option<u8>>,
    pub cancelled: Vec<String>,
    /// (topic, data)
    pub events: Vec<(String, serde_json::Value)>,
    /// The plugin's kv store (JSON text values).
    pub kv: BTreeMap<String, String>,
    /// Bytes spent of this run's budget.
    pub spent: usize,
    /// Set when the run went over its budget: the run fails with this message.
    pub over_budget: Option<String>,
    /// What `config(name)` answers.
    pub config: BTreeMap<String, String>,
    /// What `secret(name)` answers.
    pub secrets: BTreeMap<String, String>,
    /// The answers HTTP requests get, in order (an `Err` is a failed request, such as a refused
    /// origin); a request with none left fails.
    pub http_responses: std::collections::VecDeque<std::result::Result<Response, String>>,
    /// The requests sent, each with the `Idempotency-Key` the runner would add.
    pub http_requests: Vec<Request>,
    /// What `task.event()` answers (JSON text `{"id", "topic", "key", "at", "data"}`).
    pub event: Option<String>,
    /// What `task.batch()` answers (JSON texts).
    pub batch: Vec<String>,
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
            created: Self::DEFAULT_NOW,
            ..Default::default()
        }
    }

    /// Spends `bytes` of the run's budget.
    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    pub(crate) fn spend(&mut self, bytes: usize) -> Result<()> {
        self.spent += bytes;
        if self.spent > BUDGET_BYTES {
            return self.over(format!(
                "more than {BUDGET_BYTES} bytes of kv writes, events, logs and follow-ups in one run"
            ));
        }
        Ok(())
    }

    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    fn over(&mut self, what: String) -> Result<()> {
        let msg = format!("the plugin went over its effects budget: {what}");
        self.over_budget.get_or_insert(msg.clone());
        Err(Error(msg))
    }

    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    pub(crate) fn schedule(&mut self, t: FollowUp, priority: Option<u8>) -> Result<String> {
        if let Some(p) = priority
            && p > MAX_PRIORITY
        {
            return Err(Error(format!(
                "priority must be an integer from 0 to {MAX_PRIORITY}"
            )));
        }
        if self.scheduled.len() >= BUDGET_FOLLOW_UPS {
            self.over(format!(
                "more than {BUDGET_FOLLOW_UPS} follow-up tasks in one run"
            ))?;
        }
        self.spend(t.payload.len() + t.plugin.len())?;
        // the runner's rules and messages (its `limits` module)
        if !(0..=MAX_TIME_MS).contains(&t.run_at) {
            return Err(Error(format!(
                "run_at must be a time from 0 to {MAX_TIME_MS} (ms since the Unix epoch), got {}",
                t.run_at
            )));
        }
        if let Some(o) = &t.owner
            && (o.is_empty() || o.len() > 200 || o.chars().any(char::is_control))
        {
            return Err(Error(format!(
                "owner must be 1 to 200 bytes without control characters (got {} bytes)",
                o.len()
            )));
        }
        serde_json::from_str::<serde_json::Value>(&t.payload)
            .map_err(|e| Error(format!("payload is not JSON: {e}")))?;
        let id = derive_id(&self.task_id, self.created, self.scheduled.len());
        self.scheduled.push((id.clone(), t));
        self.priorities.push(priority);
        Ok(id)
    }

    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    pub(crate) fn cancel(&mut self, id: &str) {
        if self.cancelled.len() >= BUDGET_CANCELS {
            let _ = self.over(format!("more than {BUDGET_CANCELS} cancels in one run"));
            return;
        }
        if self.spend(id.len()).is_ok() {
            self.cancelled.push(id.to_owned());
        }
    }

    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    pub(crate) fn emit(&mut self, topic: &str, data: &str) -> Result<()> {
        self.spend(topic.len() + data.len())?;
        let valid = !topic.is_empty()
            && topic.len() <= 64
            && topic
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if !valid {
            return Err(Error(format!(
                "{topic:?} is not a topic: use 1 to 64 of a-z 0-9 . _ -"
            )));
        }
        let value = serde_json::from_str(data)
            .map_err(|e| Error(format!("the event data is not JSON: {e}")))?;
        self.events.push((topic.to_owned(), value));
        Ok(())
    }

    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    fn check_key(key: &str) -> Result<()> {
        if key.is_empty() || key.len() > 512 {
            return Err("kv keys are 1 to 512 bytes".into());
        }
        Ok(())
    }

    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    pub(crate) fn kv_get(&mut self, key: &str) -> Result<Option<String>> {
        Self::check_key(key)?;
        Ok(self.kv.get(key).cloned())
    }

    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    pub(crate) fn kv_set(&mut self, key: &str, value: &str, ttl_ms: Option<u64>) -> Result<()> {
        self.spend(key.len() + value.len())?;
        Self::check_key(key)?;
        if ttl_ms.is_some_and(|t| t > MAX_TTL_MS) {
            return Err(Error(format!(
                "a kv TTL is at most {MAX_TTL_MS} ms (10 years)"
            )));
        }
        self.kv.insert(key.to_owned(), value.to_owned());
        Ok(())
    }

    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    pub(crate) fn kv_delete(&mut self, key: &str) -> Result<()> {
        self.spend(key.len())?;
        Self::check_key(key)?;
        self.kv.remove(key);
        Ok(())
    }

    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    pub(crate) fn http_send(&mut self, mut r: Request) -> Result<Response> {
        let index = self.http_requests.len();
        if index >= BUDGET_HTTP_REQUESTS {
            self.over(format!(
                "more than {BUDGET_HTTP_REQUESTS} HTTP requests in one run"
            ))?;
        }
        self.spend(r.body.len())?;
        if !r
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("idempotency-key"))
        {
            let key = idempotency_key(&self.task_id, self.created, index);
            r.headers.push(("Idempotency-Key".into(), key));
        }
        let shown = format!("{} {}", r.method, r.url);
        self.http_requests.push(r);
        match self.http_responses.pop_front() {
            Some(Ok(resp)) => {
                self.spend(resp.body.len())?;
                Ok(resp)
            }
            Some(Err(e)) => Err(Error(e)),
            None => Err(Error(format!(
                "the test host has no response queued for {shown} (push one to http_responses)"
            ))),
        }
    }

    /// Runs the handler on `task` against this host; the host records what it did.
    ///
    /// ```
    /// # use eggtimer_sdk::{testing::{TestHost, task}, Outcome, Task};
    /// fn handle(_: Task<()>) -> eggtimer_sdk::Result { Ok(Outcome::Done) }
    /// assert_eq!(TestHost::new().run(handle, task(())), Ok(Outcome::Done));
    /// ```
    ///
    /// As in the runner, a run that went over its budget fails (`Err`) whatever the handler
    /// returned; what it recorded is kept here so a test can look at it.
    pub fn run<P>(&mut self, f: fn(Task<P>) -> Result, task: Task<P>) -> Result {
        self.task_id = task.id.clone();
        self.spent = 0;
        self.http_requests.clear();
        self.over_budget = None;
        HOST.with(|h| std::mem::swap(&mut *h.borrow_mut(), self));
        let out = f(task);
        HOST.with(|h| std::mem::swap(&mut *h.borrow_mut(), self));
        match &self.over_budget {
            Some(msg) => Err(Error(msg.clone())),
            None => out,
        }
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
        match crate::decode::<P>(payload) {
            Ok(p) => self.run(f, task(p)),
            Err(e) => Ok(Outcome::Fail(format!(
                "the payload does not fit this plugin: {e}"
            ))),
        }
    }
}

/// What the plugin's `check` says of a payload given as JSON, as the runner asks it when a task
/// is scheduled: `Err` names what does not fit.
///
/// ```
/// # use eggtimer_sdk::{testing::check, Outcome, Task};
/// #[derive(serde::Deserialize)]
/// struct Order { order_id: String }
/// fn handle(t: Task<Order>) -> eggtimer_sdk::Result { Ok(Outcome::Done) }
/// assert!(check(handle, r#"{"order_id": "o1"}"#).is_ok());
/// assert!(check(handle, "{}").unwrap_err().contains("missing field `order_id`"));
/// ```
pub fn check<P: serde::de::DeserializeOwned>(
    f: fn(Task<P>) -> Result,
    payload: &str,
) -> std::result::Result<(), String> {
    crate::__check(payload, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follow_up_ids_match_the_runner() {
        // the same vector is asserted by the runner's `plugins::host` tests
        assert_eq!(derive_id("order-1", 1_700_000_000_000, 0), RUNNER_VECTOR);
    }

    const RUNNER_VECTOR: &str = "c2b0d6e0fe68e95a329c";

    #[test]
    fn a_task_reads_the_event_that_made_it_run_and_its_batch() {
        fn call(t: Task<u32>) -> Result {
            let e = t.event()?.expect("an event");
            assert_eq!(
                (e.topic.as_str(), e.key.as_str(), e.at),
                ("payments", "o1", 5)
            );
            assert_eq!(t.batch()?, vec![1, 2]);
            Ok(Outcome::Done)
        }
        let mut host = TestHost::new();
        host.event =
            Some(r#"{"id":"1-1","topic":"payments","key":"o1","at":5,"data":{"a":1}}"#.into());
        host.batch = vec!["1".into(), "2".into()];
        assert_eq!(host.run(call, task(2)), Ok(Outcome::Done));
        // a batch payload the handler can't read is an error naming it
        fn strict(t: Task<u32>) -> Result {
            t.batch().map(|_| Outcome::Done)
        }
        host.batch = vec!["1".into(), "\"x\"".into()];
        assert!(
            host.run(strict, task(1))
                .unwrap_err()
                .0
                .contains("payload 1 of the batch")
        );
    }

    #[test]
    fn http_answers_what_the_test_queued() {
        fn call(_: Task<()>) -> Result {
            let r = crate::http::Request::post("https://api.example.com/x")
                .json(&serde_json::json!({"a": 1}))?
                .send()?;
            let again = crate::http::Request::get("https://api.example.com/y").send();
            assert_eq!(again.unwrap_err().0, "refused");
            assert_eq!(crate::config("region").as_deref(), Some("eu"));
            assert_eq!(crate::secret("token")?.as_deref(), Some("s3cret"));
            Ok(if r.status == 202 {
                Outcome::Done
            } else {
                Outcome::Fail(r.text())
            })
        }
        let mut host = TestHost::new();
        host.config.insert("region".into(), "eu".into());
        host.secrets.insert("token".into(), "s3cret".into());
        host.http_responses.push_back(Ok(Response::new(202, "ok")));
        host.http_responses.push_back(Err("refused".into()));
        assert_eq!(host.run(call, task(())), Ok(Outcome::Done));
        assert_eq!(host.http_requests.len(), 2);
        assert_eq!(host.http_requests[0].body, br#"{"a":1}"#);
        let key = |i: usize| {
            host.http_requests[i]
                .headers
                .iter()
                .find(|(k, _)| k == "Idempotency-Key")
                .unwrap()
                .1
                .clone()
        };
        assert_eq!(
            key(0),
            idempotency_key("test-task", TestHost::DEFAULT_NOW, 0)
        );
        assert_ne!(key(0), key(1));
        // the runner's `plugins::http` tests assert the same vector
        assert_eq!(
            idempotency_key("order-1", 1_700_000_000_000, 0),
            "639a89dd1912f80fb0a54ffc7bf232cb"
        );
    }

    #[test]
    fn a_run_over_its_budget_fails_like_in_the_runner() {
        fn flood(_: Task<()>) -> Result {
            for i in 0..=BUDGET_FOLLOW_UPS {
                let _ = crate::schedule(FollowUp::new("noop", &i)?);
            }
            Ok(Outcome::Done)
        }
        let out = TestHost::new().run(flood, task(()));
        let err = out.unwrap_err().0;
        assert!(err.contains("more than 100 follow-up tasks"), "{err}");
    }

    #[test]
    fn a_follow_ups_priority_is_kept_and_above_nine_refused() {
        fn urgent(_: Task<()>) -> Result {
            crate::schedule(FollowUp::new("noop", &1)?.priority(9))?;
            crate::schedule(FollowUp::new("noop", &2)?)?;
            let err = crate::schedule(FollowUp::new("noop", &3)?.priority(10)).unwrap_err();
            assert_eq!(err.0, "priority must be an integer from 0 to 9");
            Ok(Outcome::Done)
        }
        let mut host = TestHost::new();
        assert_eq!(host.run(urgent, task(())), Ok(Outcome::Done));
        assert_eq!(host.scheduled.len(), 2);
        assert_eq!(host.priorities, [Some(9), None]);
    }

    #[test]
    fn bad_topics_and_ttls_are_refused() {
        fn bad(_: Task<()>) -> Result {
            assert!(crate::emit("Bad Topic", &1).is_err());
            assert!(
                crate::kv::set(
                    "k",
                    &1,
                    Some(std::time::Duration::from_secs(400 * 365 * 86400))
                )
                .is_err()
            );
            Ok(Outcome::Done)
        }
        assert_eq!(TestHost::new().run(bad, task(())), Ok(Outcome::Done));
    }
}
