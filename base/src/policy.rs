//! One policy per plugin: what its settings mean on this runner, made whole from the registry's
//! settings (each limit held under its admin's ceiling, what is unset at the runner's defaults)
//! and swapped whole on every sync of the settings. The executor (slots, rate, weight), the plugin
//! host (time limit, memory, hosts, `may_schedule`, config) and the quota check (`max_pending`)
//! all read it here; none keeps settings of its own, so a new setting has one place to land.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::plugin_settings::{PluginSettings, RateLimit};

/// What a plugin's settings make of its runs, its slots and its quota.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Paused: no run of it starts (a task claimed before the pause goes back unstarted).
    pub paused: bool,
    /// At most this many runs at once across the namespace's runners (None: no limit).
    pub max_concurrency: Option<u32>,
    /// At most this many runs of one owner's tasks at once (None: no limit).
    pub max_concurrency_per_owner: Option<u32>,
    /// At most `max` starts in any `per_ms` ms across the runners (None: no limit).
    pub rate_limit: Option<RateLimit>,
    /// At most `max` starts of one owner's tasks in any `per_ms` ms (None: no limit).
    pub owner_rate_limit: Option<RateLimit>,
    /// Its share of workers when plugins compete (1 unless set).
    pub weight: u32,
    /// Its own max_pending (None: the namespace's default, counted without the ledger).
    pub max_pending: Option<u64>,
    /// At most this many of one owner's tasks scheduled, running or dead (None: no limit).
    pub max_pending_per_owner: Option<u64>,
    /// The time limit of one run.
    pub time_limit: Duration,
    /// The time limit of one call of its `check` or `payload-schema`.
    pub check_time_limit: Duration,
    /// The memory cap of one instance, all its memories together (bytes).
    pub memory: usize,
    /// The plugins it may schedule and cancel besides its own (None: its own only).
    pub may_schedule: Option<Arc<[String]>>,
    /// The origins it may send HTTP requests to.
    pub allowed_hosts: Arc<[String]>,
    /// Its `config` setting.
    pub config: Arc<BTreeMap<String, String>>,
}

/// The runner's defaults for what a plugin leaves unset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// `--plugin-timeout`.
    pub time_limit: Duration,
    /// `--plugin-memory` (bytes).
    pub memory: usize,
    /// `--check-timeout`.
    pub check_time_limit: Duration,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            time_limit: Duration::from_secs(1),
            memory: 64 << 20,
            check_time_limit: Duration::from_secs(1),
        }
    }
}

impl Policy {
    /// The policy of a plugin with no settings.
    pub fn unset(d: Defaults) -> Policy {
        Policy::of(&PluginSettings::default(), d)
    }

    /// What `settings` mean, each limit under its ceiling and what is unset at `d`.
    pub fn of(settings: &PluginSettings, d: Defaults) -> Policy {
        let s = settings.effective(
            d.time_limit.as_millis() as u64,
            d.memory as u64,
            d.check_time_limit.as_millis() as u64,
        );
        Policy {
            paused: s.paused,
            max_concurrency: s.max_concurrency,
            max_concurrency_per_owner: s.max_concurrency_per_owner,
            rate_limit: s.rate_limit,
            owner_rate_limit: s.owner_rate_limit,
            weight: s.weight.unwrap_or(1).max(1),
            max_pending: s.max_pending,
            max_pending_per_owner: s.max_pending_per_owner,
            time_limit: s.time_limit_ms.map_or(d.time_limit, Duration::from_millis),
            check_time_limit: s
                .check_time_limit_ms
                .map_or(d.check_time_limit, Duration::from_millis),
            memory: s.memory_bytes.map_or(d.memory, |b| b as usize),
            may_schedule: s.may_schedule.map(Into::into),
            allowed_hosts: s.allowed_hosts.unwrap_or_default().into(),
            config: Arc::new(s.config.unwrap_or_default()),
        }
    }

    /// How long a concurrency slot lasts without being taken again: longer than one run can
    /// take, so only a dead runner's slots expire.
    pub fn slot_lease_ms(&self) -> u64 {
        (self.time_limit + Duration::from_secs(5)).as_millis() as u64
    }
}

struct Table {
    by_name: HashMap<String, Arc<Policy>>,
    unset: Arc<Policy>,
    defaults: Defaults,
    /// The settings the policies were made of (to make them again with other defaults).
    settings: HashMap<String, PluginSettings>,
}

impl Table {
    fn new(settings: HashMap<String, PluginSettings>, defaults: Defaults) -> Table {
        Table {
            by_name: settings
                .iter()
                .map(|(name, s)| (name.clone(), Arc::new(Policy::of(s, defaults))))
                .collect(),
            unset: Arc::new(Policy::unset(defaults)),
            defaults,
            settings,
        }
    }
}

/// Every plugin's policy, shared (clones read the same table) and swapped whole.
#[derive(Clone)]
pub struct Policies(Arc<RwLock<Arc<Table>>>);

impl Default for Policies {
    fn default() -> Self {
        Policies::new(Defaults::default())
    }
}

impl Policies {
    pub fn new(defaults: Defaults) -> Policies {
        Policies(Arc::new(RwLock::new(Arc::new(Table::new(
            HashMap::new(),
            defaults,
        )))))
    }

    fn table(&self) -> Arc<Table> {
        Arc::clone(&self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Makes the table again from the current one, under the lock (no change is lost).
    fn remake(&self, make: impl FnOnce(&Table) -> Option<Table>) {
        let mut t = self.0.write().unwrap_or_else(|e| e.into_inner());
        if let Some(new) = make(&t) {
            *t = Arc::new(new);
        }
    }

    /// The policy of `plugin` (the runner's defaults when it has no settings).
    pub fn get(&self, plugin: &str) -> Arc<Policy> {
        let t = self.table();
        t.by_name.get(plugin).unwrap_or(&t.unset).clone()
    }

    /// The runner's defaults the policies are made with.
    pub fn defaults(&self) -> Defaults {
        self.table().defaults
    }

    /// Uses `defaults` for what plugins leave unset (the policies are made again).
    pub fn set_defaults(&self, defaults: Defaults) {
        self.remake(|t| (t.defaults != defaults).then(|| Table::new(t.settings.clone(), defaults)));
    }

    /// Makes every plugin's policy from `all` (those not listed have none of their own) and
    /// swaps the table whole.
    pub fn set(&self, all: HashMap<String, PluginSettings>) {
        self.remake(|t| Some(Table::new(all, t.defaults)));
    }
}

/// The owners whose tasks are paused, as the last sync read them (owner → `\0plugin\0…\0`, `*`
/// for every plugin, and since when this runner has known that list), shared like the policies
/// and swapped whole. The claim parks a paused owner's tasks; this lets a run hold back one
/// claimed before the runner heard of the pause (ahead, or waiting for a worker). One claimed
/// after is not held back: its shard's claim did not park it, so its shard does not hold the
/// owner paused (two requests at one moment may leave the shards apart), and holding it back
/// would only make it claimed again and again.
#[derive(Clone, Default)]
pub struct OwnerPauses(Arc<RwLock<Arc<PauseLists>>>);

/// Owner → its paused plugins' list, and since when this runner has known it.
type PauseLists = HashMap<String, (String, Instant)>;

impl OwnerPauses {
    /// Whether `owner`'s tasks of `plugin`, claimed at `claimed`, are held back by a pause this
    /// runner heard of after that (never a task without an owner).
    pub fn paused(&self, owner: &str, plugin: &str, claimed: Instant) -> bool {
        if owner.is_empty() {
            return false;
        }
        let all = Arc::clone(&self.0.read().unwrap_or_else(|e| e.into_inner()));
        all.get(owner).is_some_and(|(list, since)| {
            claimed < *since && list.split('\0').any(|p| p == "*" || p == plugin)
        })
    }

    /// Replaces every owner's pauses; an owner's list as it was keeps when it was first heard of.
    pub fn set(&self, all: HashMap<String, String>) {
        let mut t = self.0.write().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let next = all
            .into_iter()
            .map(|(owner, list)| {
                let since = match t.get(&owner) {
                    Some((was, since)) if *was == list => *since,
                    _ => now,
                };
                (owner, (list, since))
            })
            .collect();
        *t = Arc::new(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin_settings::Ceilings;

    #[test]
    fn an_owners_pause_holds_its_plugins_or_all_claimed_before_it_was_heard_of() {
        let p = OwnerPauses::default();
        let before = Instant::now();
        assert!(!p.paused("acme", "mail", before));
        std::thread::sleep(Duration::from_millis(2));
        let pauses = HashMap::from([
            ("acme".to_owned(), "\0mail\0sms\0".to_owned()),
            ("zeta".to_owned(), "\0*\0".to_owned()),
        ]);
        p.set(pauses.clone());
        assert!(p.paused("acme", "mail", before) && p.paused("acme", "sms", before));
        assert!(!p.paused("acme", "mai", before) && !p.paused("acme", "push", before));
        assert!(p.paused("zeta", "anything", before));
        assert!(!p.paused("", "mail", before) && !p.paused("other", "mail", before));
        // claimed after the pause was heard of: its shard's claim would have parked it
        std::thread::sleep(Duration::from_millis(2));
        let after = Instant::now();
        assert!(!p.paused("acme", "mail", after));
        // read again unchanged, the pause keeps when it was heard of
        p.set(pauses);
        assert!(!p.paused("acme", "mail", after) && p.paused("acme", "mail", before));
    }

    #[test]
    fn a_policy_holds_each_limit_under_its_ceiling_and_fills_in_the_defaults() {
        let d = Defaults {
            time_limit: Duration::from_millis(2_000),
            memory: 32 << 20,
            check_time_limit: Duration::from_millis(700),
        };
        let s = PluginSettings {
            max_concurrency: Some(50),
            weight: Some(10),
            time_limit_ms: None,
            ceilings: Some(Ceilings {
                max_concurrency: Some(5),
                weight: Some(3),
                time_limit_ms: Some(500),
                ..Ceilings::default()
            }),
            ..PluginSettings::default()
        };
        let p = Policy::of(&s, d);
        assert_eq!(p.max_concurrency, Some(5));
        assert_eq!(p.weight, 3);
        assert_eq!(p.time_limit, Duration::from_millis(500));
        assert_eq!(p.memory, 32 << 20);
        // a check's limit is its own: the runner's default, not the run's limit of 500 ms
        assert_eq!(p.check_time_limit, Duration::from_millis(700));
        assert_eq!(p.slot_lease_ms(), 5_500);
        let policies = Policies::new(d);
        policies.set(HashMap::from([("a".to_owned(), s)]));
        assert_eq!(policies.get("a").max_concurrency, Some(5));
        assert_eq!(*policies.get("b"), Policy::unset(d));
        assert_eq!(policies.get("b").time_limit, Duration::from_millis(2_000));
    }
}
