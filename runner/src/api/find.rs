//! Finding tasks and acting on many: `GET /v1/tasks` with filters, an owner's tasks cancelled at
//! once, every dead letter retried or dropped.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::plugin_in_scope;
use super::body::ApiResult;
use super::cursor::fill;
use super::doc;
use super::error::ApiError;
use super::params::{check_owner, page_limit_of, plugin_filter};
use crate::api::auth::Who;
use eggtimer_base::limits;
use eggtimer_base::names::PluginName;
use eggtimer_store::{FindCursor, FindQuery, TaskRecord, TaskState};

/// The filters of `GET /v1/tasks` (all optional; they combine).
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FindParams {
    #[param(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    plugin: Option<String>,
    /// scheduled | running | dead | done; without it the states come one after another.
    #[param(pattern = "^(scheduled|running|dead|done)$")]
    state: Option<String>,
    /// 1 to 200 bytes without control characters.
    #[param(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    owner: Option<String>,
    /// Due at or after (ms).
    #[param(value_type = Option<i64>, minimum = 0, maximum = 253402300799999_i64)]
    due_after: Option<String>,
    /// Due at or before (ms).
    #[param(value_type = Option<i64>, minimum = 0, maximum = 253402300799999_i64)]
    due_before: Option<String>,
    /// 1 to 1000 (default 100).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
    /// The `next_cursor` of the previous page, as it came (empty: the first page).
    #[param(pattern = "^([A-Za-z0-9_-]{54,1000})?$")]
    cursor: Option<String>,
}

fn time_param(v: Option<&str>, name: &str) -> ApiResult<Option<i64>> {
    match v {
        None => Ok(None),
        Some(v) => {
            let t = v
                .parse::<i64>()
                .map_err(|_| ApiError::bad(format!("{name} must be an integer (ms), got {v:?}")))?;
            Ok(Some(limits::time(name, t)?))
        }
    }
}

/// `GET /v1/tasks`: a page of the tasks matching the filters. Scheduled and running tasks come
/// soonest due first, dead and done most recent first. A page may hold fewer than `limit` tasks
/// (even none) when filters skip very many: the walk ends when `next_cursor` is null.
#[utoipa::path(get, path = "/v1/tasks", tag = "tasks", params(FindParams),
    responses((status = 200, description = "a page of tasks", body = doc::TaskPage), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn find_tasks(
    State(st): State<AppState>,
    Who(caller): Who,
    Query(p): Query<FindParams>,
) -> ApiResult<Response> {
    let state = match p.state.as_deref() {
        None => None,
        Some("scheduled") => Some(TaskState::Scheduled),
        Some("running") => Some(TaskState::Running),
        Some("dead") => Some(TaskState::Dead),
        Some("done") => Some(TaskState::Done),
        Some(other) => {
            return Err(ApiError::bad(format!(
                "state must be scheduled, running, dead or done, got {other:?}"
            )));
        }
    };
    let owner = p.owner;
    if let Some(o) = &owner {
        check_owner(o)?;
    }
    let q = FindQuery {
        plugin: plugin_filter(p.plugin)?.map(PluginName::into_string),
        state,
        owner,
        due_after: time_param(p.due_after.as_deref(), "due_after")?,
        due_before: time_param(p.due_before.as_deref(), "due_before")?,
        limit: page_limit_of(p.limit.as_deref(), 100)?,
    };
    let cursor = match p.cursor.as_deref().filter(|c| !c.is_empty()) {
        None => None,
        Some(c) => {
            let place = st.cursors.open("find", c).await?;
            let c = FindCursor::decode(&place)
                .ok_or_else(|| ApiError::bad("cursor is not one this route returned"))?;
            Some(c)
        }
    };
    if let Some(p) = &q.plugin {
        plugin_in_scope(&caller, p)?;
    }
    // a key that sees some plugins gets theirs only, the page filled past the others' tasks
    let (store, query) = (&st.store, &q);
    let (tasks, next) = fill(
        q.limit,
        cursor,
        |t: &TaskRecord| caller.sees(&t.plugin),
        FindCursor::of,
        |c| async move { Ok(store.find(query, c).await?) },
    )
    .await?;
    let next = match next {
        Some(c) => Some(st.cursors.seal("find", &c.encode()).await?),
        None => None,
    };
    Ok(axum::Json(json!({"tasks": tasks, "next_cursor": next})).into_response())
}
