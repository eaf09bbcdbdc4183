//! A plugin's secrets: set, delete, list names. Values go in and never come out of the API.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::body::{self, ApiResult};
use super::doc;
use super::error::ApiError;
use super::plugins::check_name;
use crate::api::auth::Who;
use eggtimer_store::{MAX_SECRET_CHARS, valid_secret_name};

/// A plugin name and a secret's name in the path.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct SecretPath {
    #[param(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    name: String,
    #[param(pattern = "^[A-Za-z0-9_.-]{1,128}$")]
    key: String,
}

fn check_key(key: &str) -> ApiResult<()> {
    if valid_secret_name(key) {
        Ok(())
    } else {
        Err(ApiError::bad(format!(
            "{key:?} is not a secret name: use 1 to 128 of A-Z a-z 0-9 _ - ."
        )))
    }
}

fn no_key(st: &AppState) -> ApiResult<()> {
    if st.store.has_secrets_key() {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_secrets_key",
            "this runner has no secrets key: start it with --secrets-key-file (`eggtimer serve` with its private Redis makes one in its data dir)",
        ))
    }
}

/// A secret's value.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretBody {
    /// 1 to 65,536 characters; never shown again.
    #[schema(min_length = 1, max_length = 65536)]
    value: String,
}

/// `PUT /v1/plugins/{name}/secrets/{key}` `{"value": string}`: sets a secret, sealed with the
/// runner's secrets key; the plugin reads it with `secret(key)`.
#[utoipa::path(put, path = "/v1/plugins/{name}/secrets/{key}", tag = "plugins", params(SecretPath),
    request_body(content = SecretBody, content_type = "application/json"),
    responses((status = 204, description = "set"), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn secret_put(
    State(st): State<AppState>,
    Who(caller): Who,
    Path((name, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    check_key(&key)?;
    body::require_content_type(&headers, "application/json")?;
    // room for a value one character past the limit however JSON writes it (a character past
    // U+FFFF as an escaped surrogate pair, `\ud83d\ude00`, is twelve bytes), so that one is a
    // 400 naming the limit, not a 413
    let bytes = body::read(body, 12 * (MAX_SECRET_CHARS + 1) + 1024).await?;
    let SecretBody { value } = body::typed(body::raw(&bytes)?)?;
    if value.chars().count() > MAX_SECRET_CHARS {
        return Err(ApiError::bad(format!(
            "value: a secret is at most {MAX_SECRET_CHARS} characters"
        )));
    }
    if value.is_empty() {
        return Err(ApiError::bad(
            "value is empty: a secret is 1 byte or more (DELETE the secret to remove it)",
        ));
    }
    no_key(&st)?;
    st.store
        .plugin_current(&name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no plugin {name:?}")))?;
    st.store.secret_set(&name, &key, &value).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `DELETE /v1/plugins/{name}/secrets/{key}`.
#[utoipa::path(delete, path = "/v1/plugins/{name}/secrets/{key}", tag = "plugins", params(SecretPath),
    responses((status = 204, description = "deleted"), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn secret_delete(
    State(st): State<AppState>,
    Who(caller): Who,
    Path((name, key)): Path<(String, String)>,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    check_key(&key)?;
    if st.store.secret_delete(&name, &key).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found(format!(
            "plugin {name:?} has no secret {key:?}"
        )))
    }
}

/// `GET /v1/plugins/{name}/secrets`: the names of the plugin's secrets and when each was set.
#[utoipa::path(get, path = "/v1/plugins/{name}/secrets", tag = "plugins", params(super::plugins::PluginName),
    responses((status = 200, description = "names, never values", body = Vec<eggtimer_store::SecretInfo>), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn secret_list(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&caller, &name)?;
    // as for a PUT: a plugin that does not exist (or was deleted) has no secrets to list
    st.store
        .plugin_current(&name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no plugin {name:?}")))?;
    Ok(axum::Json(st.store.secret_list(&name).await?).into_response())
}
