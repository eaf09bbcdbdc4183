//! Task routes: schedule (one or a batch, all or nothing), read, move, cancel, run now; an owner's
//! tasks and shift; dead letters.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::body::{self, ApiResult, field};
use super::doc;
use super::error::{ApiError, Concerns};
use super::params::{TaskId, check_id};
use super::task_ref::{OfPlugin, TaskPath};
use super::task_spec::{parse_specs, traceparent_header};
use crate::api::auth::Who;
use crate::tasks::Written;
use eggtimer_store::{Debounced, Met, Move, NewTask};

/// Largest body of the small JSON routes (PATCH, shift).
pub(super) const SMALL_BODY: usize = 64 << 10;

/// `POST /v1/tasks`: one spec or an array; all or nothing.
#[utoipa::path(post, path = "/v1/tasks", tag = "tasks",
    params(("traceparent" = Option<String>, Header, nullable = false, pattern = "^(00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2})?$",
        description = "A W3C trace context for every spec without its own: the runs join this trace (empty: none)")),
    request_body(content = super::task_spec::ScheduleBody, content_type = "application/json"),
    responses((status = 201, description = "scheduled", body = doc::ScheduleReply), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn schedule(
    State(st): State<AppState>,
    Who(caller): Who,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, st.max_body_bytes).await?;
    let v = body::raw(&bytes)?;
    let single = !body::is_array(v);
    let specs = parse_specs(&st, v, traceparent_header(&headers)?.as_deref())?;
    let written = st
        .tasks
        .schedule(&caller, st.registry.as_ref(), &specs, single)
        .await?;
    Ok(match written {
        Written::Tasks(met) => scheduled(&specs, met, single),
        Written::Debounced(verdicts) => debounced(&specs, &verdicts, single),
    })
}

/// The answer to a batch scheduled: each task's id and due time, and the event it met.
fn scheduled(specs: &[NewTask], met: Vec<Met>, single: bool) -> Response {
    let mut met: HashMap<String, Met> = met.into_iter().map(|m| (m.task.clone(), m)).collect();
    let mut replies: Vec<doc::ScheduledTask> = specs
        .iter()
        .map(|t| doc::ScheduledTask {
            id: t.id.clone(),
            run_at: t.run_at,
            met: met
                .remove(&eggtimer_store::task_key(&t.plugin, &t.id))
                .map(|m| doc::MetEvent {
                    topic: m.topic,
                    key: m.key,
                    then: m.then,
                }),
        })
        .collect();
    let body = if single && replies.len() == 1 {
        doc::ScheduleReply::One(replies.remove(0))
    } else {
        doc::ScheduleReply::Many(replies)
    };
    let mut res = (StatusCode::CREATED, axum::Json(body)).into_response();
    if specs.iter().all(|t| t.plugin == specs[0].plugin) {
        // the audit names the plugin a request concerns, when it is one
        res.extensions_mut()
            .insert(Concerns(specs[0].plugin.clone()));
    }
    res
}

/// The answer to a debounced batch: what became of each spec.
fn debounced(specs: &[NewTask], verdicts: &[Debounced], single: bool) -> Response {
    let mut replies: Vec<doc::DebouncedTask> = specs
        .iter()
        .zip(verdicts)
        .map(|(t, v)| doc::DebouncedTask {
            id: t.id.clone(),
            debounced: match v {
                Debounced::New => doc::DebounceVerdict::New,
                Debounced::Merged => doc::DebounceVerdict::Merged,
                _ => doc::DebounceVerdict::Queued,
            },
        })
        .collect();
    let body = if single && replies.len() == 1 {
        doc::ScheduleReply::OneDebounced(replies.remove(0))
    } else {
        doc::ScheduleReply::ManyDebounced(replies)
    };
    (StatusCode::CREATED, axum::Json(body)).into_response()
}

/// `GET /v1/tasks/{id}`.
#[utoipa::path(get, path = "/v1/tasks/{id}", tag = "tasks", params(TaskId, OfPlugin),
    responses((status = 200, description = "the task", body = eggtimer_store::TaskRecord), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn get_task(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
    Query(of): Query<OfPlugin>,
) -> ApiResult<Response> {
    let t = TaskPath::new(id, of)?;
    let task = st
        .tasks
        .get(&caller, st.registry.as_ref(), t.named())
        .await?;
    Ok(axum::Json(task).into_response())
}

/// The fields of a PATCH body (documented as `doc::MoveBody`): exactly one of them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveFields {
    #[serde(default, deserialize_with = "field::time")]
    run_at: Option<i64>,
    #[serde(default, deserialize_with = "field::shift")]
    shift_ms: Option<i64>,
}

/// `PATCH /v1/tasks/{id}`: `{"run_at"}` or `{"shift_ms"}`.
#[utoipa::path(patch, path = "/v1/tasks/{id}", tag = "tasks", params(TaskId, OfPlugin),
    request_body(content = doc::MoveBody, content_type = "application/json"),
    responses((status = 200, description = "moved", body = eggtimer_store::TaskRecord), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn move_task(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
    Query(of): Query<OfPlugin>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    // the body first: a malformed request is 400 whichever tasks the id names
    check_id(&id)?;
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, SMALL_BODY).await?;
    let b: MoveFields = body::typed(body::raw(&bytes)?)?;
    let how = match (b.run_at, b.shift_ms) {
        (Some(t), None) => Move::At(t),
        (None, Some(d)) => Move::Shift(d),
        _ => return Err(ApiError::bad("give exactly one of run_at or shift_ms")),
    };
    let t = TaskPath::new(id, of)?;
    let moved = st
        .tasks
        .move_task(&caller, st.registry.as_ref(), t.named(), how)
        .await?;
    Ok(axum::Json(moved).into_response())
}

/// `DELETE /v1/tasks/{id}`.
#[utoipa::path(delete, path = "/v1/tasks/{id}", tag = "tasks", params(TaskId, OfPlugin),
    responses((status = 204, description = "cancelled"), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn cancel_task(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
    Query(of): Query<OfPlugin>,
) -> ApiResult<Response> {
    let t = TaskPath::new(id, of)?;
    st.tasks
        .cancel(&caller, st.registry.as_ref(), t.named())
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/tasks/{id}/run`.
#[utoipa::path(post, path = "/v1/tasks/{id}/run", tag = "tasks", params(TaskId, OfPlugin),
    responses((status = 202, description = "due now", body = doc::ScheduledTask), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn run_now(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
    Query(of): Query<OfPlugin>,
) -> ApiResult<Response> {
    let t = TaskPath::new(id, of)?;
    let at = st
        .tasks
        .run_now(&caller, st.registry.as_ref(), t.named())
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({"id": t.id(), "run_at": at})),
    )
        .into_response())
}
