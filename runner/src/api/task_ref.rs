//! A task as a route's path and query name it: the id, and `?plugin=` where plugins the key may
//! see each have a task of that id. Which task that is, the task service answers
//! ([`crate::tasks::Named`]).

use serde::Deserialize;

use super::body::ApiResult;
use super::params::plugin_filter;
use crate::tasks::Named;
use eggtimer_base::names::{PluginName, TaskId};

/// The plugin whose task the path's id names.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OfPlugin {
    /// The task's plugin. Needed only when plugins this key may see each have a task of this id
    /// (without it that is 409 `ambiguous_id`).
    #[param(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    pub plugin: Option<String>,
}

/// A path's task id and its `?plugin=`, each checked (400 when malformed).
pub struct TaskPath {
    id: TaskId,
    plugin: Option<PluginName>,
}

impl TaskPath {
    pub fn new(id: String, of: OfPlugin) -> ApiResult<TaskPath> {
        Ok(TaskPath {
            id: TaskId::new(id)?,
            plugin: plugin_filter(of.plugin)?,
        })
    }

    /// The task as the service is asked for it.
    pub fn named(&self) -> Named<'_> {
        Named {
            id: &self.id,
            plugin: self.plugin.as_ref(),
        }
    }

    pub fn id(&self) -> &TaskId {
        &self.id
    }
}
