//! Recurring schedule routes: create or replace, list, get (with the next fire times), delete,
//! pause, resume.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::AppState;
use super::auth::plugin_in_scope;
use super::body::{self, ApiResult, field};
use super::doc;
use super::error::{ApiError, Concerns};
use crate::api::auth::Who;
use crate::recurring::{Overlap, ScheduleDef};
use eggtimer_base::access::Caller;
use eggtimer_base::limits;
use eggtimer_store::{ScheduleOp, SchedulePut, ScheduleRow};

/// Longest schedule id: its firings are `<id>@<ms>`, which must stay a valid task id.
const MAX_SCHEDULE_ID: usize = 184;

/// A schedule id in the path.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct ScheduleId {
    /// 1 to 184 bytes without control characters.
    #[param(
        min_length = 1,
        max_length = 184,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    id: String,
}

fn check_schedule_id(id: &str) -> ApiResult<()> {
    limits::id("the schedule id", id)?;
    if id.len() > MAX_SCHEDULE_ID {
        return Err(ApiError::bad(format!(
            "the schedule id must be 1 to {MAX_SCHEDULE_ID} bytes (its firings are <id>@<ms>)"
        )));
    }
    Ok(())
}

// The body of `PUT /v1/schedules/{id}`, each field bounded as it is read.
/// A recurring schedule: exactly one of `cron` and `every_ms`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec<'a> {
    #[serde(default, deserialize_with = "field::plugin")]
    #[schema(value_type = String, required = true, pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    plugin: Option<String>,
    #[serde(borrow)]
    #[schema(value_type = Option<Value>)]
    payload: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "field::string")]
    #[schema(value_type = Option<doc::CronExpr>)]
    cron: Option<String>,
    #[serde(default, deserialize_with = "field::int")]
    #[schema(minimum = 1000, maximum = 315360000000_i64)]
    every_ms: Option<i64>,
    /// An IANA time zone name (default "UTC").
    #[serde(default, deserialize_with = "field::string")]
    tz: Option<String>,
    #[serde(default, deserialize_with = "field::id")]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    owner: Option<String>,
    #[serde(default, deserialize_with = "field::time")]
    #[schema(minimum = 0, maximum = 253402300799999_i64)]
    start_at: Option<i64>,
    #[serde(default, deserialize_with = "field::time")]
    #[schema(minimum = 0, maximum = 253402300799999_i64)]
    end_at: Option<i64>,
    #[serde(default, deserialize_with = "field::max_attempts")]
    #[schema(minimum = 1, maximum = 1000)]
    max_attempts: Option<u32>,
    #[serde(default, deserialize_with = "overlap")]
    #[schema(value_type = Option<Overlap>)]
    overlap: Option<Overlap>,
    /// 0 (the default) to 9: each firing's priority (see the task spec's `priority`).
    #[serde(default, deserialize_with = "field::priority")]
    #[schema(minimum = 0, maximum = 9)]
    priority: Option<u8>,
}

/// `overlap`: skip or allow.
fn overlap<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Overlap>, D::Error> {
    use serde::de::Error;
    match field::string(d)?.as_deref() {
        None | Some("skip") => Ok(Some(Overlap::Skip)),
        Some("allow") => Ok(Some(Overlap::Allow)),
        Some(o) => Err(D::Error::custom(format!(
            "must be skip or allow, got {o:?}"
        ))),
    }
}

fn parse_schedule(bytes: &[u8], max_payload: usize) -> ApiResult<ScheduleDef> {
    let s: ScheduleSpec = body::typed(body::raw(bytes)?)?;
    let plugin = s
        .plugin
        .ok_or_else(|| ApiError::bad("plugin is required"))?;
    let payload = s.payload.map_or("null", |p| p.get());
    limits::payload("payload", payload, max_payload).map_err(|e| ApiError::too_large(e.0))?;
    let def = ScheduleDef {
        plugin,
        payload: payload.to_owned(),
        cron: s.cron,
        every_ms: s.every_ms,
        tz: s.tz.unwrap_or_else(|| "UTC".into()),
        owner: s.owner,
        start_at: s.start_at,
        end_at: s.end_at,
        max_attempts: s.max_attempts.unwrap_or(5),
        overlap: s.overlap.unwrap_or_default(),
        priority: s.priority.unwrap_or(0),
    };
    if def.cron.is_some() == def.every_ms.is_some() {
        return Err(ApiError::bad("give exactly one of cron and every_ms"));
    }
    if let Some(c) = &def.cron
        && !crate::recurring::is_cron_shaped(c)
    {
        return Err(ApiError::bad(format!(
            "cron must be 5 fields separated by spaces (minute hour day-of-month month day-of-week), got {c:?}"
        )));
    }
    if let Some(e) = def.every_ms
        && !(crate::recurring::MIN_EVERY_MS..=limits::MAX_DURATION_MS).contains(&e)
    {
        return Err(ApiError::bad(format!(
            "every_ms must be from {} to {} (10 years), got {e}",
            crate::recurring::MIN_EVERY_MS,
            limits::MAX_DURATION_MS
        )));
    }
    // well-formed but impossible: a cron expression or time zone that does not exist
    def.rule()
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_schedule", e))?;
    Ok(def)
}

/// A stored schedule as the API shows it (`upcoming`: also its next fire times).
fn view(row: &ScheduleRow, upcoming: usize) -> ApiResult<doc::ScheduleInfo> {
    let def: ScheduleDef = serde_json::from_str(&row.def)
        .map_err(|e| anyhow::anyhow!("schedule {:?} can't be read: {e}", row.id))?;
    let upcoming = (upcoming > 0).then(|| match row.next {
        Some(n) => std::iter::once(n)
            .chain(def.upcoming(n, upcoming - 1))
            .collect(),
        None => Vec::new(),
    });
    Ok(doc::ScheduleInfo {
        id: row.id.clone(),
        payload: serde_json::from_str(&def.payload).unwrap_or(Value::Null),
        plugin: def.plugin,
        cron: def.cron,
        every_ms: def.every_ms,
        tz: def.tz,
        owner: def.owner,
        start_at: def.start_at,
        end_at: def.end_at,
        max_attempts: def.max_attempts,
        overlap: def.overlap,
        priority: def.priority,
        paused: row.paused,
        next_run_at: row.next,
        last_task_id: row
            .last
            .as_deref()
            .map(|k| eggtimer_store::public_id(k).to_owned()),
        upcoming,
    })
}

/// The schedule, as this caller may see it: 404 for one of a plugin outside its key's scope.
async fn existing(st: &AppState, caller: &Caller, id: &str) -> ApiResult<ScheduleRow> {
    st.store
        .schedule_get(id)
        .await?
        .filter(|r| caller.sees(&plugin_of(r)))
        .ok_or_else(|| ApiError::not_found(format!("no schedule {id:?}")))
}

/// The plugin a stored schedule fires.
pub(super) fn plugin_of(row: &ScheduleRow) -> String {
    serde_json::from_str::<Value>(&row.def)
        .ok()
        .and_then(|v| v["plugin"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// 404 unless the schedule exists and is in the caller's scope (nothing read for a key that
/// sees every plugin).
async fn in_scope(st: &AppState, caller: &Caller, id: &str) -> ApiResult<()> {
    if caller.sees_all() {
        return Ok(());
    }
    existing(st, caller, id).await.map(|_| ())
}

/// `PUT /v1/schedules/{id}`: create (201) or replace (200); the same definition again changes
/// nothing (200, same next firing).
#[utoipa::path(put, path = "/v1/schedules/{id}", tag = "schedules", params(ScheduleId),
    request_body(content = ScheduleSpec, content_type = "application/json"),
    responses((status = 201, description = "created", body = doc::SchedulePutReply),
        (status = 200, description = "replaced, or unchanged", body = doc::SchedulePutReply), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn schedule_put(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    check_schedule_id(&id)?;
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, st.max_payload_bytes + (64 << 10)).await?;
    let def = parse_schedule(&bytes, st.max_payload_bytes)?;
    plugin_in_scope(&caller, &def.plugin)?;
    if !caller.sees_all()
        && let Some(row) = st.store.schedule_get(&id).await?
        && !caller.sees(&plugin_of(&row))
    {
        return Err(ApiError::forbidden(format!(
            "schedule {id:?} fires a plugin outside key {:?}'s scope: it can't be replaced with this key",
            caller.name
        )));
    }
    if !st.registry.exists(&def.plugin).await? {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_plugin",
            format!(
                "no plugin named {:?}; upload it with PUT /v1/plugins/{}",
                def.plugin, def.plugin
            ),
        ));
    }
    st.tasks
        .check_payloads(
            st.registry.as_ref(),
            &[(&def.plugin, &def.payload)],
            true,
            "the schedule was not saved",
        )
        .await?;
    let json = serde_json::to_string(&def).map_err(anyhow::Error::from)?;
    let next = def.next_after(st.store.clock().now_ms());
    let put = st.store.schedule_put(&id, &json, next).await?;
    let row = existing(&st, &caller, &id).await?;
    let status = if put == SchedulePut::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut res = (
        status,
        axum::Json(json!({"id": id, "next_run_at": row.next})),
    )
        .into_response();
    res.extensions_mut().insert(Concerns(def.plugin.clone()));
    Ok(res)
}

/// `GET /v1/schedules`.
#[utoipa::path(get, path = "/v1/schedules", tag = "schedules",
    responses((status = 200, description = "every schedule, by id", body = Vec<doc::ScheduleInfo>), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn schedule_list(State(st): State<AppState>, Who(caller): Who) -> ApiResult<Response> {
    let rows = st.store.schedule_list().await?;
    let list = rows
        .iter()
        .filter(|r| caller.sees(&plugin_of(r)))
        .map(|r| view(r, 0))
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(axum::Json(list).into_response())
}

/// `GET /v1/schedules/{id}`: the schedule with its next 5 fire times.
#[utoipa::path(get, path = "/v1/schedules/{id}", tag = "schedules", params(ScheduleId),
    responses((status = 200, description = "the schedule", body = doc::ScheduleInfo), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn schedule_get(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    check_schedule_id(&id)?;
    let row = existing(&st, &caller, &id).await?;
    Ok(axum::Json(view(&row, 5)?).into_response())
}

/// `DELETE /v1/schedules/{id}`: firings already created stay.
#[utoipa::path(delete, path = "/v1/schedules/{id}", tag = "schedules", params(ScheduleId),
    responses((status = 204, description = "deleted"), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn schedule_delete(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    check_schedule_id(&id)?;
    in_scope(&st, &caller, &id).await?;
    if st.store.schedule_op(&id, ScheduleOp::Delete).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found(format!("no schedule {id:?}")))
    }
}

/// `POST /v1/schedules/{id}/pause`.
#[utoipa::path(post, path = "/v1/schedules/{id}/pause", tag = "schedules", params(ScheduleId),
    responses((status = 200, description = "paused", body = doc::ScheduleInfo), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn schedule_pause(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    check_schedule_id(&id)?;
    in_scope(&st, &caller, &id).await?;
    if !st.store.schedule_op(&id, ScheduleOp::Pause).await? {
        return Err(ApiError::not_found(format!("no schedule {id:?}")));
    }
    Ok(axum::Json(view(&existing(&st, &caller, &id).await?, 5)?).into_response())
}

/// `POST /v1/schedules/{id}/resume`: fires next at its first fire time after now (firings
/// missed while paused are not made up).
#[utoipa::path(post, path = "/v1/schedules/{id}/resume", tag = "schedules", params(ScheduleId),
    responses((status = 200, description = "resumed", body = doc::ScheduleInfo), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn schedule_resume(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    check_schedule_id(&id)?;
    let row = existing(&st, &caller, &id).await?;
    let def: ScheduleDef = serde_json::from_str(&row.def)
        .map_err(|e| anyhow::anyhow!("schedule {id:?} can't be read: {e}"))?;
    let next = def.next_after(st.store.clock().now_ms());
    if !st.store.schedule_op(&id, ScheduleOp::Resume(next)).await? {
        return Err(ApiError::not_found(format!("no schedule {id:?}")));
    }
    Ok(axum::Json(view(&existing(&st, &caller, &id).await?, 5)?).into_response())
}
