//! Payloads checked by the code that will run them: each plugin's `check` (see the `checked`
//! world) is asked about the payloads of the tasks a request schedules, before anything is
//! written.

use std::collections::BTreeMap;

use axum::http::StatusCode;

use super::body::ApiResult;
use super::{ApiError, AppState};
use crate::plugins::CheckError;
use crate::store::NewTask;

/// The current version of each plugin checks its specs' payloads (a plugin without `check`
/// takes any): the first one refused is 422 `invalid_payload`, naming the spec (`[3].payload`
/// in a batch, `payload` alone) and the plugin's message; nothing of the request is written.
pub async fn payloads(st: &AppState, specs: &[NewTask], single: bool) -> ApiResult<()> {
    let items: Vec<(&str, &str)> = specs
        .iter()
        .map(|t| (t.plugin.as_str(), t.payload.as_str()))
        .collect();
    check(st, &items, single, "nothing was scheduled").await
}

/// The current version of `plugin` checks one payload (a recurring schedule's), as
/// [`payloads`] does; `what` says what was not done.
pub async fn payload(st: &AppState, plugin: &str, payload: &str, what: &str) -> ApiResult<()> {
    check(st, &[(plugin, payload)], true, what).await
}

/// Each (plugin, payload) asked of its plugin, a call per plugin; the first refused by place.
async fn check(st: &AppState, items: &[(&str, &str)], single: bool, what: &str) -> ApiResult<()> {
    let plugins = st.registry.plugins();
    let mut by_plugin: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, (plugin, _)) in items.iter().enumerate() {
        by_plugin.entry(plugin).or_default().push(i);
    }
    let at = |i: usize| {
        if single {
            "payload".to_owned()
        } else {
            format!("[{i}].payload")
        }
    };
    let mut refused: Option<(usize, String)> = None;
    for (plugin, idx) in by_plugin {
        let payloads = idx.iter().map(|&i| items[i].1.to_owned()).collect();
        let verdicts = plugins
            .check(plugin, payloads)
            .await
            .map_err(|e| failed(&at(idx[0]), plugin, e, what))?;
        if let Some((i, m)) = idx
            .iter()
            .zip(verdicts)
            .find_map(|(&i, v)| v.map(|m| (i, m)))
            && refused.as_ref().is_none_or(|(j, _)| i < *j)
        {
            refused = Some((i, m));
        }
    }
    match refused {
        None => Ok(()),
        Some((i, m)) => {
            let plugin = items[i].0;
            Err(invalid(format!(
                "{}: {m} (plugin {plugin:?} can't read it); {what}",
                at(i)
            ))
            .concerning(plugin))
        }
    }
}

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
