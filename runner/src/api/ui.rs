//! The dashboard (`GET /ui/`): a page and its scripts, built into the binary (no Node.js to build
//! or run it, nothing fetched from elsewhere). It speaks the same /v1 API as everyone else; with
//! a token the page asks for it once and keeps it for the browser session. Charts are drawn by
//! uPlot 1.6.32 (MIT, from npm, `ui/uPlot.*`).

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

const INDEX: &str = include_str!("../../ui/index.html");
const APP_JS: &str = include_str!("../../ui/app.js");
const APP_CSS: &str = include_str!("../../ui/app.css");
const UPLOT_JS: &str = include_str!("../../ui/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../ui/uPlot.min.css");

fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // a new build serves new files: let the browser check each time (they are small)
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The dashboard's routes (open: the page asks for the token the /v1 routes need).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route(
            "/ui/",
            get(|| async { file("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { file("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { file("text/css; charset=utf-8", APP_CSS) }),
        )
        .route(
            "/ui/uPlot.iife.min.js",
            get(|| async { file("text/javascript; charset=utf-8", UPLOT_JS) }),
        )
        .route(
            "/ui/uPlot.min.css",
            get(|| async { file("text/css; charset=utf-8", UPLOT_CSS) }),
        )
}
