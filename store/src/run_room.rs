//! What a team's plugins' runs make Redis keep, their kv and their emitted streams, bounded per
//! team by its key's `kv_bytes` and `emitted_bytes` (an admin's), else `--team-kv-bytes` and
//! `--team-emitted-bytes`, beside each plugin's own bounds (`--kv-max-bytes`,
//! `--emitted-max-bytes`). A team is the key that uploaded its plugins, as for the task bytes
//! (`budget.rs`).
//!
//! The effects script already counts both per plugin (`plugin:kv-bytes:<name>`, the values of
//! `plugin:emitted:<name>`), refuses a run's kv writes past its plugin's bound and trims the
//! plugin's streams to theirs. The team's bound reaches it as that bound: the smaller of the
//! plugin's own and what the team's other plugins leave of the team's budget, read at most every
//! 250 ms. So no script, key or record changes, and a team of one plugin (each plugin an admin
//! uploaded, or loaded from the runner's directory) reads only its key's budgets, at most every
//! 250 ms.
//!
//! kv is data: with nothing left, a run's writes are refused (its attempt fails, naming the
//! budget). Emitted streams are logs: a plugin always keeps at least an equal share of its
//! team's budget, dropping its own oldest entries, so a team's first plugin can't stop the
//! others' events; the team's streams may then hold up to about twice the budget, and come back
//! under it as each plugin writes again (each trims itself to what the others leave). Plugins of
//! one team running on several runners at once may pass the budgets together by what they write
//! within those 250 ms, as with the task bytes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::Store;

/// How long a read of a team's plugins' bytes is trusted.
const FRESH: Duration = Duration::from_millis(250);

/// What one run's effects may leave its plugin holding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunRoom {
    /// Bytes of kv keys and values.
    pub kv_bytes: u64,
    /// Bytes of its emitted streams' entries.
    pub emitted_bytes: u64,
    /// The team's budgets when they, not the plugin's own bounds, set these: (kv, emitted).
    pub team_kv: Option<u64>,
    pub team_emitted: Option<u64>,
}

/// Each plugin of a team with its bytes of kv and of emitted streams.
type PluginBytes = Vec<(String, u64, u64)>;

/// A team's key's own budgets of kv and of emitted streams as read, and when (None: the flag's).
type KeyBudgets = (Instant, Option<u64>, Option<u64>);

/// The teams' plugins' bytes as last read: team → when, and each plugin's; and the teams' keys'
/// budgets as last read: team → when, kv's and emitted streams' (None: the flag's).
#[derive(Default)]
pub(super) struct RunBytes {
    held: Mutex<HashMap<String, (Instant, PluginBytes)>>,
    budgets: Mutex<HashMap<String, KeyBudgets>>,
}

impl RunBytes {
    /// Forgets a team's key's budgets as read (an admin just changed them).
    pub(super) fn forget(&self, team: &str) {
        let mut budgets = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
        budgets.remove(team);
    }
}

impl Store {
    /// The most kv and emitted bytes a run of `plugin` may leave it holding: its own bounds, or
    /// what its team's other plugins leave of the team's budgets where that is less.
    pub(super) async fn run_room(&self, plugin: &str) -> Result<RunRoom> {
        let o = &self.inner.opts;
        let own = RunRoom {
            kv_bytes: o.kv_max_bytes,
            emitted_bytes: o.emitted_max_bytes,
            team_kv: None,
            team_emitted: None,
        };
        let budgets = &self.inner.budgets;
        let team = budgets.team_of(plugin);
        let (kv_budget, emitted_budget) = self.team_run_budgets(&team).await?;
        let alone = budgets.alone(&team, plugin);
        if alone && kv_budget >= own.kv_bytes && emitted_budget >= own.emitted_bytes {
            return Ok(own);
        }
        // the other plugins' bytes, and how many plugins the team has
        let (kv, emitted, n) = if alone {
            (0, 0, 1)
        } else {
            let held = self.team_run_bytes(&team, plugin).await?;
            let (kv, emitted) = held
                .iter()
                .filter(|(p, ..)| p != plugin)
                .fold((0, 0), |(k, e), (_, kv, em)| (k + kv, e + em));
            (kv, emitted, held.len() as u64)
        };
        let kv_left = kv_budget.saturating_sub(kv);
        // a log, not data: each plugin keeps at least an equal share, dropping its own oldest
        let share = emitted_budget / n;
        let emitted_left = emitted_budget.saturating_sub(emitted).max(share);
        Ok(RunRoom {
            kv_bytes: own.kv_bytes.min(kv_left),
            emitted_bytes: own.emitted_bytes.min(emitted_left),
            team_kv: (kv_left < own.kv_bytes).then_some(kv_budget),
            team_emitted: (emitted_left < own.emitted_bytes).then_some(emitted_budget),
        })
    }

    /// The team's budgets of kv and emitted bytes: its key's own (an admin's), else the flags';
    /// the key read at most every 250 ms.
    async fn team_run_budgets(&self, team: &str) -> Result<(u64, u64)> {
        let o = &self.inner.opts;
        let runs = &self.inner.budgets.runs;
        let fresh = {
            let read = runs.budgets.lock().unwrap_or_else(|e| e.into_inner());
            read.get(team)
                .filter(|(at, ..)| at.elapsed() < FRESH)
                .map(|&(_, kv, emitted)| (kv, emitted))
        };
        let (kv, emitted) = match fresh {
            Some(b) => b,
            None => {
                let at = Instant::now();
                let limits = self
                    .key_by_id(team)
                    .await?
                    .map(|(key, ..)| key.limits)
                    .unwrap_or_default();
                let b = (limits.kv_bytes, limits.emitted_bytes);
                let mut read = runs.budgets.lock().unwrap_or_else(|e| e.into_inner());
                read.insert(team.to_owned(), (at, b.0, b.1));
                b
            }
        };
        Ok((
            kv.unwrap_or(o.team_kv_bytes),
            emitted.unwrap_or(o.team_emitted_bytes),
        ))
    }

    /// Each plugin of `plugin`'s team with its kv and emitted bytes, read at most every 250 ms.
    async fn team_run_bytes(&self, team: &str, plugin: &str) -> Result<PluginBytes> {
        let runs = &self.inner.budgets.runs;
        let mut plugins = self.inner.budgets.plugins_of(team, plugin);
        plugins.sort();
        let fresh = {
            let read = runs.held.lock().unwrap_or_else(|e| e.into_inner());
            read.get(team).and_then(|(at, held)| {
                let same = held.iter().map(|(p, ..)| p).eq(plugins.iter());
                (same && at.elapsed() < FRESH).then(|| held.clone())
            })
        };
        if let Some(held) = fresh {
            return Ok(held);
        }
        let at = Instant::now();
        let held = self.plugins_run_bytes(&plugins).await?;
        let mut read = runs.held.lock().unwrap_or_else(|e| e.into_inner());
        read.insert(team.to_owned(), (at, held.clone()));
        Ok(held)
    }

    /// Each plugin's bytes of kv and of emitted streams, as the effects script counts them (one
    /// pipeline on the namespace slot).
    async fn plugins_run_bytes(&self, plugins: &[String]) -> Result<PluginBytes> {
        let keys = self.keys();
        let mut pipe = redis::pipe();
        for p in plugins {
            let [_, _, kv_total] = keys.plugin_kv_index(p);
            pipe.cmd("GET")
                .arg(kv_total)
                .cmd("HVALS")
                .arg(keys.plugin_emitted(p));
        }
        let read: Vec<redis::Value> = pipe
            .query_async(&mut self.conn())
            .await
            .context("reading the kv and emitted bytes of a team's plugins")?;
        let number = |v: &redis::Value| -> u64 {
            redis::from_redis_value::<Option<i64>>(v.clone())
                .ok()
                .flatten()
                .unwrap_or(0)
                .max(0) as u64
        };
        Ok(plugins
            .iter()
            .zip(read.chunks(2))
            .map(|(p, v)| {
                let emitted = match &v[1] {
                    redis::Value::Array(values) => values.iter().map(number).sum(),
                    _ => 0,
                };
                (p.clone(), number(&v[0]), emitted)
            })
            .collect())
    }
}
