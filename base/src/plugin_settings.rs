//! What a plugin is to every part of the runner: a version's entry, the settings of its name, an
//! admin's ceilings over them and what the two mean together. The registry stores them, the
//! policy makes them whole for this runner, the API shows and changes them; none of those
//! defines them.

use serde::{Deserialize, Serialize};

/// A plugin's max_pending when neither it nor a ceiling sets one.
pub const DEFAULT_MAX_PENDING: u64 = 1_000_000;

/// One version of a plugin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PluginEntry {
    pub name: String,
    pub version: u64,
    pub digest: String,
    pub size: u64,
    pub uploaded_at: i64,
    /// The id of the key that uploaded it (`admin` for the runner's token; absent for a plugin
    /// the runner seeded from its directory, or one uploaded before 0.2.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploaded_by: Option<String>,
    /// Stored but never made current (uploaded with `?promote=false`, or refused by its check
    /// of the waiting tasks): `POST /v1/plugins/{name}/promote` makes it current.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub candidate: bool,
    /// The current version only: the version that was current before it became current (absent
    /// for a first version, or one made current by 0.2.0). `POST /v1/plugins/{name}/rollback`
    /// makes that one current again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<u64>,
}

impl PluginEntry {
    /// Whose turn its compiles take: the key that uploaded it, else its name.
    pub fn team(&self) -> &str {
        self.uploaded_by.as_deref().unwrap_or(&self.name)
    }
}

/// A plugin's settings, kept apart from its versions (an upload or rollback keeps them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginSettings {
    /// No runner starts its tasks (they wait, parked, without using attempts).
    #[serde(default)]
    pub paused: bool,
    /// At most this many runs at once across the namespace's runners (None: no limit).
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// The plugin's share of workers when plugins compete, against the others' (None: 1).
    #[serde(default)]
    pub weight: Option<u32>,
    /// Plugin patterns whose tasks this plugin may schedule and cancel besides its own (None:
    /// its own only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub may_schedule: Option<Vec<String>>,
    /// The time limit of one of its runs, ms (None: the runner's `--plugin-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_ms: Option<u64>,
    /// The memory cap of one of its instances, bytes (None: the runner's `--plugin-memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// The time limit of one call of its `check` (and `payload-schema`), ms (None: the runner's
    /// `--check-timeout`), apart from its runs'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_time_limit_ms: Option<u64>,
    /// At most this many runs of one owner's tasks at once across all runners (None: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency_per_owner: Option<u32>,
    /// At most `max` starts in any `per_ms` ms across all runners (None: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// At most `max` starts of one owner's tasks in any `per_ms` ms across all runners (None:
    /// no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_rate_limit: Option<RateLimit>,
    /// At most this many of its tasks scheduled (None: `DEFAULT_MAX_PENDING`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending: Option<u64>,
    /// At most this many of one owner's tasks of it scheduled, running or dead (None: no limit
    /// but `max_pending`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_per_owner: Option<u64>,
    /// Origins the plugin may send HTTP requests to (None: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_hosts: Option<Vec<String>>,
    /// Strings the plugin reads with `config(name)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<std::collections::BTreeMap<String, String>>,
    /// An admin's ceilings on the limits above: a developer key sets values at or below them,
    /// and what applies is never above them (`effective`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceilings: Option<Ceilings>,
}

/// An admin's ceilings on a plugin's limits (None: no ceiling but the operator's caps).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Ceilings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_per_owner: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency_per_owner: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_rate_limit: Option<RateLimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_time_limit_ms: Option<u64>,
}

impl Ceilings {
    pub fn is_empty(&self) -> bool {
        self == &Ceilings::default()
    }
}

/// The smaller of a value and a ceiling, where None is "no limit".
fn under<T: Ord + Copy>(v: Option<T>, ceiling: Option<T>) -> Option<T> {
    match (v, ceiling) {
        (Some(v), Some(c)) => Some(v.min(c)),
        (v, None) => v,
        (None, c) => c,
    }
}

/// A rate held under a ceiling: the ceiling where the rate allows more, or where there is none.
fn rate_under(v: Option<RateLimit>, ceiling: Option<RateLimit>) -> Option<RateLimit> {
    match (v, ceiling) {
        (Some(v), Some(c)) if !v.within(&c) => Some(c),
        (None, c) => c,
        (v, _) => v,
    }
}

impl RateLimit {
    /// Whether this rate allows no more than `other`: no more starts per unit of time, and no
    /// larger burst.
    pub fn within(&self, other: &RateLimit) -> bool {
        u128::from(self.max) * u128::from(other.per_ms)
            <= u128::from(other.max) * u128::from(self.per_ms)
            && self.max <= other.max
    }
}

impl PluginSettings {
    /// The settings that apply: each limit held under its ceiling. `time_limit_ms`,
    /// `memory_bytes` and `check_time_limit_ms` unset mean the runner's defaults (given), held
    /// under a ceiling too.
    pub fn effective(
        &self,
        default_time_limit_ms: u64,
        default_memory: u64,
        default_check_ms: u64,
    ) -> PluginSettings {
        let Some(c) = &self.ceilings else {
            return self.clone();
        };
        let with_default = |v: Option<u64>, c: Option<u64>, d: u64| match c {
            Some(c) => Some(v.unwrap_or(d).min(c)),
            None => v,
        };
        PluginSettings {
            max_pending: with_default(self.max_pending, c.max_pending, DEFAULT_MAX_PENDING),
            max_pending_per_owner: under(self.max_pending_per_owner, c.max_pending_per_owner),
            max_concurrency: under(self.max_concurrency, c.max_concurrency),
            max_concurrency_per_owner: under(
                self.max_concurrency_per_owner,
                c.max_concurrency_per_owner,
            ),
            rate_limit: rate_under(self.rate_limit, c.rate_limit),
            owner_rate_limit: rate_under(self.owner_rate_limit, c.owner_rate_limit),
            // unset is 1, the least there is: a ceiling can only lower a weight that was set
            weight: self.weight.map(|w| w.min(c.weight.unwrap_or(u32::MAX))),
            time_limit_ms: with_default(self.time_limit_ms, c.time_limit_ms, default_time_limit_ms),
            memory_bytes: with_default(self.memory_bytes, c.memory_bytes, default_memory),
            check_time_limit_ms: with_default(
                self.check_time_limit_ms,
                c.check_time_limit_ms,
                default_check_ms,
            ),
            ..self.clone()
        }
    }
}

/// A plugin's rate limit: at most `max` starts in any `per_ms` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RateLimit {
    pub max: u32,
    pub per_ms: u64,
}
