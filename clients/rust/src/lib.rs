//! A client for eggtimer's HTTP API: schedule, move, cancel and read tasks from your own services.
//!
//! ```no_run
//! # async fn f() -> Result<(), eggtimer_client::Error> {
//! use eggtimer_client::{Client, TaskSpec};
//! let et = Client::new("http://127.0.0.1:8080").token(std::env::var("EGGTIMER_TOKEN").ok());
//! let spec = TaskSpec::new("order-cancel")
//!     .payload(serde_json::json!({"order_id": "o-17"}))
//!     .id("cancel-o-17")
//!     .delay_ms(15 * 60_000);
//! et.schedule(&spec).await?;
//! et.move_by("cancel-o-17", -5 * 60_000).await?;
//! et.cancel("cancel-o-17").await?;
//! # Ok(()) }
//! ```
//!
//! Every method is one HTTP request (`owner_tasks` one per page); an error reply is an
//! [`Error::Api`] with the API's status, code and message. [`Client::call`] reaches any route.

use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod replies;

pub use replies::{
    DebounceVerdict, Debounced, Met, OwnerPauses, OwnerPluginStats, OwnerStats, Scheduled, Task,
    TaskState,
};

/// What went wrong with a call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API answered with an error (`{"error": {"code", "message"}}`).
    #[error("{status}: {message}")]
    Api {
        status: reqwest::StatusCode,
        code: String,
        message: String,
        /// The whole error object, with the fields some errors add (`failing` and `examples` of
        /// `incompatible_payloads`).
        error: Value,
    },
    /// No answer: nothing listens there, a timeout, TLS.
    #[error("{method} {url}: is eggtimer running there?")]
    Unreachable {
        method: Method,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// An answer this client could not read as the route's reply, or a spec whose answer the
    /// method can't give (a debounced spec to [`Client::schedule`], a plain one to
    /// [`Client::schedule_debounced`]; nothing is sent).
    #[error("{0}")]
    Reply(String),
}

impl Error {
    /// The HTTP status of an error reply.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(status.as_u16()),
            _ => None,
        }
    }

    /// The API's error code (`bad_request`, `not_found`, `conflict`, `duplicate`, ...).
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One task to schedule (the body of `POST /v1/tasks`): `run_at` or `delay_ms`, or neither for
/// now. The same `id` again replaces a task that has not started.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TaskSpec {
    pub plugin: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Once the task finished, the same id is refused (409 `duplicate`) for this long.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unique_for_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Events it listens for: `cancel` cancels it, `run` runs it at once with the event.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on: Vec<Listen>,
    /// An event up to this long before it was scheduled still matches (default 60,000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lookback_ms: Option<i64>,
    /// One task per key: scheduling again within `quiet_ms` moves it and keeps every payload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debounce: Option<Value>,
    /// 0 (default) to 9: among its plugin's due tasks, the higher starts first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
}

/// An event a task listens for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listen {
    pub topic: String,
    pub key: String,
    /// `cancel` or `run`.
    pub then: String,
}

impl TaskSpec {
    pub fn new(plugin: impl Into<String>) -> TaskSpec {
        TaskSpec {
            plugin: plugin.into(),
            ..TaskSpec::default()
        }
    }
    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = Some(payload);
        self
    }
    pub fn run_at(mut self, ms: i64) -> Self {
        self.run_at = Some(ms);
        self
    }
    pub fn delay_ms(mut self, ms: i64) -> Self {
        self.delay_ms = Some(ms);
        self
    }
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }
    pub fn unique_for_ms(mut self, ms: i64) -> Self {
        self.unique_for_ms = Some(ms);
        self
    }
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = Some(priority);
        self
    }
    /// Cancels the task when an event of `topic` with `key` arrives.
    pub fn cancel_on(mut self, topic: &str, key: &str) -> Self {
        self.on.push(Listen {
            topic: topic.into(),
            key: key.into(),
            then: "cancel".into(),
        });
        self
    }
    /// Runs the task at once, with the event, when an event of `topic` with `key` arrives.
    pub fn run_on(mut self, topic: &str, key: &str) -> Self {
        self.on.push(Listen {
            topic: topic.into(),
            key: key.into(),
            then: "run".into(),
        });
        self
    }
    /// One task per `key`: see `debounce` in the API.
    pub fn debounce(mut self, key: &str, quiet_ms: i64, max_wait_ms: i64) -> Self {
        self.debounce =
            Some(serde_json::json!({"key": key, "quiet_ms": quiet_ms, "max_wait_ms": max_wait_ms}));
        self
    }
}

/// What a request carries.
pub enum Body {
    None,
    Json(Value),
    /// A plugin binary (`Content-Type: application/wasm`).
    Wasm(Vec<u8>),
}

/// One eggtimer: any runner of a namespace serves the whole namespace.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// The plugin whose tasks the by-id calls name (`?plugin=`), if set.
    plugin: Option<String>,
}

/// A path segment, percent-encoded (ids and owners may hold spaces, slashes, anything printable).
pub fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl Client {
    /// A client of the eggtimer at `url` (`http://127.0.0.1:8080`, say).
    pub fn new(url: &str) -> Client {
        Client {
            http: reqwest::Client::new(),
            base: url.trim_end_matches('/').to_owned(),
            token: None,
            plugin: None,
        }
    }

    /// A client whose calls by task id (`get`, `move_to`, `shift`, `cancel`, `run_now`) name
    /// the task of this plugin. Needed only where plugins your key may see each have a task of
    /// one id (a task id belongs to its plugin; without it that is 409 `ambiguous_id`).
    pub fn in_plugin(&self, plugin: &str) -> Client {
        Client {
            plugin: Some(plugin.to_owned()),
            ..self.clone()
        }
    }

    /// `/v1/tasks/<id><then>`, with `?plugin=` when the client names one.
    fn task_path(&self, id: &str, then: &str) -> String {
        let mut path = format!("/v1/tasks/{}{then}", segment(id));
        if let Some(p) = &self.plugin {
            path += &format!("?plugin={}", segment(p));
        }
        path
    }

    /// Sends `token` (an API key `et_...` or the admin token) as the bearer of every request.
    pub fn token(mut self, token: Option<String>) -> Client {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// Uses this reqwest client (timeouts, proxies, extra roots of your own).
    pub fn http_client(mut self, http: reqwest::Client) -> Client {
        self.http = http;
        self
    }

    pub async fn schedule(&self, spec: &TaskSpec) -> Result<Scheduled> {
        all_debounced(std::slice::from_ref(spec), false)?;
        self.typed(Method::POST, "/v1/tasks", json(spec)).await
    }

    /// Up to 10,000 tasks at once, all or none (an error names the refused index).
    pub async fn schedule_many(&self, specs: &[TaskSpec]) -> Result<Vec<Scheduled>> {
        all_debounced(specs, false)?;
        self.typed(Method::POST, "/v1/tasks", json(specs)).await
    }

    /// Schedules a debounced spec ([`TaskSpec::debounce`]): one task per key, which gathers the
    /// payloads of a quiet period. Its answer has no due time: a payload may wait for a running
    /// task's next window.
    pub async fn schedule_debounced(&self, spec: &TaskSpec) -> Result<Debounced> {
        all_debounced(std::slice::from_ref(spec), true)?;
        self.typed(Method::POST, "/v1/tasks", json(spec)).await
    }

    /// Up to 10,000 debounced specs at once, all or none.
    pub async fn schedule_debounced_many(&self, specs: &[TaskSpec]) -> Result<Vec<Debounced>> {
        all_debounced(specs, true)?;
        self.typed(Method::POST, "/v1/tasks", json(specs)).await
    }

    /// The task, or `None` when there is no such task.
    pub async fn get(&self, id: &str) -> Result<Option<Task>> {
        not_found_is_none(
            self.typed(Method::GET, &self.task_path(id, ""), Body::None)
                .await,
        )
    }

    /// Moves a scheduled task to `run_at` (409 if it is running or done).
    pub async fn move_to(&self, id: &str, run_at: i64) -> Result<Scheduled> {
        let body = Body::Json(serde_json::json!({ "run_at": run_at }));
        self.typed(Method::PATCH, &self.task_path(id, ""), body)
            .await
    }

    /// Moves a scheduled task by `shift_ms` (negative: earlier). Moving a task is `move_to` or
    /// `move_by` here, `move(id, {runAt} | {shiftMs})` in the JavaScript client,
    /// `move(id, run_at= | shift_ms=)` in the Python one and `eggtimer task move --at | --by`.
    pub async fn move_by(&self, id: &str, shift_ms: i64) -> Result<Scheduled> {
        let body = Body::Json(serde_json::json!({ "shift_ms": shift_ms }));
        self.typed(Method::PATCH, &self.task_path(id, ""), body)
            .await
    }

    /// Cancels a scheduled task: `true` if it was cancelled, `false` if there was none.
    pub async fn cancel(&self, id: &str) -> Result<bool> {
        let r = self
            .call(Method::DELETE, &self.task_path(id, ""), Body::None)
            .await;
        Ok(not_found_is_none(r)?.is_some())
    }

    /// Makes a scheduled task due now.
    pub async fn run_now(&self, id: &str) -> Result<()> {
        self.call(Method::POST, &self.task_path(id, "/run"), Body::None)
            .await
            .map(drop)
    }

    /// Every scheduled task of `owner`, soonest first (all pages).
    pub async fn owner_tasks(&self, owner: &str) -> Result<Vec<Task>> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/owners/{}/tasks?limit=1000", segment(owner));
            if let Some(c) = &cursor {
                path += &format!("&cursor={}", segment(c));
            }
            let (v, next) = self.request(Method::GET, &path, Body::None).await?;
            out.extend(from_value::<Vec<Task>>(v)?);
            match next {
                Some(c) => cursor = Some(c),
                None => return Ok(out),
            }
        }
    }

    /// Moves every scheduled task of `owner` (of one plugin, if given): how many moved.
    pub async fn shift_owner(
        &self,
        owner: &str,
        shift_ms: i64,
        plugin: Option<&str>,
    ) -> Result<u64> {
        let mut body = serde_json::json!({ "shift_ms": shift_ms });
        if let Some(p) = plugin {
            body["plugin"] = p.into();
        }
        let v = self
            .call(
                Method::POST,
                &format!("/v1/owners/{}/shift", segment(owner)),
                Body::Json(body),
            )
            .await?;
        count(&v, "shifted")
    }

    /// Cancels every scheduled task of `owner` (of one plugin, if given): how many.
    pub async fn cancel_owner(&self, owner: &str, plugin: Option<&str>) -> Result<u64> {
        let mut path = format!("/v1/owners/{}/tasks", segment(owner));
        if let Some(p) = plugin {
            path += &format!("?plugin={}", segment(p));
        }
        let v = self.call(Method::DELETE, &path, Body::None).await?;
        count(&v, "cancelled")
    }

    /// Pauses `owner`'s tasks (of one plugin, if given): no runner starts them until they are
    /// resumed; they stay scheduled. Returns the owner's pauses.
    pub async fn pause_owner(&self, owner: &str, plugin: Option<&str>) -> Result<OwnerPauses> {
        let v = self.owner_pause(owner, plugin, "pause").await?;
        from_value(v["paused"].clone())
    }

    /// Resumes `owner`'s tasks (of one plugin; without one, every pause of the owner): they are
    /// due as they were. Returns how many were put back.
    pub async fn resume_owner(&self, owner: &str, plugin: Option<&str>) -> Result<u64> {
        let v = self.owner_pause(owner, plugin, "resume").await?;
        count(&v, "resumed")
    }

    async fn owner_pause(&self, owner: &str, plugin: Option<&str>, op: &str) -> Result<Value> {
        let mut body = serde_json::json!({});
        if let Some(p) = plugin {
            body["plugin"] = p.into();
        }
        let path = format!("/v1/owners/{}/{op}", segment(owner));
        self.call(Method::POST, &path, Body::Json(body)).await
    }

    /// `owner`'s scheduled, running and dead tasks per plugin, and its pauses.
    pub async fn owner_stats(&self, owner: &str) -> Result<OwnerStats> {
        let path = format!("/v1/owners/{}/stats", segment(owner));
        from_value(self.call(Method::GET, &path, Body::None).await?)
    }

    /// Publishes an event: the tasks listening on `topic` with `key` are cancelled or run now.
    /// Returns how many tasks it reached.
    pub async fn publish(&self, topic: &str, key: &str, data: &Value) -> Result<u64> {
        let path = format!("/v1/events/{}", segment(topic));
        let body = Body::Json(serde_json::json!({"key": key, "data": data}));
        let v = self.call(Method::POST, &path, body).await?;
        count(&v, "matched")
    }

    /// Any route: `path` from `/v1/...` with its query; the reply's JSON (`Null` when empty).
    pub async fn call(&self, method: Method, path: &str, body: Body) -> Result<Value> {
        Ok(self.request(method, path, body).await?.0)
    }

    /// Any route, with the reply's `X-Next-Cursor` (the next page of a paged listing).
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Body,
    ) -> Result<(Value, Option<String>)> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method.clone(), &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        req = match body {
            Body::None => req,
            Body::Json(v) => req.json(&v),
            Body::Wasm(bytes) => req.header("content-type", "application/wasm").body(bytes),
        };
        let resp = req.send().await.map_err(|source| Error::Unreachable {
            method: method.clone(),
            url: url.clone(),
            source,
        })?;
        let status = resp.status();
        let next = resp
            .headers()
            .get("x-next-cursor")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = resp.text().await.unwrap_or_default();
        let v: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if !status.is_success() {
            let code = v["error"]["code"]
                .as_str()
                .unwrap_or("http_error")
                .to_owned();
            let message = v["error"]["message"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| v.to_string());
            return Err(Error::Api {
                status,
                code,
                message,
                error: v["error"].clone(),
            });
        }
        Ok((v, next))
    }

    async fn typed<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Body,
    ) -> Result<T> {
        from_value(self.call(method, path, body).await?)
    }
}

fn json<T: Serialize + ?Sized>(v: &T) -> Body {
    Body::Json(serde_json::to_value(v).expect("a spec is plain JSON"))
}

/// Whether every spec is debounced (`want`) or none is: the two are answered differently.
fn all_debounced(specs: &[TaskSpec], want: bool) -> Result<()> {
    match specs.iter().position(|s| s.debounce.is_some() != want) {
        None => Ok(()),
        Some(i) if want => Err(Error::Reply(format!(
            "spec [{i}] has no debounce: schedule it with Client::schedule"
        ))),
        Some(i) => Err(Error::Reply(format!(
            "spec [{i}] is debounced, and its answer has no run_at: \
             schedule it with Client::schedule_debounced"
        ))),
    }
}

fn from_value<T: serde::de::DeserializeOwned>(v: Value) -> Result<T> {
    serde_json::from_value(v).map_err(|e| Error::Reply(format!("an unexpected reply: {e}")))
}

fn count(v: &Value, field: &str) -> Result<u64> {
    v[field]
        .as_u64()
        .ok_or_else(|| Error::Reply(format!("no `{field}` in the reply {v}")))
}

fn not_found_is_none<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.status() == Some(404) => Ok(None),
        Err(e) => Err(e),
    }
}
