//! An owner's tasks: a page of them, shift them all, cancel them all, pause and resume them.

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
use crate::api::auth::Who;
use eggtimer_base::access::Caller;
use eggtimer_store::TaskRecord;

/// `GET /v1/owners/{owner}/tasks?limit=&cursor=`: a page of the owner's scheduled tasks (an
/// array, soonest first); `X-Next-Cursor` names the next page when there may be one.
#[utoipa::path(get, path = "/v1/owners/{owner}/tasks", tag = "owners", params(OwnerName, PageQuery),
    responses((status = 200, description = "a page of the owner's scheduled tasks",
        body = Vec<eggtimer_store::TaskRecord>,
        headers(("x-next-cursor" = String, description = "the cursor of the next page, when there may be one"))),
        doc::Errors),
    security((), ("bearer" = [])))]
pub async fn owner_tasks(
    State(st): State<AppState>,
    Who(caller): Who,
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
    Who(caller): Who,
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
    Who(caller): Who,
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

/// Pause or resume an owner's tasks of one plugin (without it: of every plugin the key sees).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OwnerPauseBody {
    #[serde(default, deserialize_with = "field::plugin")]
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    plugin: Option<String>,
}

/// An owner's pauses after a pause or resume (and, for a resume, how many tasks it put back).
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct OwnerPaused {
    owner: String,
    paused: crate::tasks::OwnerPauses,
    #[serde(skip_serializing_if = "Option::is_none")]
    resumed: Option<u64>,
}

/// The plugin an owner's pause or resume names: an empty body, `null`, `{}` or `{"plugin"}`.
/// A body of anything else, white space alone too, is JSON to parse (400 where it isn't).
fn pause_plugin(
    headers: &HeaderMap,
    bytes: &[u8],
) -> ApiResult<Option<eggtimer_base::names::PluginName>> {
    if bytes.is_empty() {
        return Ok(None);
    }
    body::require_content_type(headers, "application/json")?;
    let raw = body::raw(bytes)?;
    if raw.get().trim() == "null" {
        return Ok(None);
    }
    let b: OwnerPauseBody = body::typed(raw)?;
    plugin_filter(b.plugin)
}

/// `POST /v1/owners/{owner}/pause` (body empty, `{}` or `{"plugin"}`): no runner starts the
/// owner's tasks (of that plugin) until they are resumed; they stay scheduled without using
/// attempts, and scheduling, moving and cancelling them still work. Running ones finish.
#[utoipa::path(post, path = "/v1/owners/{owner}/pause", tag = "owners", params(OwnerName),
    request_body(content = Option<OwnerPauseBody>, content_type = "application/json"),
    responses((status = 200, description = "the owner's pauses", body = OwnerPaused), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn owner_pause(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(owner): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    set_owner_paused(&st, &caller, owner, &headers, body, true).await
}

/// `POST /v1/owners/{owner}/resume` (body empty, `{}` or `{"plugin"}`): the owner's parked tasks
/// (of that plugin) are due again as they were, overdue ones at once; without a plugin, every
/// pause of the owner the key may end.
#[utoipa::path(post, path = "/v1/owners/{owner}/resume", tag = "owners", params(OwnerName),
    request_body(content = Option<OwnerPauseBody>, content_type = "application/json"),
    responses((status = 200, description = "the owner's pauses left, and how many tasks were put back", body = OwnerPaused), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn owner_resume(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(owner): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    set_owner_paused(&st, &caller, owner, &headers, body, false).await
}

/// A pause (`paused`) or resume of an owner's tasks, of the plugin the body names; a resume's
/// answer says how many tasks it put back.
async fn set_owner_paused(
    st: &AppState,
    caller: &Caller,
    owner: String,
    headers: &HeaderMap,
    body: Body,
    paused: bool,
) -> ApiResult<Response> {
    let owner = owner_named(owner)?;
    let bytes = body::read(body, SMALL_BODY).await?;
    let plugin = pause_plugin(headers, &bytes)?;
    let (resumed, pauses) = st
        .tasks
        .set_owner_paused(caller, &owner, plugin.as_ref(), paused)
        .await?;
    Ok(axum::Json(OwnerPaused {
        owner: owner.into_string(),
        paused: pauses,
        resumed: (!paused).then_some(resumed),
    })
    .into_response())
}

/// One owner's weight among a plugin's owners.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OwnerWeightBody {
    /// The owner's share of a claim's places against the other owners taking turns (1 to 1000;
    /// null or absent: 1). Past 10 only an admin, or under an admin's weight ceiling on the plugin.
    #[serde(
        default,
        deserialize_with = "super::fields::ranged::<_, 1, { super::fields::MAX_WEIGHT }>"
    )]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    weight: super::fields::Setting<i64>,
}

/// An owner's weight among a plugin's owners (1 unless set).
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct OwnerWeight {
    plugin: String,
    owner: String,
    weight: u32,
}

/// `PUT /v1/plugins/{name}/owners/{owner}` `{"weight": n | null}`: the owner's share of the
/// places when the plugin's owners take turns (a paying merchant's larger share).
#[utoipa::path(put, path = "/v1/plugins/{name}/owners/{owner}", tag = "owners",
    params(super::plugins::PluginName, OwnerName),
    request_body(content = OwnerWeightBody, content_type = "application/json"),
    responses((status = 200, description = "the owner's weight", body = OwnerWeight), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn owner_weight_put(
    State(st): State<AppState>,
    Who(caller): Who,
    Path((name, owner)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    super::plugins::check_name(&caller, &name)?;
    let owner = owner_named(owner)?;
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, SMALL_BODY).await?;
    let b: OwnerWeightBody = body::typed(body::raw(&bytes)?)?;
    // (absent or null: back to 1)
    let weight = b.weight.flatten().map(|w| w as u32);
    super::plugins::current(&st, &name).await?;
    if let Some(w) = weight
        && caller.role < eggtimer_base::access::Role::Admin
    {
        let ceiling = st
            .store
            .plugin_settings(&name)
            .await?
            .ceilings
            .and_then(|c| c.weight);
        let most = ceiling.unwrap_or(super::settings::DEVELOPER_MAX_WEIGHT as u32);
        if w > most {
            return Err(ApiError::forbidden(format!(
                "weight {w} is above {most}, the most a team may give an owner of {name:?} \
                 (an admin's weight ceiling on the plugin, else {})",
                super::settings::DEVELOPER_MAX_WEIGHT
            )));
        }
    }
    st.store.set_owner_weight(&name, &owner, weight).await?;
    Ok(axum::Json(OwnerWeight {
        plugin: name,
        owner: owner.into_string(),
        weight: weight.unwrap_or(1),
    })
    .into_response())
}

/// `GET /v1/plugins/{name}/owners/{owner}`: the owner's weight among the plugin's owners.
#[utoipa::path(get, path = "/v1/plugins/{name}/owners/{owner}", tag = "owners",
    params(super::plugins::PluginName, OwnerName),
    responses((status = 200, description = "the owner's weight", body = OwnerWeight), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn owner_weight_get(
    State(st): State<AppState>,
    Who(caller): Who,
    Path((name, owner)): Path<(String, String)>,
) -> ApiResult<Response> {
    super::plugins::check_name(&caller, &name)?;
    let owner = owner_named(owner)?;
    super::plugins::current(&st, &name).await?;
    let weight = st.store.owner_weight(&name, &owner).await?.unwrap_or(1);
    Ok(axum::Json(OwnerWeight {
        plugin: name,
        owner: owner.into_string(),
        weight,
    })
    .into_response())
}

/// One plugin's tasks of an owner.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct OwnerPluginCounts {
    plugin: String,
    /// Scheduled, including those waiting while the owner or the plugin is paused.
    scheduled: u64,
    /// Claimed by a runner and not finished.
    running: u64,
    dead: u64,
    /// What the plugin's `max_pending_per_owner` counts: the owner's tasks scheduled, running or
    /// dead as the shards keep count of them as they change (the three above, counted by a walk,
    /// may differ from it by tasks that changed state meanwhile; tasks an earlier release wrote
    /// are not in it).
    pending: u64,
}

/// `GET /v1/owners/{owner}/stats`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct OwnerStats {
    owner: String,
    /// The plugins the key sees that hold tasks of the owner, by name.
    plugins: Vec<OwnerPluginCounts>,
    /// Sums over `plugins`.
    scheduled: u64,
    running: u64,
    dead: u64,
    /// What of the owner is paused (of the plugins the key sees).
    paused: crate::tasks::OwnerPauses,
}

/// `GET /v1/owners/{owner}/stats`: the owner's scheduled, running and dead tasks per plugin (of
/// the plugins the key sees), and its pauses. Counted on every shard at the time of the call: a
/// task that changes state meanwhile may be counted in two states or none.
#[utoipa::path(get, path = "/v1/owners/{owner}/stats", tag = "owners", params(OwnerName),
    responses((status = 200, description = "the owner's tasks per plugin", body = OwnerStats), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn owner_stats(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(owner): Path<String>,
) -> ApiResult<Response> {
    let owner = owner_named(owner)?;
    let mut plugins = Vec::new();
    for c in st.store.owner_counts(&owner).await? {
        if !caller.sees(&c.plugin) {
            continue;
        }
        let pending = st.store.owner_pending(&c.plugin, &owner).await?;
        plugins.push(OwnerPluginCounts {
            plugin: c.plugin,
            scheduled: c.scheduled,
            running: c.running,
            dead: c.dead,
            pending,
        });
    }
    let mut paused = st.tasks.owner_pauses(&owner).await?;
    paused.plugins.retain(|p| caller.sees(p));
    let sum = |f: fn(&OwnerPluginCounts) -> u64| plugins.iter().map(f).sum();
    Ok(axum::Json(OwnerStats {
        owner: owner.into_string(),
        scheduled: sum(|c| c.scheduled),
        running: sum(|c| c.running),
        dead: sum(|c| c.dead),
        plugins,
        paused,
    })
    .into_response())
}
