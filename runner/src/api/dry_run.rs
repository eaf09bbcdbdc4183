//! `POST /v1/tasks/{id}/dry-run`: a task's payload run through a version of its plugin (the
//! current one, or any stored, a candidate included) in the sandbox, with nothing applied: kv
//! reads see the real entries; kv writes, events, follow-ups and cancels are returned, not done;
//! HTTP requests are recorded, not sent (answered from the canned answers given, else with an
//! error that says "dry run"); secrets read as placeholders (a dry run's answer must not carry a
//! secret's value to its caller). How a team fixes a dead letter: upload a fix as a candidate,
//! dry-run the dead tasks against it, promote, retry.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::body::{self, ApiResult, field};
use super::checks::failed;
use super::doc;
use super::error::ApiError;
use super::params::TaskId;
use super::task_ref::{OfPlugin, TaskPath};
use crate::api::auth::Who;
use crate::executor::{Outcome, StoreHost, TaskHost};
use crate::plugins::{DryRun, HttpAnswer};
use eggtimer_store::{Claimed, KvWrite, TaskRecord, TaskState, decode_log};

/// Canned answers a dry run may be given.
const MAX_CANNED: usize = 100;

/// The body of a dry run (all optional).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DryRunBody {
    /// The version to run (a candidate included); default the current one.
    #[serde(default, deserialize_with = "field::int")]
    #[schema(value_type = Option<u64>, minimum = 1)]
    version: Option<i64>,
    /// Answers to the run's HTTP requests, in order (none left: the request fails with an
    /// error that says "dry run").
    #[serde(default)]
    #[schema(max_items = 100)]
    http: Vec<Canned>,
}

/// A canned answer to one HTTP request of a dry run.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Canned {
    #[serde(deserialize_with = "field::int")]
    #[schema(value_type = u16, minimum = 100, maximum = 599)]
    status: Option<i64>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// The body, as text.
    #[serde(default)]
    body: String,
}

/// Reads kv entries from the store; answers secret reads with placeholders.
struct DryHost(StoreHost);

impl TaskHost for DryHost {
    fn kv_get<'a>(
        &'a self,
        plugin: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>> {
        self.0.kv_get(plugin, key)
    }

    fn secret<'a>(
        &'a self,
        plugin: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async move {
            let real = self.0.secret(plugin, name).await?;
            Ok(real.map(|_| format!("dry-run-placeholder-of-{name}")))
        })
    }
}

/// `POST /v1/tasks/{id}/dry-run`.
#[utoipa::path(post, path = "/v1/tasks/{id}/dry-run", tag = "tasks", params(TaskId, OfPlugin),
    request_body(content = DryRunBody, content_type = "application/json"),
    responses((status = 200, description = "what the run did, nothing of it applied", body = doc::DryRunReply), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn dry_run(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
    Query(of): Query<OfPlugin>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let bytes = body::read(body, 1 << 20).await?;
    let b: DryRunBody = if bytes.is_empty() {
        DryRunBody {
            version: None,
            http: Vec::new(),
        }
    } else {
        body::require_content_type(&headers, "application/json")?;
        body::typed(body::raw(&bytes)?)?
    };
    if b.http.len() > MAX_CANNED {
        return Err(ApiError::bad(format!(
            "http holds at most {MAX_CANNED} answers"
        )));
    }
    let mut canned = Vec::with_capacity(b.http.len());
    for (i, c) in b.http.into_iter().enumerate() {
        let status = c
            .status
            .filter(|s| (100..=599).contains(s))
            .ok_or_else(|| ApiError::bad(format!("http[{i}].status must be 100 to 599")))?;
        canned.push(HttpAnswer {
            status: status as u16,
            headers: c.headers.into_iter().collect(),
            body: c.body.into_bytes(),
        });
    }
    let path = TaskPath::new(id, of)?;
    let id = path.id();
    // a debounced task runs with its window's payloads
    let t = st
        .tasks
        .as_run(&caller, st.registry.as_ref(), path.named())
        .await?;
    let history = st.store.plugin_history(&t.plugin).await?;
    let entry = match b.version {
        None => st.store.plugin_current(&t.plugin).await?,
        Some(v) => history
            .into_iter()
            .find(|e| i64::try_from(e.version) == Ok(v)),
    }
    .ok_or_else(|| {
        ApiError::not_found(format!(
            "plugin {:?} has no {} (GET /v1/plugins/{} lists its versions)",
            t.plugin,
            b.version
                .map_or("current version".to_owned(), |v| format!("version {v}")),
            t.plugin
        ))
    })?;
    let loaded = st
        .registry
        .version(&entry)
        .await
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_plugin", e))?;
    let host: Arc<dyn TaskHost> = Arc::new(DryHost(StoreHost {
        store: st.store.clone(),
    }));
    let task = claimed(&st, &t);
    let dry = st
        .registry
        .plugins()
        .dry_run(loaded, task, host, canned)
        .await
        .map_err(|e| failed(&format!("task {id:?}"), &t.plugin, e, "nothing was run"))?;
    let reply = reply(&t.id, &t.plugin, entry.version, dry_attempt(&t), &dry);
    Ok((StatusCode::OK, axum::Json(reply)).into_response())
}

/// A dry run's answer: what the run decided, logged and would have done.
pub fn reply(id: &str, plugin: &str, version: u64, attempt: u32, dry: &DryRun) -> Value {
    let outcome = match &dry.run.outcome {
        Ok(Outcome::Done) => json!({"done": true}),
        Ok(Outcome::RetryAfter(ms)) => json!({"retry_after_ms": ms}),
        Ok(Outcome::Fail(reason)) => json!({"fail": reason}),
        Ok(Outcome::RunAgainAt(at)) => json!({"run_again_at": at}),
        Err(e) => json!({"error": e}),
    };
    let e = &dry.run.effects;
    let json_or_null = |text: &str| serde_json::from_str::<Value>(text).unwrap_or(Value::Null);
    let kv: Vec<Value> =
        e.ns.kv
            .iter()
            .map(|w| match w {
                KvWrite::Set { key, value, ttl_ms } => {
                    json!({"set": key, "value": value, "ttl_ms": ttl_ms})
                }
                KvWrite::Delete { key } => json!({"delete": key}),
            })
            .collect();
    let schedule: Vec<Value> = e
        .schedule
        .iter()
        .map(|f| {
            json!({"id": f.id, "plugin": f.plugin, "payload": json_or_null(&f.payload),
                "run_at": f.run_at, "owner": f.owner})
        })
        .collect();
    let events: Vec<Value> =
        e.ns.events
            .iter()
            .map(|(topic, data)| json!({"topic": topic, "data": json_or_null(data)}))
            .collect();
    json!({
        "id": id,
        "plugin": plugin,
        "version": version,
        "outcome": outcome,
        "took_ms": dry.took.as_secs_f64() * 1000.0,
        "log": dry.run.log.stored(attempt).map(|l| decode_log(&l)).unwrap_or_default(),
        "effects": {
            "follow_ups": schedule,
            "cancels": e.cancel,
            "kv": kv,
            "events": events,
            "http": dry.http,
        },
    })
}

/// The attempt a dry run of `t` is: the one it would run next.
fn dry_attempt(t: &TaskRecord) -> u32 {
    match t.state {
        TaskState::Dead | TaskState::Done => t.attempts.max(1),
        TaskState::Scheduled | TaskState::Running => t.attempts + 1,
    }
}

/// The task as a run would receive it.
fn claimed(st: &AppState, t: &TaskRecord) -> Claimed {
    Claimed {
        id: t.key.clone(),
        shard: st.store.shard_of(&t.key),
        token: 0,
        effects_claim: 0,
        attempt: dry_attempt(t),
        due: t.run_at,
        max_attempts: t.max_attempts,
        plugin: t.plugin.clone(),
        owner: t.owner.clone(),
        payload: t.payload.clone(),
        created: t.created_at,
        traceparent: t.traceparent.clone(),
        start_by: t.start_by,
        event: t.event.clone(),
        batch: t.batch.clone(),
        priority: t.priority,
    }
}
