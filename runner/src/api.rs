//! The admin HTTP API (API.md): the only code that imports axum.
//!
//! Bodies are read and validated by hand, so that every 4xx names the field that is wrong and
//! every error is the JSON body of the contract. A Redis that does not answer is a 503; the runner
//! itself stays up.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use crate::executor::now_ms;
use crate::metrics::{Gauges, Metrics};
use crate::plugins::{Registry, valid_plugin_name};
use crate::store::{Move, NewTask, Refused, Rollback, ScheduleMode, Scheduled, Store, TaskRecord};

/// Most specs in one POST /v1/tasks.
pub const MAX_BATCH: usize = 10_000;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub token: Option<String>,
    pub max_payload_bytes: usize,
    pub max_plugin_bytes: usize,
    pub max_body_bytes: usize,
    /// Live-runner listing, filled in by the membership module.
    pub runners:
        Arc<dyn Fn() -> futures::future::BoxFuture<'static, anyhow::Result<Value>> + Send + Sync>,
    pub owned_shards: Arc<dyn Fn() -> usize + Send + Sync>,
}

/// An error reply: `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
    fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }
    fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response()
    }
}

/// Any store failure is Redis not answering (or answering wrongly): 503.
impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        tracing::warn!("redis: {e:#}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "redis_unavailable",
            format!("Redis is not available: {e:#}"),
        )
    }
}

type ApiResult<T = Response> = Result<T, ApiError>;

/// The router with every route of API.md.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/tasks", post(schedule))
        .route(
            "/tasks/{id}",
            get(get_task).patch(move_task).delete(cancel_task),
        )
        .route("/tasks/{id}/run", post(run_now))
        .route("/owners/{owner}/tasks", get(owner_tasks))
        .route("/owners/{owner}/shift", post(owner_shift))
        .route("/dead", get(dead_list))
        .route("/dead/{id}/retry", post(dead_retry))
        .route("/dead/{id}", axum::routing::delete(dead_drop))
        .route("/plugins", get(plugin_list))
        .route(
            "/plugins/{name}",
            put(plugin_upload).get(plugin_get).delete(plugin_delete),
        )
        .route("/plugins/{name}/rollback", post(plugin_rollback))
        .route("/runners", get(runners))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .nest("/v1", v1)
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"ok": true})) }),
        )
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::not_found("no such route") })
        .with_state(state)
}

async fn auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(token) = &st.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// Reads a JSON body: 415 unless it says JSON, 413 over `limit`, 400 if it does not parse.
async fn json_body(headers: &HeaderMap, body: Body, limit: usize) -> ApiResult<Value> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct.starts_with("application/json") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("expected Content-Type: application/json, got {ct:?}"),
        ));
    }
    let bytes = read_body(body, limit).await?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))
}

/// Reads a small JSON object body (the PATCH and shift routes).
async fn object_body(headers: &HeaderMap, body: Body) -> ApiResult<serde_json::Map<String, Value>> {
    match json_body(headers, body, 64 << 10).await? {
        Value::Object(obj) => Ok(obj),
        _ => Err(ApiError::bad("the body must be a JSON object")),
    }
}

fn check_owner(owner: &str) -> ApiResult<()> {
    if valid_token(owner) {
        Ok(())
    } else {
        Err(ApiError::bad(
            "the owner must be 1 to 200 characters without spaces or control characters",
        ))
    }
}

async fn read_body(body: Body, limit: usize) -> ApiResult<Bytes> {
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::too_large(format!("the body is larger than {limit} bytes")))
}

fn field_i64(obj: &serde_json::Map<String, Value>, name: &str, at: &str) -> ApiResult<Option<i64>> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| ApiError::bad(format!("{at}{name} must be an integer (ms)"))),
    }
}

fn field_str<'a>(
    obj: &'a serde_json::Map<String, Value>,
    name: &str,
    at: &str,
) -> ApiResult<Option<&'a str>> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::bad(format!("{at}{name} must be a string"))),
    }
}

/// Ids and owners: 1 to 200 bytes, no whitespace or control characters.
fn valid_token(s: &str) -> bool {
    !s.is_empty() && s.len() <= 200 && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn new_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Checks one task spec and turns it into a task; `at` prefixes messages (e.g. "[3].").
fn parse_spec(v: &Value, at: &str, now: i64, max_payload: usize) -> ApiResult<NewTask> {
    let obj = v
        .as_object()
        .ok_or_else(|| ApiError::bad(format!("{}a task spec must be a JSON object", at)))?;
    for k in obj.keys() {
        if ![
            "plugin",
            "payload",
            "run_at",
            "delay_ms",
            "id",
            "owner",
            "max_attempts",
        ]
        .contains(&k.as_str())
        {
            return Err(ApiError::bad(format!(
                "{at}{k} is not a field of a task spec"
            )));
        }
    }
    let plugin = field_str(obj, "plugin", at)?
        .ok_or_else(|| ApiError::bad(format!("{at}plugin is required")))?;
    if !valid_plugin_name(plugin) {
        return Err(ApiError::bad(format!(
            "{at}plugin {plugin:?} is not a plugin name ([a-z0-9][a-z0-9-]{{0,63}})"
        )));
    }
    let run_at = match (
        field_i64(obj, "run_at", at)?,
        field_i64(obj, "delay_ms", at)?,
    ) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad(format!(
                "{at}give run_at or delay_ms, not both"
            )));
        }
        (Some(t), None) if t < 0 => {
            return Err(ApiError::bad(format!("{at}run_at must not be negative")));
        }
        (Some(t), None) => t,
        (None, Some(d)) if d < 0 => {
            return Err(ApiError::bad(format!("{at}delay_ms must not be negative")));
        }
        (None, Some(d)) => now.saturating_add(d),
        (None, None) => now,
    };
    let id = match field_str(obj, "id", at)? {
        Some(id) if !valid_token(id) => {
            return Err(ApiError::bad(format!(
                "{at}id must be 1 to 200 characters without spaces or control characters"
            )));
        }
        Some(id) => id.to_owned(),
        None => new_id(),
    };
    let owner = match field_str(obj, "owner", at)? {
        Some(o) if !valid_token(o) => {
            return Err(ApiError::bad(format!(
                "{at}owner must be 1 to 200 characters without spaces or control characters"
            )));
        }
        o => o.map(str::to_owned),
    };
    let max_attempts = match obj.get("max_attempts") {
        None | Some(Value::Null) => 5,
        Some(v) => match v.as_u64() {
            Some(n @ 1..=1000) => n as u32,
            _ => {
                return Err(ApiError::bad(format!(
                    "{at}max_attempts must be an integer from 1 to 1000"
                )));
            }
        },
    };
    let payload = serde_json::to_string(obj.get("payload").unwrap_or(&Value::Null))
        .expect("a JSON value serializes");
    if payload.len() > max_payload {
        return Err(ApiError::too_large(format!(
            "{at}payload is {} bytes; the limit is {max_payload}",
            payload.len()
        )));
    }
    Ok(NewTask {
        id,
        plugin: plugin.to_owned(),
        payload,
        run_at,
        owner,
        max_attempts,
    })
}

/// Whether a plugin of that name exists (loaded here, or in the registry).
async fn plugin_exists(st: &AppState, name: &str) -> ApiResult<bool> {
    Ok(st.registry.plugins().get(name).is_some() || st.store.plugin_current(name).await?.is_some())
}

async fn schedule(State(st): State<AppState>, headers: HeaderMap, body: Body) -> ApiResult {
    let v = json_body(&headers, body, st.max_body_bytes).await?;
    let now = now_ms();
    let (specs, single) = match &v {
        Value::Array(a) if a.is_empty() => {
            return Err(ApiError::bad("the array of task specs is empty"));
        }
        Value::Array(a) if a.len() > MAX_BATCH => {
            return Err(ApiError::too_large(format!(
                "{} task specs; at most {MAX_BATCH} per request",
                a.len()
            )));
        }
        Value::Array(a) => (
            a.iter()
                .enumerate()
                .map(|(i, s)| parse_spec(s, &format!("[{i}]."), now, st.max_payload_bytes))
                .collect::<ApiResult<Vec<_>>>()?,
            false,
        ),
        other => (
            vec![parse_spec(other, "", now, st.max_payload_bytes)?],
            true,
        ),
    };
    let mut plugins: Vec<&str> = specs.iter().map(|t| t.plugin.as_str()).collect();
    plugins.sort_unstable();
    plugins.dedup();
    for p in plugins {
        if !plugin_exists(&st, p).await? {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_plugin",
                format!("no plugin named {p:?}; upload it with PUT /v1/plugins/{p}"),
            ));
        }
    }
    let verdicts = st.store.schedule(&specs, ScheduleMode::Upsert).await?;
    let running: Vec<&str> = specs
        .iter()
        .zip(&verdicts)
        .filter(|(_, v)| **v == Scheduled::Running)
        .map(|(t, _)| t.id.as_str())
        .collect();
    if !running.is_empty() {
        return Err(ApiError::conflict(format!(
            "running, so not replaced: {}",
            running.join(", ")
        )));
    }
    for t in &specs {
        st.metrics.observe_scheduled(&t.plugin, 1);
    }
    let replies: Vec<Value> = specs
        .iter()
        .map(|t| json!({"id": t.id, "run_at": t.run_at}))
        .collect();
    let body = if single {
        replies.into_iter().next().unwrap_or(Value::Null)
    } else {
        Value::Array(replies)
    };
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

fn refused(id: &str, r: Refused) -> ApiError {
    match r {
        Refused::Missing => ApiError::not_found(format!("no task {id:?}")),
        other => ApiError::conflict(format!("task {id:?}: {other}")),
    }
}

async fn task_reply(st: &AppState, id: &str) -> ApiResult<TaskRecord> {
    st.store
        .get(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no task {id:?}")))
}

async fn get_task(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult {
    Ok(axum::Json(task_reply(&st, &id).await?).into_response())
}

async fn move_task(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let obj = &object_body(&headers, body).await?;
    let how = match (
        field_i64(obj, "run_at", "")?,
        field_i64(obj, "shift_ms", "")?,
    ) {
        (Some(t), None) if t >= 0 => Move::At(t),
        (Some(_), None) => return Err(ApiError::bad("run_at must not be negative")),
        (None, Some(d)) => Move::Shift(d),
        _ => return Err(ApiError::bad("give exactly one of run_at or shift_ms")),
    };
    st.store
        .move_task(&id, how)
        .await?
        .map_err(|r| refused(&id, r))?;
    Ok(axum::Json(task_reply(&st, &id).await?).into_response())
}

async fn cancel_task(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult {
    st.store.cancel(&id).await?.map_err(|r| refused(&id, r))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn run_now(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let at = st
        .store
        .move_task(&id, Move::Now)
        .await?
        .map_err(|r| refused(&id, r))?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({"id": id, "run_at": at})),
    )
        .into_response())
}

async fn owner_tasks(State(st): State<AppState>, Path(owner): Path<String>) -> ApiResult {
    check_owner(&owner)?;
    Ok(axum::Json(st.store.owner_tasks(&owner).await?).into_response())
}

async fn owner_shift(
    State(st): State<AppState>,
    Path(owner): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    check_owner(&owner)?;
    let obj = &object_body(&headers, body).await?;
    let shift =
        field_i64(obj, "shift_ms", "")?.ok_or_else(|| ApiError::bad("shift_ms is required"))?;
    let plugin = field_str(obj, "plugin", "")?;
    let n = st.store.shift_owner(&owner, shift, plugin).await?;
    Ok(axum::Json(json!({"shifted": n})).into_response())
}

#[derive(Deserialize)]
struct DeadQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

async fn dead_list(State(st): State<AppState>, Query(q): Query<DeadQuery>) -> ApiResult {
    let limit = match q.limit.as_deref() {
        None => 100,
        Some(l) => match l.parse::<usize>() {
            Ok(n @ 1..=1000) => n,
            _ => return Err(ApiError::bad("limit must be an integer from 1 to 1000")),
        },
    };
    let cursor = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => {
            let (t, id) = c
                .split_once(':')
                .ok_or_else(|| ApiError::bad("cursor is not one this API returned"))?;
            Some((
                t.parse::<i64>()
                    .map_err(|_| ApiError::bad("cursor is not one this API returned"))?,
                id.to_owned(),
            ))
        }
    };
    let (tasks, next) = st.store.dead(limit, cursor).await?;
    let next = next.map(|(t, id)| format!("{t}:{id}"));
    Ok(axum::Json(json!({"tasks": tasks, "next_cursor": next})).into_response())
}

async fn dead_retry(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let at = st.store.revive(&id).await?.map_err(|r| refused(&id, r))?;
    Ok(axum::Json(json!({"id": id, "run_at": at})).into_response())
}

async fn dead_drop(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult {
    st.store
        .drop_dead(&id)
        .await?
        .map_err(|r| refused(&id, r))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn plugin_upload(
    State(st): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct != "application/wasm" {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("expected Content-Type: application/wasm, got {ct:?}"),
        ));
    }
    if !valid_plugin_name(&name) {
        return Err(ApiError::bad(format!(
            "{name:?} is not a plugin name: use [a-z0-9][a-z0-9-]{{0,63}}"
        )));
    }
    let wasm = read_body(body, st.max_plugin_bytes).await?;
    use crate::plugins::UploadError as U;
    match st.registry.upload(&name, wasm.to_vec()).await {
        Ok((entry, created)) => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok((
                status,
                axum::Json(
                    json!({"name": entry.name, "version": entry.version, "digest": entry.digest}),
                ),
            )
                .into_response())
        }
        Err(e @ U::BadName(_)) => Err(ApiError::bad(e.to_string())),
        Err(U::Invalid(reason)) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_plugin",
            reason,
        )),
        Err(U::TooLarge(n, max)) => Err(ApiError::too_large(format!(
            "the plugin is {n} bytes; the limit is {max}"
        ))),
        Err(U::Store(e)) => Err(e.into()),
    }
}

async fn plugin_list(State(st): State<AppState>) -> ApiResult {
    Ok(axum::Json(st.store.plugin_list().await?).into_response())
}

async fn plugin_get(State(st): State<AppState>, Path(name): Path<String>) -> ApiResult {
    let cur = st
        .store
        .plugin_current(&name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no plugin {name:?}")))?;
    let history = st.store.plugin_history(&name).await?;
    let mut v = serde_json::to_value(&cur).expect("serializes");
    v["history"] = serde_json::to_value(history).expect("serializes");
    Ok(axum::Json(v).into_response())
}

async fn plugin_rollback(State(st): State<AppState>, Path(name): Path<String>) -> ApiResult {
    match st.registry.rollback(&name).await? {
        Rollback::Done(e) => Ok(axum::Json(e).into_response()),
        Rollback::Missing => Err(ApiError::not_found(format!("no plugin {name:?}"))),
        Rollback::NoPrevious => Err(ApiError::conflict(format!(
            "plugin {name:?} has no previous version"
        ))),
    }
}

async fn plugin_delete(State(st): State<AppState>, Path(name): Path<String>) -> ApiResult {
    if st.registry.delete(&name).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found(format!("no plugin {name:?}")))
    }
}

async fn runners(State(st): State<AppState>) -> ApiResult {
    Ok(axum::Json((st.runners)().await?).into_response())
}

async fn readyz(State(st): State<AppState>) -> ApiResult {
    st.store.ping().await?;
    Ok(axum::Json(json!({"ok": true})).into_response())
}

async fn metrics(State(st): State<AppState>) -> Response {
    let shards = st.store.shard_counts().await.unwrap_or_default();
    let runners = match (st.runners)().await {
        Ok(Value::Array(a)) => a.len(),
        _ => 0,
    };
    let g = Gauges {
        shards,
        plugins: st.registry.plugins().loaded(),
        owned_shards: (st.owned_shards)(),
        runners,
    };
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(&g),
    )
        .into_response()
}
