//! The admin HTTP API (API.md): the only code that imports axum.
//!
//! A handler reads its request, checks who asks and what they may touch, calls the store, and
//! answers: each route and its OpenAPI annotation sit together, so the document can't drift
//! from what is served (ARCHITECTURE.md's codemap says which file holds which routes). Bodies are read as raw JSON and every field is checked on its own, so every 4xx names the
//! field that is wrong; every answer, 404 and 405 included, is JSON. A Redis that can't be reached
//! is a 503; any other failure is a 500 `internal` with the details in the log.

mod audit;
mod auth;
mod body;
mod ceilings;
mod checks;
mod deploy;
mod dry_run;
pub use dry_run::reply as dry_run_reply;
mod cursor;
mod dead;
pub(crate) mod doc;
mod document;
mod error;
mod events;
mod fields;
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
mod sources;
mod stats;
mod task_ref;
mod task_spec;
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

use auth::Roles;
pub use auth::{Access, KEY_CACHE};
pub use cursor::Cursors;
use eggtimer_base::access::Role;
pub use error::ApiError;
pub use ops::ScrapeCache;
pub use server::{HttpLimits, serve};
pub use task_spec::MAX_BATCH;

use crate::metrics::Metrics;
use crate::plugins::Registry;
use eggtimer_store::Store;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The one door for new tasks (scope, plugins, payload checks, budgets, the write, counts).
    pub tasks: crate::tasks::Tasks,
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
    /// The most a plugin's `check_time_limit_ms` may be unless an admin sets it.
    pub max_check_timeout_ms: u64,
    /// `--events-max-bytes`: what one key may publish within the event retention.
    pub events_max_bytes: u64,
    /// The most a plugin's `memory_bytes` may be unless an admin sets it.
    pub max_plugin_memory: u64,
    pub max_body_bytes: usize,
    /// Seals and opens page cursors.
    pub cursors: Arc<cursor::Cursors>,
    /// Hosts no team may let its plugin call (this runner's listen address, Redis's): only an
    /// admin may put them in `allowed_hosts`.
    pub internal_hosts: Vec<String>,
    /// Live-runner listing, filled in by the membership module.
    pub runners:
        Arc<dyn Fn() -> futures::future::BoxFuture<'static, anyhow::Result<Value>> + Send + Sync>,
    pub owned_shards: Arc<dyn Fn() -> usize + Send + Sync>,
}

/// The router with every route of API.md, each registered from its handler's OpenAPI annotation,
/// and `GET /v1/openapi.json` describing exactly those.
pub fn router(state: AppState) -> Router {
    let (router, doc) = documented(state.clone());
    let doc = Arc::new(document::finish(doc));
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
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::site_guard,
        ))
        .layer(middleware::map_response(json_errors))
        .with_state(state)
}

/// The documented routes (the bearer token guards the /v1 ones) and their OpenAPI document.
pub fn documented(state: AppState) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (v1, roles) = v1_routes();
    let v1 = v1
        .route_layer(middleware::from_fn_with_state(state.clone(), replicated))
        .route_layer(middleware::from_fn_with_state(
            (state, Arc::new(roles)),
            auth::guard,
        ));
    OpenApiRouter::with_openapi(document::ApiDoc::openapi())
        .merge(v1)
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .split_for_parts()
}

/// Every /v1 route, each with the role it needs declared where it is registered (the guard
/// refuses a route that has none). One path per `routes!`: it registers all its handlers on
/// each path it names.
fn v1_routes() -> (OpenApiRouter<AppState>, Roles) {
    use Role::{Admin, Developer, Operator, Reader};
    let mut roles = Roles::default();
    let r = OpenApiRouter::new();
    // tasks
    let r = roles.add(r, Operator, routes!(tasks::schedule));
    let r = roles.add(r, Reader, routes!(find::find_tasks));
    let r = roles.add(r, Reader, routes!(tasks::get_task));
    let r = roles.add(r, Operator, routes!(tasks::move_task, tasks::cancel_task));
    let r = roles.add(r, Operator, routes!(tasks::run_now));
    let r = roles.add(r, Developer, routes!(dry_run::dry_run));
    // an owner's tasks
    let r = roles.add(r, Reader, routes!(owners::owner_tasks));
    let r = roles.add(r, Reader, routes!(owners::owner_stats));
    let r = roles.add(r, Operator, routes!(owners::owner_cancel));
    let r = roles.add(r, Operator, routes!(owners::owner_shift));
    let r = roles.add(r, Operator, routes!(owners::owner_pause));
    let r = roles.add(r, Operator, routes!(owners::owner_resume));
    let r = roles.add(r, Reader, routes!(owners::owner_weight_get));
    let r = roles.add(r, Developer, routes!(owners::owner_weight_put));
    // dead letters
    let r = roles.add(r, Reader, routes!(dead::dead_list));
    let r = roles.add(r, Operator, routes!(dead::dead_drop_all));
    let r = roles.add(r, Operator, routes!(dead::dead_retry_all));
    let r = roles.add(r, Operator, routes!(dead::dead_retry));
    let r = roles.add(r, Operator, routes!(dead::dead_drop));
    // plugins, their settings and secrets
    let r = roles.add(r, Reader, routes!(plugins::plugin_list));
    let r = roles.add(r, Reader, routes!(plugins::plugin_get));
    let r = roles.add(
        r,
        Developer,
        routes!(
            plugins::plugin_upload,
            plugins::plugin_patch,
            plugins::plugin_delete
        ),
    );
    let r = roles.add(r, Developer, routes!(plugins::plugin_rollback));
    let r = roles.add(r, Developer, routes!(plugins::plugin_promote));
    let r = roles.add(r, Reader, routes!(secrets::secret_list));
    let r = roles.add(
        r,
        Developer,
        routes!(secrets::secret_put, secrets::secret_delete),
    );
    let r = roles.add(r, Operator, routes!(plugins::plugin_pause));
    let r = roles.add(r, Operator, routes!(plugins::plugin_resume));
    // recurring schedules
    let r = roles.add(r, Reader, routes!(schedules::schedule_list));
    let r = roles.add(r, Reader, routes!(schedules::schedule_get));
    let r = roles.add(
        r,
        Operator,
        routes!(schedules::schedule_put, schedules::schedule_delete),
    );
    let r = roles.add(r, Operator, routes!(schedules::schedule_pause));
    let r = roles.add(r, Operator, routes!(schedules::schedule_resume));
    // the runners, statistics, events
    let r = roles.add(r, Reader, routes!(ops::runners));
    let r = roles.add(r, Reader, routes!(stats::stats));
    let r = roles.add(r, Reader, routes!(stats::history));
    let r = roles.add(r, Reader, routes!(stats::events));
    let r = roles.add(r, Operator, routes!(events::publish));
    let r = roles.add(r, Reader, routes!(sources::source_list));
    let r = roles.add(r, Developer, routes!(sources::source_add));
    let r = roles.add(r, Developer, routes!(sources::source_delete));
    // keys (the admin's) and the audit (any key: its own entries)
    let r = roles.add(r, Admin, routes!(keys::key_create, keys::key_list));
    let r = roles.add(r, Admin, routes!(keys::key_delete, keys::key_update));
    let r = roles.add(r, Reader, routes!(audit::audit));
    (r, roles)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every /v1 route and method the API document describes has its role declared where it is
    /// registered; a reader may GET everything but the keys, which are the admin's alone.
    #[test]
    fn every_route_declares_its_role() {
        let (router, roles) = v1_routes();
        let doc = router.into_openapi();
        let mut seen = 0;
        for (path, item) in &doc.paths.paths {
            for method in auth::methods(item) {
                let role = roles
                    .of(&method, path)
                    .unwrap_or_else(|| panic!("{method} {path} is registered without a role"));
                if path.starts_with("/v1/keys") {
                    assert_eq!(role, Role::Admin, "{method} {path}");
                } else if method == axum::http::Method::GET {
                    assert_eq!(role, Role::Reader, "{method} {path}");
                } else {
                    assert!(role > Role::Reader, "{method} {path} changes something");
                }
                seen += 1;
            }
        }
        assert!(seen >= 35, "only {seen} routes described");
    }
}
