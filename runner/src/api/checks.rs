//! How a plugin's `check` that could not say answers, where the API asks it outside the task
//! service (a deploy's check of the waiting tasks, a dry run): as the service's own refusal
//! would (`crate::tasks::Refusal::Unchecked`).

use super::ApiError;
use crate::plugins::CheckError;
use crate::tasks::Refusal;

/// The check could not say: busy (503, try again) or broken (422, the plugin's check trapped or
/// ran too long: that team's request fails, nobody else's).
pub fn failed(at: &str, plugin: &str, e: CheckError, what: &'static str) -> ApiError {
    Refusal::Unchecked {
        at: at.to_owned(),
        plugin: plugin.to_owned(),
        why: e.into(),
        what,
    }
    .into()
}
