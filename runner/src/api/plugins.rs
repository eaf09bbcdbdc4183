//! Plugin routes: upload (checked before it is stored), list, get, roll back, delete.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::auth::plugin_in_scope;
use super::body::{self, ApiResult};
use super::doc;
use super::error::ApiError;
use super::settings::{Caps, PluginPatch};
use crate::api::auth::Who;
use eggtimer_base::access::Caller;
use eggtimer_base::names::valid_plugin_name;
use eggtimer_base::plugin_settings::{DEFAULT_MAX_PENDING, PluginEntry, PluginSettings};

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

/// How an upload, promotion or rollback becomes current.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeployQuery {
    /// `false`: store the version as a candidate, not current (promote it later). Default
    /// `true`.
    #[param(value_type = Option<String>, pattern = "^(true|false)$")]
    promote: Option<String>,
    /// `true`: make it current even if its check refuses waiting tasks (audited).
    #[param(value_type = Option<String>, pattern = "^(true|false)$")]
    force: Option<String>,
}

/// A `true`/`false` query parameter (absent: `default`).
fn flag(name: &str, v: Option<&str>, default: bool) -> ApiResult<bool> {
    match v {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(ApiError::bad(format!(
            "{name} must be true or false; got {other:?}"
        ))),
    }
}

/// Whether a promotion or rollback is forced.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ForceQuery {
    /// `true`: make it current even if its check refuses waiting tasks (audited).
    #[param(value_type = Option<String>, pattern = "^(true|false)$")]
    force: Option<String>,
}

impl DeployQuery {
    /// (promote, force).
    pub(super) fn read(&self) -> ApiResult<(bool, bool)> {
        Ok((
            flag("promote", self.promote.as_deref(), true)?,
            flag("force", self.force.as_deref(), false)?,
        ))
    }
}

/// `PUT /v1/plugins/{name}`: the wasm binary; checked (compiled, contract fitted, and, with a
/// `check`, against every task waiting for the plugin) before it becomes current; 201 for a new
/// version, 200 when these bytes are already current.
#[utoipa::path(put, path = "/v1/plugins/{name}", tag = "plugins", params(PluginName, DeployQuery),
    request_body(content = doc::WasmBinary, content_type = "application/wasm",
        description = "a WebAssembly component built against wit/plugin.wit"),
    responses((status = 201, description = "a new version", body = doc::Uploaded),
        (status = 200, description = "already the current version", body = doc::Uploaded), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_upload(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(name): Path<String>,
    Query(q): Query<DeployQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    body::require_content_type(&headers, "application/wasm")?;
    check_name(&caller, &name)?;
    let (promote, force) = q.read()?;
    let wasm = body::read(body, st.max_plugin_bytes).await?;
    let share = super::ceilings::key_share(&st, &caller, &name).await?;
    use crate::plugins::UploadError as U;
    let uploaded = async {
        let team = Some(caller.key_id.as_str());
        let prepared = st.registry.prepare(&name, team, wasm.to_vec()).await?;
        // a new current version with a check reads the waiting tasks first
        let current = st.store.plugin_current(&name).await?;
        let replaces = current.is_some_and(|c| c.digest != prepared.loaded.digest);
        let mut refused = None;
        if promote && replaces && prepared.loaded.has_check() && !force {
            let found = super::deploy::check_waiting(&st, std::sync::Arc::clone(&prepared.loaded))
                .await
                .map_err(Refusal::Api)?;
            if found.failing > 0 {
                refused = Some(found);
            }
        }
        let candidate = !promote || refused.is_some();
        let (entry, created) = st.registry.store_version(prepared, team, candidate).await?;
        match refused {
            Some(found) => Err(Refusal::Api(super::deploy::incompatible(&entry, &found))),
            None => Ok((entry, created)),
        }
    };
    match uploaded.await {
        Ok((entry, created)) => {
            if let Some(share) = share {
                super::ceilings::give_share(&st, &name, share).await?;
            }
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok((
                status,
                axum::Json(json!({"name": entry.name, "version": entry.version,
                    "digest": entry.digest, "candidate": entry.candidate})),
            )
                .into_response())
        }
        Err(Refusal::Api(e)) => Err(e),
        Err(Refusal::Upload(e @ U::BadName(_))) => Err(ApiError::bad(e.to_string())),
        Err(Refusal::Upload(U::Invalid(reason))) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_plugin",
            reason,
        )),
        Err(Refusal::Upload(U::TooLarge(n, max))) => Err(ApiError::too_large(format!(
            "the plugin is {n} bytes; the limit is {max}"
        ))),
        Err(Refusal::Upload(U::Store(e))) => Err(e.into()),
    }
}

/// Why an upload was not made current.
enum Refusal {
    Upload(crate::plugins::UploadError),
    Api(ApiError),
}

impl From<crate::plugins::UploadError> for Refusal {
    fn from(e: crate::plugins::UploadError) -> Self {
        Refusal::Upload(e)
    }
}

impl From<anyhow::Error> for Refusal {
    fn from(e: anyhow::Error) -> Self {
        Refusal::Upload(crate::plugins::UploadError::Store(e))
    }
}

/// `GET /v1/plugins`.
#[utoipa::path(get, path = "/v1/plugins", tag = "plugins",
    responses((status = 200, description = "the current version of every plugin, with its settings", body = Vec<doc::PluginInfo>), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_list(State(st): State<AppState>, Who(caller): Who) -> ApiResult<Response> {
    let settings = st.store.plugin_settings_all().await?;
    let list: Vec<doc::PluginInfo> = st
        .store
        .plugin_list()
        .await?
        .iter()
        .filter(|e| caller.sees(&e.name))
        .map(|e| with_settings(&st, e, &settings.get(&e.name).cloned().unwrap_or_default()))
        .collect();
    Ok(axum::Json(list).into_response())
}

/// A version with the plugin's settings: the values that apply (each held under its
/// ceiling), and the ceilings.
fn with_settings(st: &AppState, e: &PluginEntry, s: &PluginSettings) -> doc::PluginInfo {
    let ceilings = s.ceilings.clone().unwrap_or_default();
    let d = st.store.policies().defaults();
    let s = s.effective(
        d.time_limit.as_millis() as u64,
        d.memory as u64,
        d.check_time_limit.as_millis() as u64,
    );
    doc::PluginInfo {
        name: e.name.clone(),
        version: e.version,
        digest: e.digest.clone(),
        size: e.size,
        uploaded_at: e.uploaded_at,
        uploaded_by: e.uploaded_by.clone(),
        previous: e.previous,
        paused: s.paused,
        max_concurrency: s.max_concurrency,
        max_concurrency_per_owner: s.max_concurrency_per_owner,
        rate_limit: s.rate_limit,
        owner_rate_limit: s.owner_rate_limit,
        weight: s.weight.unwrap_or(1),
        may_schedule: s.may_schedule.unwrap_or_default(),
        time_limit_ms: s.time_limit_ms,
        memory_bytes: s.memory_bytes,
        check_time_limit_ms: s.check_time_limit_ms,
        max_pending: s.max_pending.unwrap_or(DEFAULT_MAX_PENDING),
        max_pending_per_owner: s.max_pending_per_owner,
        allowed_hosts: s.allowed_hosts.unwrap_or_default(),
        config: s.config.unwrap_or_default(),
        ceilings,
    }
}

pub(super) async fn current(st: &AppState, name: &str) -> ApiResult<PluginEntry> {
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
    Ok(axum::Json(with_settings(st, &cur, &s)).into_response())
}

/// `POST /v1/plugins/{name}/pause`: no runner starts its tasks until it is resumed; they stay
/// scheduled without using attempts, and scheduling them still works.
#[utoipa::path(post, path = "/v1/plugins/{name}/pause", tag = "plugins", params(PluginName),
    responses((status = 200, description = "paused", body = doc::PluginInfo), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_pause(
    State(st): State<AppState>,
    Who(caller): Who,
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
    Who(caller): Who,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    set_paused(&st, &name, false).await
}

/// `PATCH /v1/plugins/{name}` `{"max_concurrency": n | null, "weight": n | null}`, either or
/// both: at most n runs at once across all runners of the namespace (null: no limit); the
/// plugin's share of workers when plugins compete, against the others' weights (null: 1).
#[utoipa::path(patch, path = "/v1/plugins/{name}", tag = "plugins", params(PluginName),
    request_body(content = PluginPatch, content_type = "application/json"),
    responses((status = 200, description = "the plugin with its settings", body = doc::PluginInfo), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_patch(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, 64 << 10).await?;
    let patch: PluginPatch = body::typed(body::raw(&bytes)?)?;
    // every field is checked before any is written; then each is written alone
    let caps = Caps {
        time_limit_ms: st.max_plugin_timeout_ms,
        check_time_limit_ms: st.max_check_timeout_ms,
        memory_bytes: st.max_plugin_memory,
        internal_hosts: st.internal_hosts.clone(),
    };
    let cur = current(&st, &name).await?;
    let settings = st.store.plugin_settings(&name).await?;
    let mut changes = patch.changes(&caller, caps, &settings)?;
    if let Some(c) = super::ceilings::share_given_back(&caller, &settings, &changes) {
        changes.push(c);
    }
    for (field, value) in &changes {
        st.store.set_setting(&name, field, value).await?;
    }
    st.registry.sync_settings().await?;
    Ok(axum::Json(with_settings(
        &st,
        &cur,
        &st.store.plugin_settings(&name).await?,
    ))
    .into_response())
}

/// `GET /v1/plugins/{name}`: the current version and the history.
#[utoipa::path(get, path = "/v1/plugins/{name}", tag = "plugins", params(PluginName),
    responses((status = 200, description = "the plugin", body = doc::PluginDetail), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_get(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    let cur = st
        .store
        .plugin_current(&name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no plugin {name:?}")))?;
    let history = st.store.plugin_history(&name).await?;
    let info = with_settings(&st, &cur, &st.store.plugin_settings(&name).await?);
    let here = st
        .registry
        .plugins()
        .get(&name)
        .filter(|l| l.digest == cur.digest);
    let check = here.as_ref().map(|l| l.has_check());
    let payload_schema = match here {
        Some(_) => st.registry.plugins().payload_schema(&name).await,
        None => None,
    };
    Ok(axum::Json(doc::PluginDetail {
        info,
        check,
        payload_schema,
        history,
    })
    .into_response())
}

/// `POST /v1/plugins/{name}/rollback`: the version that was current before the current one
/// became current (its `previous`) is current again, through the same check of the waiting
/// tasks as an upload; two rollbacks come back. A version 0.2.0 made current has no
/// `previous`: its rollback takes the newest version before it that is not a candidate.
#[utoipa::path(post, path = "/v1/plugins/{name}/rollback", tag = "plugins", params(PluginName, ForceQuery),
    responses((status = 200, description = "the version now current", body = eggtimer_base::plugin_settings::PluginEntry), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_rollback(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(name): Path<String>,
    Query(q): Query<ForceQuery>,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    let force = flag("force", q.force.as_deref(), false)?;
    let cur = current(&st, &name).await?;
    let history = st.store.plugin_history(&name).await?;
    let target = match cur.previous {
        Some(p) => history.into_iter().find(|e| e.version == p).ok_or_else(|| {
            ApiError::conflict(format!(
                "plugin {name:?} was v{p} before v{}, and v{p} is no longer kept (--keep-versions): promote a version its history lists",
                cur.version
            ))
        })?,
        None => history
            .into_iter()
            .find(|e| e.version < cur.version && !e.candidate)
            .ok_or_else(|| {
                ApiError::conflict(format!("plugin {name:?} has no previous version"))
            })?,
    };
    let e = super::deploy::make_current(&st, &target, Some(cur.version), force).await?;
    Ok(axum::Json(e).into_response())
}

/// The body of `POST /v1/plugins/{name}/promote`.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PromoteBody {
    /// The version to make current (a candidate, or any version still in the history).
    #[serde(default, deserialize_with = "body::field::int")]
    #[schema(value_type = u64, minimum = 1, required = true)]
    version: Option<i64>,
}

/// `POST /v1/plugins/{name}/promote`: makes a stored version (a candidate) current, through the
/// same check of the waiting tasks as an upload.
#[utoipa::path(post, path = "/v1/plugins/{name}/promote", tag = "plugins", params(PluginName, ForceQuery),
    request_body(content = PromoteBody, content_type = "application/json"),
    responses((status = 200, description = "the version now current", body = eggtimer_base::plugin_settings::PluginEntry), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_promote(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(name): Path<String>,
    Query(q): Query<ForceQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    let force = flag("force", q.force.as_deref(), false)?;
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, 4096).await?;
    let b: PromoteBody = body::typed(body::raw(&bytes)?)?;
    let version = b
        .version
        .ok_or_else(|| ApiError::bad("version is required"))?;
    let cur = current(&st, &name).await?;
    let target = st
        .store
        .plugin_history(&name)
        .await?
        .into_iter()
        .find(|e| i64::try_from(e.version) == Ok(version))
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "plugin {name:?} has no version {version} (GET /v1/plugins/{name} lists its history)"
            ))
        })?;
    if target.version == cur.version {
        return Ok(axum::Json(cur).into_response());
    }
    let e = super::deploy::make_current(&st, &target, Some(cur.version), force).await?;
    Ok(axum::Json(e).into_response())
}

/// What `DELETE /v1/plugins/{name}` does with the plugin's tasks.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// `cancel`: delete its scheduled and dead tasks with it. Without it a plugin that has any
    /// is not deleted (409).
    #[param(value_type = Option<String>, pattern = "^cancel$")]
    tasks: Option<String>,
}

/// `DELETE /v1/plugins/{name}`: the plugin and what is its (versions, settings, ceilings,
/// secrets, kv, concurrency and rate state, its recurring schedules, its done tasks and their
/// logs), so that a name uploaded again starts clean. While it has scheduled or dead tasks it is
/// 409 unless `?tasks=cancel`, which deletes them too (a run under way finishes).
#[utoipa::path(delete, path = "/v1/plugins/{name}", tag = "plugins", params(PluginName, DeleteQuery),
    responses((status = 204, description = "deleted"), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_delete(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(name): Path<String>,
    Query(q): Query<DeleteQuery>,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    let plugin = eggtimer_base::names::PluginName::new("plugin", name.as_str())?;
    let cancel = match q.tasks.as_deref() {
        None => false,
        Some("cancel") => true,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "tasks must be \"cancel\" (delete the plugin's tasks with it); got {other:?}"
            )));
        }
    };
    current(&st, &name).await?;
    if cancel {
        st.tasks.cancel_plugin(&plugin).await?;
    } else {
        let c = &st.store.plugin_counts(std::slice::from_ref(&name)).await?[0];
        if c.scheduled + c.dead > 0 {
            return Err(ApiError::conflict(format!(
                "plugin {name:?} has {} scheduled and {} dead tasks: cancel them first, or \
                 DELETE /v1/plugins/{name}?tasks=cancel to delete them with it",
                c.scheduled, c.dead
            )));
        }
    }
    if !st.registry.delete(&name).await? {
        return Err(ApiError::not_found(format!("no plugin {name:?}")));
    }
    // its schedules would fire into the next owner of the name, with their payloads
    for row in st.store.schedule_list().await? {
        if super::schedules::plugin_of(&row) == name {
            st.store
                .schedule_op(&row.id, eggtimer_store::ScheduleOp::Delete)
                .await?;
        }
    }
    // its done tasks (and, with `?tasks=cancel`, what was scheduled between the first pass and
    // the delete): nothing of its tasks is left for the next owner of the name to read
    st.tasks.cancel_plugin(&plugin).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
