//! The eggtimer guest SDK: write one handler over a typed payload, build it for `wasm32-wasip2`,
//! upload it.
//!
//! ```no_run
//! use eggtimer_sdk::{Outcome, Task, handler};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Reminder { user_id: String }
//!
//! fn remind(task: Task<Reminder>) -> eggtimer_sdk::Result {
//!     eggtimer_sdk::emit("push", &serde_json::json!({ "user_id": task.payload.user_id }))?;
//!     Ok(Outcome::Done)
//! }
//!
//! handler!(remind);
//! ```
//!
//! On a native target (`cargo test` on your machine) the host calls go to [`testing`], which
//! records them, so handlers are unit-tested without wasm or Redis.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

#[doc(hidden)]
pub use serde_json;

/// Bindings generated from `wit/plugin.wit` (used by [`handler!`]).
#[allow(clippy::too_many_arguments)]
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "checked",
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "eggtimer_sdk::bindings",
    });
}

mod follow_up;
mod sys;
pub mod testing;

pub use follow_up::{FollowUp, Schedulable, WithPriority, schedule};

use bindings::eggtimer::plugin::types as wit;

/// The task being run, with its payload decoded.
///
/// ```
/// # use eggtimer_sdk::Task;
/// fn greet(task: Task<String>) -> String { format!("attempt {} of {}", task.attempt, task.id) }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Task<P> {
    pub id: String,
    /// The plugin the task belongs to (this one).
    pub plugin: String,
    /// 1 on the first attempt.
    pub attempt: u32,
    pub max_attempts: u32,
    /// Due time, ms since the Unix epoch.
    pub due: i64,
    pub owner: Option<String>,
    pub payload: P,
}

impl<P> Task<P> {
    /// The event that made it run: it listened for it (a task spec's `on` with `then: run`).
    /// None when it runs at its due time. (It asks the host: a plugin that never calls it also
    /// runs on runners older than events.)
    pub fn event(&self) -> Result<Option<Event>> {
        match sys::event() {
            None => Ok(None),
            Some(e) => Ok(Some(serde_json::from_str(&e)?)),
        }
    }
}

impl<P: DeserializeOwned> Task<P> {
    /// A debounced task's payloads, oldest first (at most 1,000), each decoded as `P`; the
    /// task's `payload` is the latest. Empty for a task that is not debounced.
    pub fn batch(&self) -> Result<Vec<P>> {
        sys::batch()
            .iter()
            .enumerate()
            .map(|(i, p)| decode(p).map_err(|e| Error(format!("payload {i} of the batch: {e}"))))
            .collect()
    }
}

/// An event that reached a task (`POST /v1/events/{topic}`).
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct Event {
    /// Unique per event.
    pub id: String,
    pub topic: String,
    pub key: String,
    /// When it arrived, ms since the Unix epoch.
    pub at: i64,
    /// What its publisher sent.
    pub data: serde_json::Value,
}

/// What a handler decided.
///
/// ```
/// # use eggtimer_sdk::Outcome;
/// # use std::time::Duration;
/// let later = Outcome::RetryAfter(Duration::from_secs(30));
/// # let _ = later;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Finished.
    Done,
    /// Try again after this long (counts as a failed attempt).
    RetryAfter(Duration),
    /// Give up: the task is dead-lettered with this reason.
    Fail(String),
    /// Run this same task again at this time (ms since the epoch).
    RunAgainAt(i64),
}

/// An error of a handler: a failed attempt, retried with backoff, then dead-lettered.
///
/// ```
/// let e: eggtimer_sdk::Error = "downstream said 503".into();
/// assert_eq!(e.to_string(), "downstream said 503");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<String> for Error {
    fn from(s: String) -> Self {
        Error(s)
    }
}

impl From<&str> for Error {
    fn from(s: &str) -> Self {
        Error(s.to_owned())
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error(format!("JSON: {e}"))
    }
}

/// What a handler returns.
///
/// ```
/// fn handle(_task: eggtimer_sdk::Task<()>) -> eggtimer_sdk::Result { Ok(eggtimer_sdk::Outcome::Done) }
/// # let _ = handle;
/// ```
pub type Result<T = Outcome> = std::result::Result<T, Error>;

/// Log levels for [`log`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// Writes a line to the runner's log, tagged with the task.
///
/// ```
/// eggtimer_sdk::log(eggtimer_sdk::Level::Info, "feeding the pet");
/// ```
pub fn log(level: Level, message: &str) {
    sys::log(level, message)
}

/// The host's clock: ms since the Unix epoch.
///
/// ```
/// let t = eggtimer_sdk::now();
/// assert!(t > 0);
/// ```
pub fn now() -> i64 {
    sys::now()
}

/// Cancels a scheduled task of this plugin (nothing happens if it does not exist, already ran, or
/// belongs to another plugin).
///
/// ```
/// eggtimer_sdk::cancel("order-1234");
/// ```
pub fn cancel(id: &str) {
    sys::cancel(id)
}

/// Appends an event to this plugin's stream of the topic (`{eggtimer}:events:<plugin>:<topic>`:
/// no other plugin writes or trims it), with this task's id and plugin. Topics are `[a-z0-9._-]`, 1 to 64 characters.
///
/// ```
/// eggtimer_sdk::emit("order", &serde_json::json!({"type": "order_cancelled"})).unwrap();
/// ```
pub fn emit<T: Serialize>(topic: &str, data: &T) -> Result<()> {
    sys::emit(topic, &serde_json::to_string(data)?)
}

/// The plugin's own key-value store (scoped to the plugin; values are JSON).
///
/// Reads are checked when the run's effects are committed: if a key this run read was changed by
/// another run meanwhile, none of this run's effects apply and the handler runs again with fresh
/// reads. So two runs that race on one key behave as if one ran after the other, and "check a
/// key, then write it and emit" happens once (see the SDK's README, "What exactly once means").
pub mod kv {
    use super::*;

    /// Reads a value (`None` if absent or expired). Sees this run's own writes.
    ///
    /// ```
    /// let seen: Option<bool> = eggtimer_sdk::kv::get("order-1:cancelled").unwrap();
    /// # let _ = seen;
    /// ```
    pub fn get<T: DeserializeOwned>(key: &str) -> Result<Option<T>> {
        match sys::kv_get(key)? {
            Some(s) => Ok(Some(serde_json::from_str(&s)?)),
            None => Ok(None),
        }
    }

    /// Writes a value, optionally expiring after `ttl`.
    ///
    /// ```
    /// eggtimer_sdk::kv::set("order-1:cancelled", &true, None).unwrap();
    /// ```
    pub fn set<T: Serialize>(key: &str, value: &T, ttl: Option<Duration>) -> Result<()> {
        sys::kv_set(
            key,
            &serde_json::to_string(value)?,
            ttl.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// Deletes a value.
    ///
    /// ```
    /// eggtimer_sdk::kv::delete("order-1:cancelled").unwrap();
    /// ```
    pub fn delete(key: &str) -> Result<()> {
        sys::kv_delete(key)
    }
}

/// A value of the plugin's `config` setting (`PATCH /v1/plugins/{name}` `{"config": {...}}`).
///
/// ```
/// let url = eggtimer_sdk::config("orders_url");
/// # assert_eq!(url, None);
/// ```
pub fn config(name: &str) -> Option<String> {
    sys::config(name)
}

/// One of the plugin's secrets (`eggtimer plugin secret set NAME KEY`); never log or emit it.
///
/// ```
/// let key = eggtimer_sdk::secret("signing_key").unwrap();
/// # assert_eq!(key, None);
/// ```
pub fn secret(name: &str) -> Result<Option<String>> {
    sys::secret(name)
}

/// Outbound HTTP through the host: only to the origins of the plugin's `allowed_hosts`, within
/// the run's budgets and time limit. Redirects are returned, not followed. Every request carries
/// an `Idempotency-Key` that is the same on every attempt of this occurrence of the task (unless
/// you set one), so a receiver that honours it acts once.
///
/// ```
/// use eggtimer_sdk::http::Request;
/// # eggtimer_sdk::testing::TestHost::new().run(|_: eggtimer_sdk::Task<()>| {
/// let resp = Request::post("https://orders.example.com/v1/orders/42/cancel")
///     .header("Authorization", "Bearer ...")
///     .json(&serde_json::json!({"reason": "unpaid"}))?
///     .send();
/// # assert!(resp.is_err()); // the test host answers only what a test queued
/// # Ok(eggtimer_sdk::Outcome::Done) }, eggtimer_sdk::testing::task(())).unwrap();
/// ```
pub mod http {
    use super::*;

    /// A request to send.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Request {
        pub method: String,
        pub url: String,
        pub headers: Vec<(String, String)>,
        pub body: Vec<u8>,
    }

    impl Request {
        pub fn new(method: &str, url: &str) -> Request {
            Request {
                method: method.to_owned(),
                url: url.to_owned(),
                headers: Vec::new(),
                body: Vec::new(),
            }
        }
        pub fn get(url: &str) -> Request {
            Request::new("GET", url)
        }
        pub fn post(url: &str) -> Request {
            Request::new("POST", url)
        }
        pub fn put(url: &str) -> Request {
            Request::new("PUT", url)
        }
        pub fn delete(url: &str) -> Request {
            Request::new("DELETE", url)
        }
        /// Adds a header.
        pub fn header(mut self, name: &str, value: &str) -> Request {
            self.headers.push((name.to_owned(), value.to_owned()));
            self
        }
        /// The body, as bytes.
        pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
            self.body = body.into();
            self
        }
        /// The body as JSON, with `Content-Type: application/json`.
        pub fn json<T: Serialize>(self, value: &T) -> Result<Request> {
            Ok(self
                .header("Content-Type", "application/json")
                .body(serde_json::to_vec(value)?))
        }
        /// Sends it and waits for the answer (any status: check it).
        pub fn send(self) -> Result<Response> {
            sys::http_send(self)
        }
    }

    /// An answer.
    #[derive(Debug, Clone, PartialEq, Eq, Default)]
    pub struct Response {
        pub status: u16,
        pub headers: Vec<(String, String)>,
        pub body: Vec<u8>,
    }

    impl Response {
        /// A response with this status and body (for the test host).
        pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Response {
            Response {
                status,
                headers: Vec::new(),
                body: body.into(),
            }
        }
        /// The first header of this name (any case).
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }
        /// 200 to 299.
        pub fn is_success(&self) -> bool {
            (200..300).contains(&self.status)
        }
        /// The body as text (invalid UTF-8 replaced).
        pub fn text(&self) -> String {
            String::from_utf8_lossy(&self.body).into_owned()
        }
        /// The body as JSON.
        pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
            Ok(serde_json::from_slice(&self.body)?)
        }
    }
}

/// Runs a typed handler over a raw task (what [`handler!`] expands to). A payload that does not
/// decode fails the task at once: retrying would not help.
#[doc(hidden)]
pub fn __run<P: DeserializeOwned>(
    task: wit::Task,
    f: fn(Task<P>) -> Result,
) -> std::result::Result<wit::Outcome, String> {
    let payload: P = match decode(&task.payload) {
        Ok(p) => p,
        Err(e) => {
            return Ok(wit::Outcome::Fail(format!(
                "the payload does not fit this plugin: {e}"
            )));
        }
    };
    let typed = Task {
        id: task.id,
        plugin: task.plugin,
        attempt: task.attempt,
        max_attempts: task.max_attempts,
        due: task.due,
        owner: task.owner,
        payload,
    };
    match f(typed) {
        Ok(Outcome::Done) => Ok(wit::Outcome::Done),
        Ok(Outcome::RetryAfter(d)) => Ok(wit::Outcome::RetryAfter(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
        )),
        Ok(Outcome::Fail(r)) => Ok(wit::Outcome::Fail(r)),
        Ok(Outcome::RunAgainAt(t)) => Ok(wit::Outcome::RunAgainAt(t)),
        Err(e) => Err(e.0),
    }
}

/// Whether `payload` decodes as the handler's payload type (what [`handler!`] exports as the
/// plugin's `check`): the runner calls it when a task is scheduled, so a payload the handler could
/// not read is refused then (`422 invalid_payload`), not dead-lettered when it falls due.
#[doc(hidden)]
pub fn __check<P: DeserializeOwned>(
    payload: &str,
    _f: fn(Task<P>) -> Result,
) -> std::result::Result<(), String> {
    decode::<P>(payload).map(drop)
}

/// `payload` as `P`; an error names the field where it does not fit (`expires_at: invalid
/// type: string "soon", expected i64 at line 1 column 60`).
fn decode<P: DeserializeOwned>(payload: &str) -> std::result::Result<P, String> {
    let mut de = serde_json::Deserializer::from_str(payload);
    let p = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            e.into_inner().to_string()
        } else {
            format!("{path}: {}", e.into_inner())
        }
    })?;
    de.end().map_err(|e| e.to_string())?;
    Ok(p)
}

/// The payload type's JSON Schema (what [`handler!`]`(f, schema)` exports as the plugin's
/// `payload-schema`).
#[cfg(feature = "schema")]
#[doc(hidden)]
pub fn __schema<P: schemars::JsonSchema>(_f: fn(Task<P>) -> Result) -> Option<String> {
    serde_json::to_string(&schemars::schema_for!(P)).ok()
}

#[cfg(feature = "schema")]
#[doc(hidden)]
pub use schemars;

/// Declares the plugin's handler: a `fn(Task<P>) -> eggtimer_sdk::Result` where `P` is any
/// `serde::Deserialize` payload type. Use it once per plugin crate. The plugin also exports
/// `check`, which decodes a payload as `P` with the same deserializer: the runner refuses a task
/// whose payload the handler could not read when it is scheduled. With the SDK's `schema`
/// feature, `handler!(handle, schema)` also says what `P` is as a JSON Schema (`P` derives
/// `schemars::JsonSchema`), which `GET /v1/plugins/{name}` and the dashboard show.
///
/// ```no_run
/// fn handle(task: eggtimer_sdk::Task<serde_json::Value>) -> eggtimer_sdk::Result {
///     Ok(eggtimer_sdk::Outcome::Done)
/// }
/// eggtimer_sdk::handler!(handle);
/// ```
#[macro_export]
macro_rules! handler {
    (@schema $f:path) => { ::std::option::Option::None };
    (@schema $f:path, schema) => { $crate::__schema($f) };
    ($f:path $(, $schema:ident)?) => {
        #[doc(hidden)]
        pub struct __EggtimerPlugin;

        impl $crate::bindings::Guest for __EggtimerPlugin {
            fn handle(
                task: $crate::bindings::eggtimer::plugin::types::Task,
            ) -> ::std::result::Result<$crate::bindings::eggtimer::plugin::types::Outcome, ::std::string::String> {
                $crate::__run(task, $f)
            }

            fn check(payload: ::std::string::String) -> ::std::result::Result<(), ::std::string::String> {
                $crate::__check(&payload, $f)
            }

            fn payload_schema() -> ::std::option::Option<::std::string::String> {
                $crate::handler!(@schema $f $(, $schema)?)
            }
        }

        $crate::bindings::export!(__EggtimerPlugin with_types_in $crate::bindings);
    };
}
