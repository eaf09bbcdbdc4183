//! Dead letters: a page of them, replay or drop one, replay or drop all (of one plugin).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::body::ApiResult;
use super::cursor::fill;
use super::doc;
use super::error::ApiError;
use super::params::{
    PageQuery, PluginFilter, TaskId, page_cursor, page_limit, page_place, plugin_filter,
};
use super::task_ref::{OfPlugin, TaskPath};
use crate::api::auth::Who;
use eggtimer_store::DeadAction;
use eggtimer_store::TaskRecord;

/// `GET /v1/dead?limit=&cursor=`.
#[utoipa::path(get, path = "/v1/dead", tag = "dead letters", params(PageQuery),
    responses((status = 200, description = "a page of dead tasks", body = doc::DeadPage), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn dead_list(
    State(st): State<AppState>,
    Who(caller): Who,
    Query(q): Query<PageQuery>,
) -> ApiResult<Response> {
    let limit = page_limit(&q, 100)?;
    let cursor = page_cursor(&st, "dead", &q).await?;
    let store = &st.store;
    let (tasks, next) = fill(
        limit,
        cursor,
        |t: &TaskRecord| caller.sees(&t.plugin),
        |t| (t.finished_at.unwrap_or(0), t.key.clone()),
        |c| async move { Ok(store.dead(limit, c).await?) },
    )
    .await?;
    let next = page_place(&st, "dead", next).await?;
    Ok(axum::Json(json!({"tasks": tasks, "next_cursor": next})).into_response())
}

/// `POST /v1/dead/{id}/retry`.
#[utoipa::path(post, path = "/v1/dead/{id}/retry", tag = "dead letters", params(TaskId, OfPlugin),
    responses((status = 200, description = "due now", body = doc::ScheduledTask), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn dead_retry(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
    Query(of): Query<OfPlugin>,
) -> ApiResult<Response> {
    let t = TaskPath::new(id, of)?;
    let at = st
        .tasks
        .retry(&caller, st.registry.as_ref(), t.named())
        .await?;
    Ok(axum::Json(json!({"id": t.id(), "run_at": at})).into_response())
}

/// `DELETE /v1/dead/{id}`.
#[utoipa::path(delete, path = "/v1/dead/{id}", tag = "dead letters", params(TaskId, OfPlugin),
    responses((status = 204, description = "dropped"), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn dead_drop(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
    Query(of): Query<OfPlugin>,
) -> ApiResult<Response> {
    let t = TaskPath::new(id, of)?;
    st.tasks
        .drop_dead(&caller, st.registry.as_ref(), t.named())
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

// The body of `POST /v1/dead/retry`: one plugin's dead tasks, or (none) every plugin's.
/// Optionally, one plugin.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginOnly {
    #[serde(default, deserialize_with = "super::body::field::plugin")]
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    plugin: Option<String>,
}

/// `POST /v1/dead/retry` `{"plugin"?}`: replays every dead task (of one plugin): due now,
/// attempts reset.
#[utoipa::path(post, path = "/v1/dead/retry", tag = "dead letters",
    request_body(content = PluginOnly, content_type = "application/json"),
    responses((status = 200, description = "retried", body = doc::Retried), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn dead_retry_all(
    State(st): State<AppState>,
    Who(caller): Who,
    body: axum::body::Body,
) -> ApiResult<Response> {
    let bytes = super::body::read(body, 64 << 10).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad(
            "the body must be a JSON object: {} for every plugin, or {\"plugin\": name}",
        ));
    }
    let b: PluginOnly = super::body::typed(super::body::raw(&bytes)?)?;
    let plugin = plugin_filter(b.plugin)?;
    let n = st
        .tasks
        .dead_all(&caller, DeadAction::Retry, plugin.as_ref())
        .await?;
    Ok(axum::Json(json!({"retried": n})).into_response())
}

/// `DELETE /v1/dead?plugin=`: drops every dead task (of one plugin).
#[utoipa::path(delete, path = "/v1/dead", tag = "dead letters", params(PluginFilter),
    responses((status = 200, description = "dropped", body = doc::Dropped), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn dead_drop_all(
    State(st): State<AppState>,
    Who(caller): Who,
    Query(f): Query<PluginFilter>,
) -> ApiResult<Response> {
    let plugin = plugin_filter(f.plugin)?;
    let n = st
        .tasks
        .dead_all(&caller, DeadAction::Drop, plugin.as_ref())
        .await?;
    Ok(axum::Json(json!({"dropped": n})).into_response())
}
