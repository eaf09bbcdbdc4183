//! Operations routes: live runners, readiness, Prometheus metrics.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::body::ApiResult;
use super::doc;
use super::error::{ApiError, FULL_MESSAGE};
use crate::metrics::Gauges;
use eggtimer_store::ShardCounts;

/// `GET /v1/runners`: the live runners of the namespace.
#[utoipa::path(get, path = "/v1/runners", tag = "operations",
    responses((status = 200, description = "live runners", body = Vec<eggtimer_store::RunnerInfo>), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn runners(State(st): State<AppState>) -> ApiResult<Response> {
    Ok(axum::Json((st.runners)().await?).into_response())
}

/// `GET /readyz`: 200 when Redis answers and takes writes; 503 `redis_unavailable` or
/// `redis_full` (out of memory: no task starts and none can be scheduled) saying why.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "ready", body = doc::Ok), doc::Errors))]
pub async fn readyz(State(st): State<AppState>) -> ApiResult<Response> {
    st.store.ping().await?;
    let full = st.store.full_shards().await?;
    if !full.is_empty() {
        let shards: Vec<String> = full.iter().map(u32::to_string).collect();
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "redis_full",
            format!("{FULL_MESSAGE} (shards {})", shards.join(", ")),
        ));
    }
    Ok(axum::Json(json!({"ok": true})).into_response())
}

/// `GET /metrics`: Prometheus text.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain"), doc::Errors))]
pub async fn metrics(State(st): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    if let Some(why) = st.access.metrics_refused(&headers) {
        return ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", why).into_response();
    }
    let scraped = st.scrape.read(&st).await;
    let g = Gauges {
        shards: scraped.shards,
        owners: scraped.owners,
        plugins: st.registry.plugins().loaded(),
        owned_shards: (st.owned_shards)(),
        runners: scraped.runners,
        idle_instances: st.registry.plugins().idle_instances(),
        compiles: st.registry.plugins().compiles(),
    };
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(&g),
    )
        .into_response()
}

/// What a scrape reads of Redis (every shard's counts, the owners with due tasks, the live
/// runners), kept for a second: scrapes, however many, cost Redis at most one read a second.
#[derive(Default)]
pub struct ScrapeCache(tokio::sync::Mutex<Option<(Instant, Scraped)>>);

/// One read of Redis for the metrics.
#[derive(Clone, Default)]
struct Scraped {
    shards: Vec<ShardCounts>,
    /// Owners with tasks due and not started, most first.
    owners: Vec<(String, u64)>,
    runners: usize,
}

impl ScrapeCache {
    const FRESH: Duration = Duration::from_secs(1);

    async fn read(&self, st: &AppState) -> Scraped {
        let mut cached = self.0.lock().await;
        if let Some((at, scraped)) = cached.as_ref()
            && at.elapsed() < Self::FRESH
        {
            return scraped.clone();
        }
        let scraped = Scraped {
            shards: st.store.shard_counts().await.unwrap_or_default(),
            owners: st.store.owner_backlog().await.unwrap_or_default(),
            runners: match (st.runners)().await {
                Ok(Value::Array(a)) => a.len(),
                _ => 0,
            },
        };
        *cached = Some((Instant::now(), scraped.clone()));
        scraped
    }
}

/// `GET /healthz`: 200 while the process runs.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "alive", body = doc::Ok)))]
pub async fn healthz() -> Response {
    axum::Json(json!({"ok": true})).into_response()
}
