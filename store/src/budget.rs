//! The task bytes a team's plugins make Redis hold, bounded by the team's key's `task_bytes`
//! (an admin's) or else `--team-task-bytes`.
//!
//! A team is the key that uploaded a plugin (a plugin the runner loaded from its directory is a
//! team of its own). Every script that writes a record's payload field or deletes a record
//! charges the difference to the record's plugin, per shard (`by:<plugin>` in the shard's
//! `meta`, see `weight` in `lua/lib/record.lua`): its payload, the events it listens for, the
//! event that reached it, and a debounced task's lists of payloads. So the count follows what
//! Redis holds, through every path that schedules, merges, fires, delivers, finishes, expires or
//! cancels a task, whoever asked (a request, a follow-up, a schedule's firing, an event).
//!
//! New tasks are admitted against it with the other limits (`Store::admit`), before anything is
//! written: a team's count is read from every shard at most every 250 ms and what this store
//! admitted since is added to it, so runners admitting at once may pass it together by what they
//! admit within those 250 ms (as with the default `max_pending`). Records 0.2.0 wrote count from
//! their first rewrite; deleting one that never counted takes a plugin's count no lower than 0.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::future::try_join_all;

use super::{NewTask, Store};

/// How long a read of a team's bytes is trusted.
const FRESH: Duration = Duration::from_millis(250);

/// What a task's record holds beside its payload, as admission reckons it (its extras' marks,
/// a listening stamp, a debounce window's parameters); the scripts charge what they write.
const RECORD_EXTRAS: usize = 48;

/// The teams and what they hold, shared by every store opened from one.
#[derive(Default)]
pub(super) struct Budgets {
    /// Each plugin's team (the key that uploaded its current version), as the registry loaded it.
    teams: RwLock<HashMap<String, String>>,
    /// Each team's bytes as last read, and what was admitted since.
    held: Mutex<HashMap<String, Held>>,
    /// Each team's plugins' kv and emitted bytes as last read (`run_room.rs`).
    pub(super) runs: super::run_room::RunBytes,
}

struct Held {
    read: u64,
    admitted: u64,
    at: Instant,
    /// The team's key's own `task_bytes`, read with the count (None: the flag).
    own_limit: Option<u64>,
}

/// A schedule refused because the team's plugins would hold more than `--team-task-bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetExceeded {
    /// The team: the key that uploaded the plugin (or the plugin's name, for one the runner
    /// loaded from its directory).
    pub team: String,
    /// The plugin of the first task that did not fit.
    pub plugin: String,
    pub budget: u64,
    pub held: u64,
    pub asked: u64,
}

impl std::fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "task_budget: the plugins of team {:?} (the key that uploaded them; plugin {:?} among \
             them) hold {} bytes of tasks in Redis (payloads, listeners, debounced payloads) and \
             their budget is {} (the key's task_bytes, else --team-task-bytes); these {} more \
             would pass it",
            self.team, self.plugin, self.held, self.budget, self.asked
        )
    }
}

/// What a new task will make Redis hold, as admission reckons it.
pub(super) fn task_bytes(t: &NewTask) -> u64 {
    let listeners: usize = t.on.iter().map(|l| l.topic.len() + l.key.len() + 4).sum();
    let trace = t.traceparent.as_ref().map_or(0, |s| s.len() + 2);
    let extras = if t.on.is_empty() && t.debounce.is_none() {
        0
    } else {
        RECORD_EXTRAS
    };
    (t.payload.len() + listeners + trace + extras) as u64
}

impl Budgets {
    pub(super) fn team_of(&self, plugin: &str) -> String {
        let teams = self.teams.read().unwrap_or_else(|e| e.into_inner());
        teams
            .get(plugin)
            .cloned()
            .unwrap_or_else(|| plugin.to_owned())
    }

    /// Whether the registry knows no plugin of `team` but `plugin` (no list made: a run's
    /// commit asks this first).
    pub(super) fn alone(&self, team: &str, plugin: &str) -> bool {
        let teams = self.teams.read().unwrap_or_else(|e| e.into_inner());
        !teams.iter().any(|(p, t)| t == team && p != plugin)
    }

    /// The plugins of `team` the registry knows, and `also` (a plugin being admitted).
    pub(super) fn plugins_of(&self, team: &str, also: &str) -> Vec<String> {
        let teams = self.teams.read().unwrap_or_else(|e| e.into_inner());
        let mut plugins: Vec<String> = teams
            .iter()
            .filter(|(_, t)| t.as_str() == team)
            .map(|(p, _)| p.clone())
            .collect();
        if !plugins.iter().any(|p| p == also) {
            plugins.push(also.to_owned());
        }
        plugins
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What one admission asks of each team: (team, a plugin of it, bytes).
pub(super) struct Asks(Vec<(String, String, u64)>);

impl Store {
    /// Says which team a plugin belongs to (the registry, as it loads the plugin's current
    /// version): its tasks count against that team's budget.
    pub fn set_team(&self, plugin: &str, team: &str) {
        let budgets = &self.inner.budgets;
        let mut teams = budgets.teams.write().unwrap_or_else(|e| e.into_inner());
        teams.insert(plugin.to_owned(), team.to_owned());
    }

    /// Forgets what this store read of `team`'s bytes and budgets: its next admission and its
    /// plugins' next runs read them again (its key's limits just changed).
    pub fn forget_team_budget(&self, team: &str) {
        self.inner.budgets.held().remove(team);
        self.inner.budgets.runs.forget(team);
    }

    /// Checks `tasks` against their teams' budgets, without admitting them (see
    /// [`Store::admitted_bytes`]).
    pub(super) async fn check_budgets(
        &self,
        tasks: &[NewTask],
    ) -> Result<Result<Asks, BudgetExceeded>> {
        let budgets = &self.inner.budgets;
        // by plugin first (a batch is mostly of one), then by team
        let mut by_plugin: Vec<(&str, u64)> = Vec::new();
        for t in tasks {
            let bytes = task_bytes(t);
            match by_plugin.iter_mut().find(|(p, _)| *p == t.plugin) {
                Some((_, n)) => *n += bytes,
                None => by_plugin.push((&t.plugin, bytes)),
            }
        }
        let mut asks: Vec<(String, String, u64)> = Vec::new();
        for (plugin, bytes) in by_plugin {
            let team = budgets.team_of(plugin);
            match asks.iter_mut().find(|(tm, _, _)| *tm == team) {
                Some((_, _, n)) => *n += bytes,
                None => asks.push((team, plugin.to_owned(), bytes)),
            }
        }
        for (team, plugin, _) in &asks {
            let stale = budgets
                .held()
                .get(team)
                .is_none_or(|h| h.at.elapsed() >= FRESH);
            if stale {
                let at = Instant::now();
                let plugins = budgets.plugins_of(team, plugin);
                let (read, key) =
                    futures::try_join!(self.plugin_bytes(&plugins), self.key_by_id(team))?;
                let own_limit = key.and_then(|(key, ..)| key.limits.task_bytes);
                let mut held = budgets.held();
                if held.get(team).is_none_or(|h| h.at < at) {
                    let h = Held {
                        read,
                        admitted: 0,
                        at,
                        own_limit,
                    };
                    held.insert(team.clone(), h);
                }
            }
        }
        let held = budgets.held();
        for (team, plugin, asked) in &asks {
            let h = held.get(team).expect("read before");
            let budget = h.own_limit.unwrap_or(self.inner.opts.team_task_bytes);
            let now = h.read + h.admitted;
            if now + asked > budget {
                return Ok(Err(BudgetExceeded {
                    team: team.clone(),
                    plugin: plugin.clone(),
                    budget,
                    held: now,
                    asked: *asked,
                }));
            }
        }
        Ok(Ok(Asks(asks)))
    }

    /// Counts what [`Store::check_budgets`] let through as held until the next read.
    pub(super) fn admitted_bytes(&self, asks: Asks) {
        let mut held = self.inner.budgets.held();
        for (team, _, bytes) in asks.0 {
            if let Some(h) = held.get_mut(&team) {
                h.admitted += bytes;
            }
        }
    }

    /// The bytes these plugins' records hold over all shards (one HMGET per shard).
    async fn plugin_bytes(&self, plugins: &[String]) -> Result<u64> {
        if plugins.is_empty() {
            return Ok(0);
        }
        let fields: Vec<String> = plugins.iter().map(|p| format!("by:{p}")).collect();
        let calls = (0..self.shards()).map(|shard| {
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(&self.keys().shard(shard).meta).arg(&fields);
            let mut conn = self.conn();
            async move { cmd.query_async::<Vec<Option<i64>>>(&mut conn).await }
        });
        let per_shard = try_join_all(calls)
            .await
            .context("reading the task bytes of a team's plugins")?;
        Ok(per_shard
            .iter()
            .flatten()
            .map(|n| n.unwrap_or(0).max(0) as u64)
            .sum())
    }
}
