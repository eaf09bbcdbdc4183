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
    let plugins = st.registry.plugins();
    let mut by_plugin: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, t) in specs.iter().enumerate() {
        by_plugin.entry(&t.plugin).or_default().push(i);
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
        let payloads = idx.iter().map(|&i| specs[i].payload.clone()).collect();
        let verdicts = plugins
            .check(plugin, payloads)
            .await
            .map_err(|e| failed(&at(idx[0]), plugin, e, "nothing was scheduled"))?;
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
        Some((i, m)) => Err(invalid(format!(
            "{}: {m} (plugin {:?} can't read it); nothing was scheduled",
            at(i),
            specs[i].plugin
        ))
        .concerning(&specs[i].plugin)),
    }
}

/// The current version of `plugin` checks one payload (a recurring schedule's): refused, 422
/// `invalid_payload` naming `payload` and the plugin's message; `what` says what was not done.
pub async fn payload(st: &AppState, plugin: &str, payload: &str, what: &str) -> ApiResult<()> {
    let verdicts = st
        .registry
        .plugins()
        .check(plugin, vec![payload.to_owned()])
        .await
        .map_err(|e| failed("payload", plugin, e, what))?;
    match verdicts.into_iter().next().flatten() {
        None => Ok(()),
        Some(m) => Err(invalid(format!(
            "payload: {m} (plugin {plugin:?} can't read it); {what}"
        ))
        .concerning(plugin)),
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
