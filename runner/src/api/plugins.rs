//! Plugin routes: upload (checked before it is stored), list, get, roll back, delete.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::body::{self, ApiResult};
use super::doc;
use super::error::ApiError;
use crate::plugins::valid_plugin_name;
use crate::store::Rollback;

/// A plugin name in the path.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct PluginName {
    #[param(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    name: String,
}

fn check_name(name: &str) -> ApiResult<()> {
    if valid_plugin_name(name) {
        Ok(())
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
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    body::require_content_type(&headers, "application/wasm")?;
    if !valid_plugin_name(&name) {
        return Err(ApiError::bad(format!(
            "{name:?} is not a plugin name: use [a-z0-9][a-z0-9-]{{0,63}}"
        )));
    }
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
pub async fn plugin_list(State(st): State<AppState>) -> ApiResult<Response> {
    Ok(axum::Json(st.store.plugin_list().await?).into_response())
}

/// `GET /v1/plugins/{name}`: the current version and the history.
#[utoipa::path(get, path = "/v1/plugins/{name}", tag = "plugins", params(PluginName),
    responses((status = 200, description = "the plugin", body = doc::PluginDetail), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_get(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&name)?;
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

/// `POST /v1/plugins/{name}/rollback`.
#[utoipa::path(post, path = "/v1/plugins/{name}/rollback", tag = "plugins", params(PluginName),
    responses((status = 200, description = "the version now current", body = crate::store::PluginEntry), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn plugin_rollback(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&name)?;
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
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&name)?;
    if st.registry.delete(&name).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found(format!("no plugin {name:?}")))
    }
}
