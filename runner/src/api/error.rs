//! The error reply of every route: `{"error": {"code", "message"}}` with the status of API.md.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use eggtimer_base::limits::OutOfBounds;

/// An error reply.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// The plugin the refusal concerns (for the audit).
    pub concerns: Option<String>,
    /// More fields of the error object (`failing`, `examples` of a refused deploy).
    pub details: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The plugin a reply concerns, in its extensions: the audit records it.
#[derive(Clone, Debug)]
pub struct Concerns(pub String);

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            concerns: None,
            details: None,
        }
    }
    /// The same error, recorded in the audit as concerning `plugin`.
    pub fn concerning(mut self, plugin: &str) -> Self {
        self.concerns = Some(plugin.to_owned());
        self
    }
    /// The same error with more fields in its error object.
    pub fn with_details(mut self, details: serde_json::Map<String, serde_json::Value>) -> Self {
        self.details = Some(details);
        self
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
    pub fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            message,
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = self.details.unwrap_or_default();
        error.insert("code".into(), json!(self.code));
        error.insert("message".into(), json!(self.message));
        let mut res = (self.status, axum::Json(json!({ "error": error }))).into_response();
        if let Some(p) = self.concerns {
            res.extensions_mut().insert(Concerns(p));
        }
        res
    }
}

impl From<eggtimer_base::names::BadName> for ApiError {
    fn from(e: eggtimer_base::names::BadName) -> Self {
        ApiError::bad(e.0)
    }
}

impl From<OutOfBounds> for ApiError {
    fn from(e: OutOfBounds) -> Self {
        ApiError::bad(e.0)
    }
}

/// What a request refused because Redis is out of memory is told.
pub const FULL_MESSAGE: &str = "Redis is out of memory (maxmemory reached): nothing was written. \
     Tasks already scheduled are kept and run once memory is freed (delete data or raise maxmemory); \
     until then runners start no new tasks";

/// A store failure: Redis unreachable is 503 (the runner stays up and recovers on its own);
/// Redis out of memory is 507 (nothing was written; the same request succeeds once memory is
/// freed); anything else (a script error, an answer this runner does not know) is 500 `internal`, with
/// the details in the log.
impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        if eggtimer_store::is_full(&e) {
            tracing::warn!("redis is out of memory: {e:#}");
            ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "redis_full", FULL_MESSAGE)
        } else if eggtimer_store::is_unreachable(&e) {
            tracing::warn!("redis unreachable: {e:#}");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "redis_unavailable",
                format!("Redis is not available: {e:#}"),
            )
        } else {
            tracing::error!("internal error: {e:#}");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "an internal error; the runner's log has the details",
            )
        }
    }
}

/// A task the service would not schedule or change: each refusal with its status and code,
/// concerning its plugin where it has one.
impl From<crate::tasks::Refusal> for ApiError {
    fn from(r: crate::tasks::Refusal) -> Self {
        use crate::tasks::{Refusal, Unchecked};
        use eggtimer_store::Refused;
        let r = match r {
            Refusal::Failed(e) => return e.into(),
            r => r,
        };
        let plugin = r.plugin().map(str::to_owned);
        let (status, code) = match &r {
            Refusal::Failed(_) => unreachable!("answered above"),
            Refusal::OutOfScope { .. }
            | Refusal::Topic { .. }
            | Refusal::Forbidden { .. }
            | Refusal::NoPublish { .. } => (StatusCode::FORBIDDEN, "forbidden"),
            Refusal::EventBudget { .. } => (StatusCode::TOO_MANY_REQUESTS, "event_budget"),
            Refusal::NoTask { .. } => (StatusCode::NOT_FOUND, "not_found"),
            Refusal::AmbiguousId { .. } => (StatusCode::CONFLICT, "ambiguous_id"),
            Refusal::Unchangeable {
                why: Refused::OutOfRange,
                ..
            }
            | Refusal::ShiftOutOfRange { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
            Refusal::Unchangeable { .. } => (StatusCode::CONFLICT, "conflict"),
            Refusal::UnknownPlugin { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "unknown_plugin"),
            Refusal::MixedDebounce => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_task"),
            Refusal::InvalidPayload { .. }
            | Refusal::Unchecked {
                why: Unchecked::Failed(_),
                ..
            } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_payload"),
            Refusal::Unchecked {
                why: Unchecked::Busy(_),
                ..
            } => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
            Refusal::NotAdmitted(q) => (StatusCode::TOO_MANY_REQUESTS, q.code()),
            Refusal::Duplicate { .. } => (StatusCode::CONFLICT, "duplicate"),
            Refusal::Running { .. } | Refusal::DebouncedRunning { .. } => {
                (StatusCode::CONFLICT, "conflict")
            }
        };
        let mut e = ApiError::new(status, code, r.to_string());
        e.concerns = plugin;
        e
    }
}
