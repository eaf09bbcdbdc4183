//! Plugin routes: upload (checked before it is stored), list, get, roll back, delete.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::body::{self, ApiResult};
use super::error::ApiError;
use crate::plugins::valid_plugin_name;
use crate::store::Rollback;

fn check_name(name: &str) -> ApiResult<()> {
    if valid_plugin_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad(format!(
            "{name:?} is not a plugin name: use [a-z0-9][a-z0-9-]{{0,63}}"
        )))
    }
}

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

pub async fn plugin_list(State(st): State<AppState>) -> ApiResult<Response> {
    Ok(axum::Json(st.store.plugin_list().await?).into_response())
}

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
