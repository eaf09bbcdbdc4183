//! How a plugin's `check` that could not say answers, where the API asks it outside the task
//! service (a deploy's check of the waiting tasks, a dry run); the payloads of new tasks are
//! checked by the service (`crate::tasks`).

use axum::http::StatusCode;

use super::ApiError;
use crate::plugins::CheckError;

/// 422 `invalid_payload`.
pub fn invalid(message: String) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_payload", message)
}

/// The check could not say: busy (503, try again) or broken (422, the plugin's check trapped or
/// ran too long: that team's request fails, nobody else's).
pub fn failed(at: &str, plugin: &str, e: CheckError, what: &str) -> ApiError {
    match e {
        CheckError::Busy => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", e.to_string()),
        CheckError::Failed(m) => invalid(format!(
            "{at}: plugin {plugin:?} could not check it: {m}; {what}"
        )),
    }
    .concerning(plugin)
}
