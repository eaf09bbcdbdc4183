//! The admin HTTP API (API.md): the only code that imports axum.
//!
//! Files: `auth` (who asks, their role, Host and Origin, the audit), `keys` (API keys and the
//! audit's routes), `body` (reading and checking request bodies), `error` (the error reply), `tasks`,
//! `find` (filters), `owners`, `dead`, `plugins`, `schedules`, `ops`, `stats` (the routes), `ui`
//! (the dashboard's files), `params`
//! (ids, owners, filters and pages several routes take), `server` (the listener: connection cap, timeouts, shutdown).
//! Bodies are read as raw JSON and every field is checked on its own, so every 4xx names the
//! field that is wrong; every answer, 404 and 405 included, is JSON. A Redis that can't be reached
//! is a 503; any other failure is a 500 `internal` with the details in the log.

mod auth;
mod body;
mod dead;
mod doc;
mod error;
mod find;
mod keys;
mod ops;
mod owners;
mod params;
mod plugins;
mod schedules;
mod secrets;
mod server;
mod settings;
mod stats;
mod tasks;
mod ui;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::Value;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use auth::{Access, KEY_CACHE};
pub use error::ApiError;
pub use ops::ScrapeCache;
pub use server::{HttpLimits, serve};
pub use tasks::MAX_BATCH;

use crate::metrics::Metrics;
use crate::plugins::Registry;
use crate::store::Store;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// Keys, roles, Host and Origin checks, the audit.
    pub access: Arc<Access>,
    /// What `/metrics` read of Redis, for at most a second.
    pub scrape: Arc<ops::ScrapeCache>,
    pub max_payload_bytes: usize,
    pub max_plugin_bytes: usize,
    /// The most a plugin's `time_limit_ms` may be unless an admin sets it.
    pub max_plugin_timeout_ms: u64,
    /// The most a plugin's `memory_bytes` may be unless an admin sets it.
    pub max_plugin_memory: u64,
    pub max_body_bytes: usize,
    /// Live-runner listing, filled in by the membership module.
    pub runners:
        Arc<dyn Fn() -> futures::future::BoxFuture<'static, anyhow::Result<Value>> + Send + Sync>,
    pub owned_shards: Arc<dyn Fn() -> usize + Send + Sync>,
}

/// The router with every route of API.md, each registered from its handler's OpenAPI annotation,
/// and `GET /v1/openapi.json` describing exactly those.
pub fn router(state: AppState) -> Router {
    let (router, doc) = documented(state.clone());
    let doc = Arc::new(doc::finish(doc));
    router
        .route(
            "/v1/openapi.json",
            get(move || {
                let doc = Arc::clone(&doc);
                async move { axum::Json(doc.as_ref().clone()) }
            }),
        )
        .merge(ui::router())
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(middleware::map_response(json_errors))
        .with_state(state)
}

/// The documented routes (the bearer token guards the /v1 ones) and their OpenAPI document.
pub fn documented(state: AppState) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let v1 = OpenApiRouter::new()
        .routes(routes!(tasks::schedule, find::find_tasks))
        .routes(routes!(
            tasks::get_task,
            tasks::move_task,
            tasks::cancel_task
        ))
        .routes(routes!(tasks::run_now))
        .routes(routes!(owners::owner_tasks, owners::owner_cancel))
        .routes(routes!(owners::owner_shift))
        .routes(routes!(dead::dead_list, dead::dead_drop_all))
        .routes(routes!(dead::dead_retry_all))
        .routes(routes!(dead::dead_retry))
        .routes(routes!(dead::dead_drop))
        .routes(routes!(plugins::plugin_list))
        .routes(routes!(
            plugins::plugin_upload,
            plugins::plugin_get,
            plugins::plugin_patch,
            plugins::plugin_delete
        ))
        .routes(routes!(plugins::plugin_rollback))
        .routes(routes!(secrets::secret_list))
        .routes(routes!(secrets::secret_put, secrets::secret_delete))
        .routes(routes!(plugins::plugin_pause))
        .routes(routes!(plugins::plugin_resume))
        .routes(routes!(schedules::schedule_list))
        .routes(routes!(
            schedules::schedule_put,
            schedules::schedule_get,
            schedules::schedule_delete
        ))
        .routes(routes!(schedules::schedule_pause))
        .routes(routes!(schedules::schedule_resume))
        .routes(routes!(ops::runners))
        .routes(routes!(stats::stats))
        .routes(routes!(stats::history))
        .routes(routes!(stats::events))
        .routes(routes!(keys::key_create, keys::key_list))
        .routes(routes!(keys::key_delete))
        .routes(routes!(keys::audit))
        .route_layer(middleware::from_fn_with_state(state.clone(), replicated))
        .route_layer(middleware::from_fn_with_state(state, auth::guard));
    OpenApiRouter::with_openapi(doc::ApiDoc::openapi())
        .merge(v1)
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .split_for_parts()
}

/// With `--min-replicas-acked N`, a write this API acknowledges (a request other than GET that
/// succeeded) is on N replicas before the answer, else the answer is 503 `not_replicated` (the
/// write is on the master and may be lost in a failover; sending it again is safe).
async fn replicated(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let writes = req.method() != axum::http::Method::GET;
    let res = next.run(req).await;
    if !writes || !res.status().is_success() {
        return res;
    }
    match st.store.wait_replicas().await {
        Ok(None) => res,
        Ok(Some(acked)) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_replicated",
            format!(
                "the write is on the Redis master, but {acked} of the {} replicas asked for confirmed it in time: \
                 a failover now could lose it. Sending the same request again is safe",
                st.store.options().min_replicas_acked
            ),
        )
        .into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// Makes every error answer the JSON error body, whoever produced it (axum's own 405, a path or
/// query that does not decode, a timeout), keeping its status and its text as the message.
async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let (code, default) = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            ("method_not_allowed", "this route does not take that method")
        }
        StatusCode::REQUEST_TIMEOUT => ("timeout", "the request took too long"),
        StatusCode::PAYLOAD_TOO_LARGE => ("too_large", "the body is too large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ("unsupported_media_type", "wrong content type"),
        StatusCode::NOT_FOUND => ("not_found", "no such route"),
        s if s.is_server_error() => ("internal", "an internal error"),
        _ => ("bad_request", "the request is malformed"),
    };
    let message = if text.is_empty() {
        default.to_owned()
    } else {
        text
    };
    let mut out = ApiError::new(status, code, message).into_response();
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}
