//! An owner's tasks: a page of them, shift them all, cancel them all.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::body::{self, ApiResult, field};
use super::cursor::fill;
use super::doc;
use super::error::ApiError;
use super::params::{
    MAX_PAGE, OwnerName, PageQuery, PluginFilter, check_owner, owner_named, page_cursor,
    page_limit, page_place, plugin_filter,
};
use super::tasks::SMALL_BODY;
use crate::access::Caller;
use crate::store::TaskRecord;

/// `GET /v1/owners/{owner}/tasks?limit=&cursor=`: a page of the owner's scheduled tasks (an
/// array, soonest first); `X-Next-Cursor` names the next page when there may be one.
#[utoipa::path(get, path = "/v1/owners/{owner}/tasks", tag = "owners", params(OwnerName, PageQuery),
    responses((status = 200, description = "a page of the owner's scheduled tasks",
        body = Vec<crate::store::TaskRecord>,
        headers(("x-next-cursor" = String, description = "the cursor of the next page, when there may be one"))),
        doc::Errors),
    security((), ("bearer" = [])))]
pub async fn owner_tasks(
    State(st): State<AppState>,
    caller: Caller,
    Path(owner): Path<String>,
    Query(q): Query<PageQuery>,
) -> ApiResult<Response> {
    check_owner(&owner)?;
    let limit = page_limit(&q, MAX_PAGE)?;
    let route = format!("owner:{owner}");
    let cursor = page_cursor(&st, &route, &q).await?;
    let (store, owner) = (&st.store, &owner);
    let (tasks, next) = fill(
        limit,
        cursor,
        |t: &TaskRecord| caller.sees(&t.plugin),
        |t| (t.run_at, t.key.clone()),
        |c| async move { Ok(store.owner_tasks(owner, limit, c).await?) },
    )
    .await?;
    let mut resp = axum::Json(tasks).into_response();
    if let Some(c) = page_place(&st, &route, next).await?
        && let Ok(v) = HeaderValue::from_str(&c)
    {
        resp.headers_mut().insert("x-next-cursor", v);
    }
    Ok(resp)
}

/// Shift an owner's scheduled tasks (of one plugin).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShiftBody {
    #[serde(default, deserialize_with = "field::shift")]
    #[schema(value_type = i64, required = true, minimum = -315360000000_i64, maximum = 315360000000_i64)]
    shift_ms: Option<i64>,
    #[serde(default, deserialize_with = "field::plugin")]
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    plugin: Option<String>,
}

/// `POST /v1/owners/{owner}/shift`.
#[utoipa::path(post, path = "/v1/owners/{owner}/shift", tag = "owners", params(OwnerName),
    request_body(content = ShiftBody, content_type = "application/json"),
    responses((status = 200, description = "shifted", body = doc::Shifted), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn owner_shift(
    State(st): State<AppState>,
    caller: Caller,
    Path(owner): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let owner = owner_named(owner)?;
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, SMALL_BODY).await?;
    let b: ShiftBody = body::typed(body::raw(&bytes)?)?;
    let shift = b
        .shift_ms
        .ok_or_else(|| ApiError::bad("shift_ms is required"))?;
    let n = st
        .tasks
        .shift_owner(&caller, &owner, shift, plugin_filter(b.plugin)?.as_ref())
        .await?;
    Ok(axum::Json(json!({"shifted": n})).into_response())
}

/// `DELETE /v1/owners/{owner}/tasks?plugin=`: cancels all the owner's scheduled tasks (of one
/// plugin), in chunks; running tasks are left to finish.
#[utoipa::path(delete, path = "/v1/owners/{owner}/tasks", tag = "owners", params(OwnerName, PluginFilter),
    responses((status = 200, description = "cancelled", body = doc::Cancelled), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn owner_cancel(
    State(st): State<AppState>,
    caller: Caller,
    Path(owner): Path<String>,
    Query(f): Query<PluginFilter>,
) -> ApiResult<Response> {
    let owner = owner_named(owner)?;
    let plugin = plugin_filter(f.plugin)?;
    let n = st
        .tasks
        .cancel_owner(&caller, &owner, plugin.as_ref())
        .await?;
    Ok(axum::Json(json!({"cancelled": n})).into_response())
}
