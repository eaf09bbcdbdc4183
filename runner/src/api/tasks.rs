//! Task routes: schedule (one or a batch, all or nothing), read, move, cancel, run now; an owner's
//! tasks and shift; dead letters.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::plugin_in_scope;
use super::body::{self, ApiResult, field};
use super::doc;
use super::error::{ApiError, Concerns};
use super::params::{TaskId, check_id};
use super::task_ref::{OfPlugin, resolve};
use super::task_spec::{parse_specs, traceparent_header};
use crate::access::Caller;
use crate::store::{Move, Refused, Scheduled, TaskRecord};

/// Largest body of the small JSON routes (PATCH, shift).
pub(super) const SMALL_BODY: usize = 64 << 10;

/// Whether a plugin of that name exists (loaded here, or in the registry).
async fn plugin_exists(st: &AppState, name: &str) -> ApiResult<bool> {
    Ok(st.registry.plugins().get(name).is_some() || st.store.plugin_current(name).await?.is_some())
}

/// `POST /v1/tasks`: one spec or an array; all or nothing.
#[utoipa::path(post, path = "/v1/tasks", tag = "tasks",
    params(("traceparent" = Option<String>, Header, nullable = false, pattern = "^(00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2})?$",
        description = "A W3C trace context for every spec without its own: the runs join this trace (empty: none)")),
    request_body(content = super::task_spec::ScheduleBody, content_type = "application/json"),
    responses((status = 201, description = "scheduled", body = doc::ScheduleReply), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn schedule(
    State(st): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, st.max_body_bytes).await?;
    let v = body::raw(&bytes)?;
    let single = !body::is_array(v);
    let specs = parse_specs(&st, v, traceparent_header(&headers)?.as_deref())?;
    let at = |i: usize| {
        if single {
            String::new()
        } else {
            format!("[{i}] ")
        }
    };
    // a plugin out of the key's scope, or unknown, named with the first spec that uses it
    let mut seen = std::collections::HashSet::new();
    for (i, t) in specs.iter().enumerate() {
        if !seen.insert(t.plugin.as_str()) {
            continue;
        }
        plugin_in_scope(&caller, &t.plugin).map_err(|mut e| {
            e.message = format!("{}{}; nothing was scheduled", at(i), e.message);
            e
        })?;
        if !plugin_exists(&st, &t.plugin).await? {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_plugin",
                format!(
                    "{}no plugin named {:?}; upload it with PUT /v1/plugins/{}; nothing was scheduled",
                    at(i),
                    t.plugin,
                    t.plugin
                ),
            ));
        }
    }
    for (i, t) in specs.iter().enumerate() {
        if let Some(why) =
            t.on.iter()
                .find_map(|l| caller.refuses_topic(&l.topic, false))
        {
            return Err(ApiError::forbidden(format!(
                "{}{why}; nothing was scheduled",
                at(i)
            )));
        }
    }
    let debounced = specs.iter().filter(|t| t.debounce.is_some()).count();
    if debounced > 0 && debounced < specs.len() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_task",
            "a batch is all debounced tasks or none; nothing was scheduled",
        ));
    }
    super::checks::payloads(&st, &specs, single).await?;
    let admitted = match st.store.admit(&specs).await? {
        Ok(a) => a,
        Err(q) => {
            let mut e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, q.code(), q.to_string());
            e.concerns = Some(q.plugin().to_owned());
            return Err(e);
        }
    };
    if debounced > 0 {
        let r = super::events::schedule_debounced(&st, specs, single).await;
        st.store.landed(admitted).await;
        return r;
    }
    let written = st.store.schedule_all_or_none(&specs).await;
    st.store.landed(admitted).await;
    let met = match written? {
        Err((i, Scheduled::Duplicate)) => return Err(duplicate(&at(i), &specs[i].id)),
        Err((i, _)) => return Err(running_conflict(&at(i), &specs[i].id)),
        Ok(met) => met,
    };
    for t in &specs {
        st.metrics.observe_scheduled(&t.plugin, 1);
    }
    let mut met: std::collections::HashMap<String, crate::store::Met> =
        met.into_iter().map(|m| (m.task.clone(), m)).collect();
    let mut replies: Vec<doc::ScheduledTask> = specs
        .iter()
        .map(|t| doc::ScheduledTask {
            id: t.id.clone(),
            run_at: t.run_at,
            met: met
                .remove(&crate::store::task_key(&t.plugin, &t.id))
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
    Ok(res)
}

fn running_conflict(at: &str, id: &str) -> ApiError {
    ApiError::conflict(format!(
        "{at}task {id:?} is running, so it can't be replaced; nothing was scheduled"
    ))
}

fn duplicate(at: &str, id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "duplicate",
        format!(
            "{at}task {id:?} finished within its unique_for_ms window, so scheduling it again is a duplicate; nothing was scheduled"
        ),
    )
}

pub(super) fn refused(id: &str, r: Refused) -> ApiError {
    match r {
        Refused::Missing => ApiError::not_found(format!("no task {id:?}")),
        Refused::OutOfRange => ApiError::bad(format!("task {id:?}: {r}; nothing moved")),
        other => ApiError::conflict(format!("task {id:?}: {other}")),
    }
}

/// The task stored under `key` with its log, as its route answers it.
async fn task_reply(st: &AppState, key: &str) -> ApiResult<TaskRecord> {
    let id = crate::store::public_id(key);
    st.store
        .get(key)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no task {id:?}")))
}

/// `GET /v1/tasks/{id}`.
#[utoipa::path(get, path = "/v1/tasks/{id}", tag = "tasks", params(TaskId, OfPlugin),
    responses((status = 200, description = "the task", body = crate::store::TaskRecord), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn get_task(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(of): Query<OfPlugin>,
) -> ApiResult<Response> {
    let t = resolve(&st, &caller, &id, of.plugin).await?;
    Ok(axum::Json(task_reply(&st, &t.key).await?).into_response())
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
    responses((status = 200, description = "moved", body = crate::store::TaskRecord), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn move_task(
    State(st): State<AppState>,
    caller: Caller,
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
    let t = resolve(&st, &caller, &id, of.plugin).await?;
    st.store
        .move_task(&t.key, how)
        .await?
        .map_err(|r| refused(&id, r))?;
    Ok(axum::Json(task_reply(&st, &t.key).await?).into_response())
}

/// `DELETE /v1/tasks/{id}`.
#[utoipa::path(delete, path = "/v1/tasks/{id}", tag = "tasks", params(TaskId, OfPlugin),
    responses((status = 204, description = "cancelled"), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn cancel_task(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(of): Query<OfPlugin>,
) -> ApiResult<Response> {
    let t = resolve(&st, &caller, &id, of.plugin).await?;
    st.store
        .cancel(&t.key)
        .await?
        .map_err(|r| refused(&id, r))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/tasks/{id}/run`.
#[utoipa::path(post, path = "/v1/tasks/{id}/run", tag = "tasks", params(TaskId, OfPlugin),
    responses((status = 202, description = "due now", body = doc::ScheduledTask), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn run_now(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(of): Query<OfPlugin>,
) -> ApiResult<Response> {
    let t = resolve(&st, &caller, &id, of.plugin).await?;
    let at = st
        .store
        .move_task(&t.key, Move::Now)
        .await?
        .map_err(|r| refused(&id, r))?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({"id": id, "run_at": at})),
    )
        .into_response())
}
