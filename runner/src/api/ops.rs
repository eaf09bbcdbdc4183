//! Operations routes: live runners, readiness, Prometheus metrics.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::body::ApiResult;
use crate::metrics::Gauges;

pub async fn runners(State(st): State<AppState>) -> ApiResult<Response> {
    Ok(axum::Json((st.runners)().await?).into_response())
}

pub async fn readyz(State(st): State<AppState>) -> ApiResult<Response> {
    st.store.ping().await?;
    Ok(axum::Json(json!({"ok": true})).into_response())
}

pub async fn metrics(State(st): State<AppState>) -> Response {
    let shards = st.store.shard_counts().await.unwrap_or_default();
    let runners = match (st.runners)().await {
        Ok(Value::Array(a)) => a.len(),
        _ => 0,
    };
    let g = Gauges {
        shards,
        plugins: st.registry.plugins().loaded(),
        owned_shards: (st.owned_shards)(),
        runners,
    };
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(&g),
    )
        .into_response()
}
