//! Plugin routes: upload (checked before it is stored), list, get, roll back, delete.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::auth::plugin_in_scope;
use super::body::{self, ApiResult};
use super::doc;
use super::error::ApiError;
use crate::access::{Caller, MAX_PATTERNS, Role, covers, valid_pattern};
use crate::plugins::valid_plugin_name;
use crate::store::{
    DEFAULT_MAX_PENDING, MAX_MAX_PENDING, PluginEntry, PluginSettings, RateLimit, Rollback,
};

/// The largest weight a plugin may have (the smallest is 1, every plugin's default).
pub const MAX_WEIGHT: i64 = 1000;

/// A plugin name in the path.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct PluginName {
    #[param(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    name: String,
}

/// A plugin name in the caller's scope (403 naming it outside).
pub(super) fn check_name(caller: &Caller, name: &str) -> ApiResult<()> {
    if valid_plugin_name(name) {
        plugin_in_scope(caller, name)
    } else {
        Err(ApiError::bad(format!(
            "{name:?} is not a plugin name: use [a-z0-9][a-z0-9-]{{0,63}}"
        )))
    }
}

/// `PUT /v1/plugins/{name}`: the wasm binary; checked (compiled, contract fitted) before it is
/// stored; 201 for a new version, 200 when these bytes are already current.
#[utoipa::path(put, path = "/v1/plugins/{name}", tag = "plugins", params(PluginName),
    request_body(content = doc::WasmBinary, content_type = "application/wasm",
        description = "a WebAssembly component built against wit/plugin.wit"),
    responses((status = 201, description = "a new version", body = doc::Uploaded),
        (status = 200, description = "already the current version", body = doc::Uploaded), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_upload(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    body::require_content_type(&headers, "application/wasm")?;
    check_name(&caller, &name)?;
    let wasm = body::read(body, st.max_plugin_bytes).await?;
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

/// `GET /v1/plugins`.
#[utoipa::path(get, path = "/v1/plugins", tag = "plugins",
    responses((status = 200, description = "the current version of every plugin", body = Vec<crate::store::PluginEntry>), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_list(State(st): State<AppState>, caller: Caller) -> ApiResult<Response> {
    let settings = st.store.plugin_settings_all().await?;
    let list: Vec<serde_json::Value> = st
        .store
        .plugin_list()
        .await?
        .iter()
        .filter(|e| caller.sees(&e.name))
        .map(|e| with_settings(e, &settings.get(&e.name).cloned().unwrap_or_default()))
        .collect();
    Ok(axum::Json(list).into_response())
}

/// A version with the plugin's settings (paused, max_concurrency, weight).
fn with_settings(e: &PluginEntry, s: &PluginSettings) -> serde_json::Value {
    let mut v = serde_json::to_value(e).expect("serializes");
    v["paused"] = json!(s.paused);
    v["max_concurrency"] = json!(s.max_concurrency);
    v["max_concurrency_per_owner"] = json!(s.max_concurrency_per_owner);
    v["rate_limit"] = json!(s.rate_limit);
    v["weight"] = json!(s.weight.unwrap_or(1));
    v["may_schedule"] = json!(s.may_schedule.clone().unwrap_or_default());
    v["time_limit_ms"] = json!(s.time_limit_ms);
    v["memory_bytes"] = json!(s.memory_bytes);
    v["max_pending"] = json!(s.max_pending.unwrap_or(DEFAULT_MAX_PENDING));
    v["allowed_hosts"] = json!(s.allowed_hosts.clone().unwrap_or_default());
    v["config"] = json!(s.config.clone().unwrap_or_default());
    v
}

/// An `allowed_hosts` setting: origins, each checked and kept in lower case (null or []: none).
fn allowed_hosts(raw: &serde_json::value::RawValue) -> ApiResult<Option<Vec<String>>> {
    let list: Option<Vec<String>> = serde_json::from_str(raw.get()).map_err(|_| {
        ApiError::bad(
            "allowed_hosts must be a list of origins (`https://api.example.com`), or null",
        )
    })?;
    let Some(list) = list else { return Ok(None) };
    if list.len() > crate::plugins::MAX_ALLOWED_HOSTS {
        return Err(ApiError::bad(format!(
            "allowed_hosts lists at most {} origins",
            crate::plugins::MAX_ALLOWED_HOSTS
        )));
    }
    let list = list
        .iter()
        .map(|o| crate::plugins::valid_origin(o).map_err(ApiError::bad))
        .collect::<ApiResult<Vec<String>>>()?;
    Ok(Some(list).filter(|l| !l.is_empty()))
}

/// The longest name and value of a `config` entry (bytes).
const MAX_CONFIG_NAME: usize = 128;
const MAX_CONFIG_VALUE: usize = 4096;

/// A `config` setting: names to strings (null or {}: none).
fn config(
    raw: &serde_json::value::RawValue,
) -> ApiResult<Option<std::collections::BTreeMap<String, String>>> {
    let map: Option<std::collections::BTreeMap<String, String>> =
        serde_json::from_str(raw.get())
            .map_err(|_| ApiError::bad("config must be an object of names to strings, or null"))?;
    let Some(map) = map else { return Ok(None) };
    if map.len() > 64 {
        return Err(ApiError::bad("config holds at most 64 names"));
    }
    for (k, v) in &map {
        if k.is_empty() || k.len() > MAX_CONFIG_NAME || k.chars().any(char::is_control) {
            return Err(ApiError::bad(format!(
                "config: {k:?} is not a name (1 to {MAX_CONFIG_NAME} bytes, no control characters)"
            )));
        }
        if v.len() > MAX_CONFIG_VALUE {
            return Err(ApiError::bad(format!(
                "config: the value of {k:?} is longer than {MAX_CONFIG_VALUE} bytes"
            )));
        }
    }
    Ok(Some(map).filter(|m| !m.is_empty()))
}

/// A `may_schedule` setting: patterns (null: the plugin's own tasks only), each covered by
/// the caller's own patterns unless it is an admin.
fn may_schedule(
    caller: &Caller,
    raw: &serde_json::value::RawValue,
) -> ApiResult<Option<Vec<String>>> {
    let list: Option<Vec<String>> = serde_json::from_str(raw.get()).map_err(|_| {
        ApiError::bad(
            "may_schedule must be a list of plugin patterns (`order-*`, `pet-feed`), or null",
        )
    })?;
    let Some(list) = list else { return Ok(None) };
    if list.len() > MAX_PATTERNS {
        return Err(ApiError::bad(format!(
            "may_schedule lists at most {MAX_PATTERNS} patterns"
        )));
    }
    for p in &list {
        if !valid_pattern(p) {
            return Err(ApiError::bad(format!(
                "may_schedule: {p:?} is not a pattern (a plugin name, a prefix ending in `*`, or `*`)"
            )));
        }
        if caller.role < Role::Admin && !covers(&caller.plugins, p) {
            return Err(ApiError::forbidden(format!(
                "may_schedule: key {:?} may not let a plugin schedule {p:?}: its own plugins ({}) do not cover it",
                caller.name,
                caller.plugins.join(", ")
            )));
        }
    }
    // an empty list is the default (cjson would also store it as an object)
    Ok(Some(list).filter(|l| !l.is_empty()))
}

/// The most starts a rate limit may allow in its window, and the longest window (a day, ms).
pub const MAX_RATE: i64 = 1_000_000;
pub const MAX_RATE_WINDOW_MS: i64 = 86_400_000;

/// A `rate_limit` setting: `{"max": n, "per_ms": d}` (at most n starts in any d ms), or null.
fn rate_limit(raw: &serde_json::value::RawValue) -> ApiResult<Option<RateLimit>> {
    if raw.get().trim() == "null" {
        return Ok(None);
    }
    let b: std::collections::HashMap<String, &serde_json::value::RawValue> =
        body::object(raw, "", "rate_limit")?;
    if let Some(other) = b.keys().find(|k| !["max", "per_ms"].contains(&k.as_str())) {
        return Err(ApiError::bad(format!(
            "rate_limit: unknown field `{other}`, expected `max` and `per_ms`"
        )));
    }
    let field = |name: &str, hi: i64| -> ApiResult<i64> {
        let what = format!("rate_limit.{name}");
        match body::int(b.get(name).copied(), "", &what)? {
            Some(n) if (1..=hi).contains(&n) => Ok(n),
            Some(n) => Err(ApiError::bad(format!(
                "{what} must be an integer from 1 to {hi}; got {n}"
            ))),
            None => Err(ApiError::bad(format!("rate_limit needs `{name}`"))),
        }
    };
    Ok(Some(RateLimit {
        max: field("max", MAX_RATE)? as u32,
        per_ms: field("per_ms", MAX_RATE_WINDOW_MS)? as u64,
    }))
}

/// The longest time limit per run an admin may give a plugin (ms).
pub const MAX_TIME_LIMIT_MS: i64 = 3_600_000;
/// The smallest memory cap a plugin may have (bytes).
pub const MIN_MEMORY_BYTES: i64 = 1 << 20;

/// A setting the operator caps (`time_limit_ms`, `memory_bytes`, `max_pending`): from `lo` to
/// `hi`, at most `cap` (the runner's `flag`) unless the caller is an admin; null: the default.
fn capped(
    caller: &Caller,
    raw: &serde_json::value::RawValue,
    name: &str,
    (lo, hi): (i64, i64),
    (cap, flag): (u64, &str),
) -> ApiResult<Option<u64>> {
    match int_setting(raw, name, lo, hi)?.map(|n| n as u64) {
        Some(n) if n > cap && caller.role < Role::Admin => Err(ApiError::bad(format!(
            "{name} {n} is past the operator's cap of {cap} ({flag}): only an admin can set more"
        ))),
        n => Ok(n),
    }
}

/// An optional integer setting from `lo` to `hi` (at most u32): `Ok(None)` for null (its
/// default).
fn setting(
    raw: &serde_json::value::RawValue,
    name: &str,
    lo: i64,
    hi: i64,
) -> ApiResult<Option<u32>> {
    Ok(int_setting(raw, name, lo, hi)?.map(|n| n as u32))
}

/// An optional integer setting from `lo` to `hi`: `Ok(None)` for null (its default).
fn int_setting(
    raw: &serde_json::value::RawValue,
    name: &str,
    lo: i64,
    hi: i64,
) -> ApiResult<Option<i64>> {
    match body::int(Some(raw), "", name)? {
        None => Ok(None),
        Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
        Some(n) => Err(ApiError::bad(format!(
            "{name} must be an integer from {lo} to {hi}, or null; got {n}"
        ))),
    }
}

async fn current(st: &AppState, name: &str) -> ApiResult<PluginEntry> {
    st.store
        .plugin_current(name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no plugin {name:?}")))
}

/// Pauses or resumes a plugin: the setting first (what runners and the API show), then every
/// shard (what claims obey). Both are idempotent, so a failed call is made good by repeating it.
async fn set_paused(st: &AppState, name: &str, paused: bool) -> ApiResult<Response> {
    let cur = current(st, name).await?;
    st.store.set_paused(name, paused).await?;
    let s = st.store.plugin_settings(name).await?;
    Ok(axum::Json(with_settings(&cur, &s)).into_response())
}

/// `POST /v1/plugins/{name}/pause`: no runner starts its tasks until it is resumed; they stay
/// scheduled without using attempts, and scheduling them still works.
#[utoipa::path(post, path = "/v1/plugins/{name}/pause", tag = "plugins", params(PluginName),
    responses((status = 200, description = "paused", body = doc::PluginInfo), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_pause(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    set_paused(&st, &name, true).await
}

/// `POST /v1/plugins/{name}/resume`: every overdue task of the plugin runs at once, in due order.
#[utoipa::path(post, path = "/v1/plugins/{name}/resume", tag = "plugins", params(PluginName),
    responses((status = 200, description = "resumed", body = doc::PluginInfo), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_resume(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    set_paused(&st, &name, false).await
}

/// `PATCH /v1/plugins/{name}` `{"max_concurrency": n | null, "weight": n | null}`, either or
/// both: at most n runs at once across all runners of the namespace (null: no limit); the
/// plugin's share of workers when plugins compete, against the others' weights (null: 1).
#[utoipa::path(patch, path = "/v1/plugins/{name}", tag = "plugins", params(PluginName),
    request_body(content = doc::PluginPatch, content_type = "application/json"),
    responses((status = 200, description = "the plugin with its settings", body = doc::PluginInfo), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_patch(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, 64 << 10).await?;
    // `null` (no limit) and a missing field differ here, so the fields are read as a map
    let b: std::collections::HashMap<String, &serde_json::value::RawValue> =
        body::object(body::raw(&bytes)?, "", "the body")?;
    const FIELDS: [&str; 10] = [
        "max_concurrency",
        "max_concurrency_per_owner",
        "rate_limit",
        "weight",
        "may_schedule",
        "time_limit_ms",
        "memory_bytes",
        "max_pending",
        "allowed_hosts",
        "config",
    ];
    if let Some(other) = b.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad(format!(
            "unknown field `{other}`, expected one of `{}`",
            FIELDS.join("`, `")
        )));
    }
    // every field is checked before any is written; then each is written alone
    let mut changes = Vec::new();
    for field in FIELDS {
        let Some(raw) = b.get(field) else { continue };
        let value = match field {
            "max_concurrency" | "max_concurrency_per_owner" => {
                json!(setting(raw, field, 1, 100_000)?)
            }
            "weight" => json!(setting(raw, field, 1, MAX_WEIGHT)?),
            "rate_limit" => json!(rate_limit(raw)?),
            "may_schedule" => json!(may_schedule(&caller, raw)?),
            "time_limit_ms" => {
                let cap = (st.max_plugin_timeout_ms, "--max-plugin-timeout");
                json!(capped(&caller, raw, field, (1, MAX_TIME_LIMIT_MS), cap)?)
            }
            "memory_bytes" => {
                let cap = (st.max_plugin_memory, "--max-plugin-memory");
                let hi = crate::plugins::MAX_MEMORY_BYTES as i64;
                json!(capped(&caller, raw, field, (MIN_MEMORY_BYTES, hi), cap)?)
            }
            "max_pending" => {
                let cap = (DEFAULT_MAX_PENDING, "the default");
                let range = (1, MAX_MAX_PENDING as i64);
                json!(capped(&caller, raw, field, range, cap)?)
            }
            "allowed_hosts" => json!(allowed_hosts(raw)?),
            "config" => json!(config(raw)?),
            other => return Err(ApiError::bad(format!("unknown field `{other}`"))),
        };
        changes.push((field, value));
    }
    let cur = current(&st, &name).await?;
    for (field, value) in &changes {
        st.store.set_setting(&name, field, value).await?;
    }
    st.registry.sync_settings().await?;
    let s = st.store.plugin_settings(&name).await?;
    Ok(axum::Json(with_settings(&cur, &s)).into_response())
}

/// `GET /v1/plugins/{name}`: the current version and the history.
#[utoipa::path(get, path = "/v1/plugins/{name}", tag = "plugins", params(PluginName),
    responses((status = 200, description = "the plugin", body = doc::PluginDetail), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_get(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    let cur = st
        .store
        .plugin_current(&name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no plugin {name:?}")))?;
    let history = st.store.plugin_history(&name).await?;
    let mut v = with_settings(&cur, &st.store.plugin_settings(&name).await?);
    v["history"] = serde_json::to_value(history).expect("serializes");
    Ok(axum::Json(v).into_response())
}

/// `POST /v1/plugins/{name}/rollback`.
#[utoipa::path(post, path = "/v1/plugins/{name}/rollback", tag = "plugins", params(PluginName),
    responses((status = 200, description = "the version now current", body = crate::store::PluginEntry), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_rollback(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    match st.registry.rollback(&name).await? {
        Rollback::Done(e) => Ok(axum::Json(e).into_response()),
        Rollback::Missing => Err(ApiError::not_found(format!("no plugin {name:?}"))),
        Rollback::NoPrevious => Err(ApiError::conflict(format!(
            "plugin {name:?} has no previous version"
        ))),
    }
}

/// `DELETE /v1/plugins/{name}`.
#[utoipa::path(delete, path = "/v1/plugins/{name}", tag = "plugins", params(PluginName),
    responses((status = 204, description = "deleted"), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_delete(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    if st.registry.delete(&name).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found(format!("no plugin {name:?}")))
    }
}
