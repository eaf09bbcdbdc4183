//! Which task a path's id names for the caller.
//!
//! A task id belongs to its plugin: two plugins may each have a task `c-1`, and nothing done with
//! one reaches the other. A route that takes an id looks among the tasks of that id of the
//! plugins the caller's key may see (or of the one `?plugin=` names): none is 404, one is the
//! task, more than one is 409 `ambiguous_id` asking for `?plugin=`. The answer is the same
//! whether or not a plugin the key can't see has a task of that id.

use axum::http::StatusCode;
use serde::Deserialize;

use super::AppState;
use super::auth::plugin_in_scope;
use super::body::ApiResult;
use super::error::ApiError;
use super::params::{check_id, plugin_filter};
use crate::access::Caller;
use crate::store::TaskRecord;

/// The plugin whose task the path's id names.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OfPlugin {
    /// The task's plugin. Needed only when plugins this key may see each have a task of this id
    /// (without it that is 409 `ambiguous_id`).
    #[param(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    pub plugin: Option<String>,
}

/// The task `id` names for `caller`, `plugin` if given (its record without its log).
pub async fn resolve(
    st: &AppState,
    caller: &Caller,
    id: &str,
    plugin: Option<String>,
) -> ApiResult<TaskRecord> {
    check_id(id)?;
    let plugins = plugins_named(st, caller, plugin).await?;
    let mut found = st.store.tasks_of_id(id, &plugins).await?;
    match found.len() {
        0 => Err(ApiError::not_found(format!("no task {id:?}"))),
        1 => Ok(found.remove(0)),
        _ => {
            let mut names: Vec<&str> = found.iter().map(|t| t.plugin.as_str()).collect();
            names.sort_unstable();
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "ambiguous_id",
                format!(
                    "plugins {} each have a task {id:?}; name one with ?plugin=",
                    names.join(", ")
                ),
            ))
        }
    }
}

/// The one plugin `plugin` names (403 outside the caller's key), or every plugin the key may see.
pub async fn plugins_named(
    st: &AppState,
    caller: &Caller,
    plugin: Option<String>,
) -> ApiResult<Vec<String>> {
    match plugin_filter(plugin)? {
        Some(p) => {
            plugin_in_scope(caller, &p)?;
            Ok(vec![p])
        }
        None => plugins_seen(st, caller).await,
    }
}

/// Every plugin the caller's key may see: those in the registry and those loaded here (from
/// `--plugins-dir`).
async fn plugins_seen(st: &AppState, caller: &Caller) -> ApiResult<Vec<String>> {
    let mut names: Vec<String> = st.store.plugin_names().await?;
    names.extend(st.registry.plugins().loaded().into_iter().map(|(n, ..)| n));
    names.retain(|n| caller.sees(n));
    names.sort_unstable();
    names.dedup();
    Ok(names)
}
