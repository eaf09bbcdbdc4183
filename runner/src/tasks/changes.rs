//! Changes to tasks that exist: which task an id names for a caller, then move, run now, cancel,
//! retry and drop; an owner's tasks shifted, cancelled, paused or resumed; every dead task retried or dropped; a
//! plugin's tasks cancelled with it.
//!
//! A task id belongs to its plugin: two plugins may each have a task `c-1`, and nothing done with
//! one reaches the other. An action on an id looks among the tasks of that id of the plugins the
//! caller's key may see (or of the one plugin the caller names): none is [`Refusal::NoTask`], one
//! is the task, more than one is [`Refusal::AmbiguousId`]. The answer is the same whether or not
//! a plugin the key can't see has a task of that id. Actions over many tasks (an owner's, every
//! dead one) touch only the plugins the key may see.

use super::{PluginChecks, Refusal, Tasks};
use eggtimer_base::access::Caller;
use eggtimer_base::names::{Owner, PluginName, TaskId};
use eggtimer_store::{DeadAction, Move, Refused, TaskRecord};

/// A task as a caller names it: its id, and its plugin where the caller says which.
#[derive(Clone, Copy, Debug)]
pub struct Named<'a> {
    pub id: &'a TaskId,
    pub plugin: Option<&'a PluginName>,
}

impl Tasks {
    /// The task `named` names for `caller` (its record without its log).
    pub async fn find(
        &self,
        caller: &Caller,
        plugins: &dyn PluginChecks,
        named: Named<'_>,
    ) -> Result<TaskRecord, Refusal> {
        let seen = self.visible(caller, plugins, named.plugin).await?;
        let mut found = self.store.tasks_of_id(named.id, &seen).await?;
        match found.len() {
            0 => Err(Refusal::NoTask {
                id: named.id.to_string(),
            }),
            1 => Ok(found.remove(0)),
            _ => {
                let mut plugins: Vec<String> = found.into_iter().map(|t| t.plugin).collect();
                plugins.sort_unstable();
                Err(Refusal::AmbiguousId {
                    id: named.id.to_string(),
                    plugins,
                })
            }
        }
    }

    /// The one plugin `plugin` names (refused outside the caller's key), or every plugin the
    /// key may see: those stored and those loaded here (from `--plugins-dir`).
    pub async fn visible(
        &self,
        caller: &Caller,
        plugins: &dyn PluginChecks,
        plugin: Option<&PluginName>,
    ) -> Result<Vec<String>, Refusal> {
        if let Some(p) = plugin {
            in_scope(caller, p)?;
            return Ok(vec![p.to_string()]);
        }
        let mut names: Vec<String> = self.store.plugin_names().await?;
        names.extend(plugins.loaded());
        names.retain(|n| caller.sees(n));
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }

    /// The task `named` names, with its log.
    pub async fn get(
        &self,
        caller: &Caller,
        plugins: &dyn PluginChecks,
        named: Named<'_>,
    ) -> Result<TaskRecord, Refusal> {
        let t = self.find(caller, plugins, named).await?;
        self.record(&t.key, named.id).await
    }

    /// The task `named` names as a run of it would read it: a debounced task with its window's
    /// payloads (a dry run's task).
    pub async fn as_run(
        &self,
        caller: &Caller,
        plugins: &dyn PluginChecks,
        named: Named<'_>,
    ) -> Result<TaskRecord, Refusal> {
        let mut t = self.find(caller, plugins, named).await?;
        let shard = self.store.shard_of(&t.key);
        self.store
            .load_windows(shard, std::slice::from_mut(&mut t))
            .await?;
        Ok(t)
    }

    /// Moves the task `named` names (to a time, by a shift, or to now): the task with its log
    /// after the move.
    pub async fn move_task(
        &self,
        caller: &Caller,
        plugins: &dyn PluginChecks,
        named: Named<'_>,
        how: Move,
    ) -> Result<TaskRecord, Refusal> {
        let (key, _) = self
            .change(caller, plugins, named, async |key| {
                self.store.move_task(key, how).await
            })
            .await?;
        self.record(&key, named.id).await
    }

    /// Makes the task `named` names due now: its new due time.
    pub async fn run_now(
        &self,
        caller: &Caller,
        plugins: &dyn PluginChecks,
        named: Named<'_>,
    ) -> Result<i64, Refusal> {
        self.change(caller, plugins, named, async |key| {
            self.store.move_task(key, Move::Now).await
        })
        .await
        .map(|(_, at)| at)
    }

    /// Cancels the scheduled task `named` names (with its listeners).
    pub async fn cancel(
        &self,
        caller: &Caller,
        plugins: &dyn PluginChecks,
        named: Named<'_>,
    ) -> Result<(), Refusal> {
        self.change(caller, plugins, named, async |key| {
            self.store.cancel(key).await
        })
        .await
        .map(drop)
    }

    /// Cancels a task of `plugin` for one of its runs (`also`: the other plugins the run may
    /// cancel the tasks of).
    pub async fn cancel_for_run(
        &self,
        id: &str,
        plugin: &str,
        also: &[String],
    ) -> Result<(), Refusal> {
        self.store
            .cancel_for_plugin(id, plugin, also)
            .await?
            .map_err(|why| unchangeable(id, why))
    }

    /// Replays the dead task `named` names, due now with its attempts reset: its due time.
    pub async fn retry(
        &self,
        caller: &Caller,
        plugins: &dyn PluginChecks,
        named: Named<'_>,
    ) -> Result<i64, Refusal> {
        self.change(caller, plugins, named, async |key| {
            self.store.revive(key).await
        })
        .await
        .map(|(_, at)| at)
    }

    /// Drops the dead task `named` names.
    pub async fn drop_dead(
        &self,
        caller: &Caller,
        plugins: &dyn PluginChecks,
        named: Named<'_>,
    ) -> Result<(), Refusal> {
        self.change(caller, plugins, named, async |key| {
            self.store.drop_dead(key).await
        })
        .await
        .map(drop)
    }

    /// Finds the task `named` names, then has `change` change it (one script on its key): its
    /// key and what the change answered, or why the task could not be changed so.
    async fn change<T>(
        &self,
        caller: &Caller,
        plugins: &dyn PluginChecks,
        named: Named<'_>,
        change: impl AsyncFnOnce(&str) -> anyhow::Result<Result<T, Refused>>,
    ) -> Result<(String, T), Refusal> {
        let t = self.find(caller, plugins, named).await?;
        let answer = change(&t.key)
            .await?
            .map_err(|why| unchangeable(named.id, why))?;
        Ok((t.key, answer))
    }

    /// Shifts an owner's scheduled tasks (of one plugin) by `shift_ms`, and its tasks claimed
    /// ahead (revoked from their runners): how many moved. A key that sees some plugins only
    /// shifts each of them in turn.
    pub async fn shift_owner(
        &self,
        caller: &Caller,
        owner: &Owner,
        shift_ms: i64,
        plugin: Option<&PluginName>,
    ) -> Result<u64, Refusal> {
        let mut moved = 0;
        let plugins = self.touched(caller, plugin).await?;
        for p in &plugins {
            moved += self
                .store
                .shift_owner(owner, shift_ms, p.as_deref())
                .await?
                .map_err(|why| Refusal::ShiftOutOfRange {
                    owner: owner.to_string(),
                    shift_ms,
                    moved,
                    why,
                })?;
        }
        // (each only while it runs under the claim found: one released since was shifted with
        // the scheduled ones or is left, never shifted twice)
        let ahead = self.store.claimed_ahead(Some(owner), &plugins).await?;
        let shifts = ahead
            .iter()
            .map(|(key, token)| self.store.move_claimed(key, *token, Move::Shift(shift_ms)));
        for shifted in futures::future::join_all(shifts).await {
            moved += u64::from(shifted?.is_ok());
        }
        Ok(moved)
    }

    /// Cancels an owner's scheduled tasks (of one plugin), and its tasks claimed ahead (revoked
    /// from their runners); running ones finish. How many.
    pub async fn cancel_owner(
        &self,
        caller: &Caller,
        owner: &Owner,
        plugin: Option<&PluginName>,
    ) -> Result<u64, Refusal> {
        let mut n = 0;
        let plugins = self.touched(caller, plugin).await?;
        for p in &plugins {
            n += self.store.cancel_owner(owner, p.as_deref()).await?;
        }
        let ahead = self.store.claimed_ahead(Some(owner), &plugins).await?;
        Ok(n + self.cancel_claimed_ahead(&ahead).await?)
    }

    /// Pauses (`paused`) or resumes an owner's tasks (of one plugin). Paused, no runner starts
    /// them; they stay scheduled without using attempts, and scheduling, moving and cancelling
    /// them still work. Resumed, its parked tasks nothing else holds are due again as they were
    /// (overdue ones start at once); without a plugin, a key that sees every plugin ends every
    /// pause of the owner. A key that sees some plugins pauses or resumes each of them. How many
    /// tasks were put back, and the pauses after.
    pub async fn set_owner_paused(
        &self,
        caller: &Caller,
        owner: &Owner,
        plugin: Option<&PluginName>,
        paused: bool,
    ) -> Result<(u64, OwnerPauses), Refusal> {
        let mut n = 0;
        for p in self.touched(caller, plugin).await? {
            n += self
                .store
                .set_owner_paused(owner, p.as_deref(), paused)
                .await?;
        }
        Ok((n, self.owner_pauses(owner).await?))
    }

    /// What of an owner is paused.
    pub async fn owner_pauses(&self, owner: &Owner) -> Result<OwnerPauses, Refusal> {
        let mut pauses = OwnerPauses::default();
        for p in self.store.owner_pauses(owner).await? {
            match p {
                None => pauses.all = true,
                Some(p) => pauses.plugins.push(p),
            }
        }
        Ok(pauses)
    }

    /// Retries or drops every dead task (of one plugin) the caller may touch. How many.
    pub async fn dead_all(
        &self,
        caller: &Caller,
        action: DeadAction,
        plugin: Option<&PluginName>,
    ) -> Result<u64, Refusal> {
        let mut n = 0;
        for p in self.touched(caller, plugin).await? {
            n += self.store.dead_all(action, p.as_deref()).await?;
        }
        Ok(n)
    }

    /// Deletes every task of `plugin` (scheduled, dead and done, with their logs and listeners)
    /// as the plugin is deleted, and revokes those claimed ahead (not started yet); a run under
    /// way finishes. The caller's right to delete the plugin is the plugin route's to check.
    pub async fn cancel_plugin(&self, plugin: &PluginName) -> anyhow::Result<u64> {
        let n = self.store.cancel_plugin(plugin).await?;
        // its tasks claimed ahead, not started: revoked, or they would start after the delete
        let ahead = self
            .store
            .claimed_ahead(None, &[Some(plugin.to_string())])
            .await?;
        Ok(n + self.cancel_claimed_ahead(&ahead).await?)
    }

    /// Cancels tasks claimed ahead (key and claim token each), each revoked from the runner
    /// holding it as a cancel by id is: how many were (one started meanwhile runs).
    async fn cancel_claimed_ahead(&self, ahead: &[(String, u64)]) -> anyhow::Result<u64> {
        let cancels = ahead.iter().map(|(key, _)| self.store.cancel(key));
        let mut n = 0;
        for cancelled in futures::future::join_all(cancels).await {
            n += u64::from(cancelled?.is_ok());
        }
        Ok(n)
    }

    /// The plugins an action over many tasks touches, one store call each: `[None]` for every
    /// plugin (a key that sees all, with no filter), else the filter (refused outside the key's
    /// scope) or every current plugin in the key's scope.
    async fn touched(
        &self,
        caller: &Caller,
        plugin: Option<&PluginName>,
    ) -> Result<Vec<Option<String>>, Refusal> {
        if let Some(p) = plugin {
            in_scope(caller, p)?;
            return Ok(vec![Some(p.to_string())]);
        }
        if caller.sees_all() {
            return Ok(vec![None]);
        }
        Ok(self
            .store
            .plugin_list()
            .await?
            .into_iter()
            .map(|e| e.name)
            .filter(|n| caller.sees(n))
            .map(Some)
            .collect())
    }

    /// The task stored under `key`, with its log (`id`: as the caller named it).
    async fn record(&self, key: &str, id: &str) -> Result<TaskRecord, Refusal> {
        self.store
            .get(key)
            .await?
            .ok_or_else(|| Refusal::NoTask { id: id.to_owned() })
    }
}

/// Refused unless the caller's key covers `plugin`.
fn in_scope(caller: &Caller, plugin: &PluginName) -> Result<(), Refusal> {
    match caller.refuses(plugin) {
        None => Ok(()),
        Some(why) => Err(Refusal::Forbidden {
            plugin: plugin.to_string(),
            why,
        }),
    }
}

/// Why the task `id` could not be changed (a task gone meanwhile is no task).
fn unchangeable(id: &str, why: Refused) -> Refusal {
    match why {
        Refused::Missing => Refusal::NoTask { id: id.to_owned() },
        why => Refusal::Unchangeable {
            id: id.to_owned(),
            why,
        },
    }
}

/// What of an owner is paused: all its tasks, or those of some plugins.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct OwnerPauses {
    /// Every task of the owner is paused.
    pub all: bool,
    /// The plugins whose tasks of the owner are paused (beside `all`).
    pub plugins: Vec<String>,
}
