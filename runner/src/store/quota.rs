//! `max_pending`: at most that many scheduled, running and dead tasks of a plugin (a dead letter
//! waits to be retried: counting it keeps failing tasks from piling up past the quota and a retry
//! of them all from passing it, and a retry, which moves a task from dead to scheduled, needs no
//! room).
//! What would pass it is refused before anything is written (the API answers 429
//! `quota_exceeded`, a run whose follow-ups would pass it fails its attempt, a schedule's firing is
//! skipped).
//!
//! A plugin's pending tasks are the shards' per-plugin counts (`scheduled`, which every script
//! keeps, and the plugin's entries of `byplugin`, the dead index), read again at most every
//! 250 ms per plugin. What was admitted since the read is added to it:
//! - for a plugin with a max_pending of its own (set, or held under an admin's ceiling), what
//!   every runner admitted and had not written when the count was read, from a ledger on the
//!   namespace's slot (`admit.lua`: two more round trips per schedule of such a plugin, one to
//!   admit and one to say the tasks are written): runners admitting at once don't pass it
//!   together;
//! - for the others (the default, 1,000,000), what this store admitted: runners admitting at once
//!   may pass it together by what they admit within those 250 ms.
//!
//! A running task counts as well while the quota is checked (each shard counts its runs per
//! plugin, `running:<plugin>` in `batches`): a run that fails goes back to scheduled without being
//! admitted again, and runs in flight would otherwise let a forking plugin pass its quota by them.
//! (What the API shows as pending stays scheduled and dead.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::{NewTask, Store};
use crate::plugin_settings::DEFAULT_MAX_PENDING;

/// The most an admin can set.
pub const MAX_MAX_PENDING: u64 = 1_000_000_000;
/// Makes each ledger entry's member unique in this process (with [`process_tag`], in Redis).
static ENTRIES: AtomicU64 = AtomicU64::new(0);

/// A random tag of this process (two runners in containers may both be pid 1).
fn process_tag() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static TAG: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TAG.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    })
}

/// How long a read of a plugin's pending count is trusted.
const FRESH: Duration = Duration::from_millis(250);

/// The quotas, shared by every store opened from one (`Store::own_connection`).
#[derive(Default)]
pub(super) struct Quotas {
    /// Each plugin's policy: its max_pending, where it has one of its own.
    pub(super) policies: crate::policy::Policies,
    /// Each plugin's pending count as last read, and what was admitted since.
    counts: Mutex<HashMap<String, Count>>,
}

struct Count {
    read: u64,
    admitted: u64,
    at: Instant,
    /// When the read started, by the ledger's Redis clock (ms; plugins with a max_pending of
    /// their own).
    at_ms: i64,
}

/// What an admission wrote into the ledger: (ledger, member) of each plugin with a max_pending of
/// its own. Hand it to [`Store::landed`] once the tasks are written (or refused).
#[must_use = "say when the admitted tasks are written: Store::landed"]
#[derive(Debug, Default)]
pub struct Admitted(Vec<(String, String)>);

/// A schedule refused because it would pass its plugin's max_pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaExceeded {
    pub plugin: String,
    pub max_pending: u64,
    pub pending: u64,
    pub asked: u64,
}

impl std::fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "quota_exceeded: plugin {:?} has {} scheduled, running and dead tasks and its max_pending is {}; {} more would pass it",
            self.plugin, self.pending, self.max_pending, self.asked
        )
    }
}

/// Why new tasks were not admitted: their plugin's `max_pending`, or their team's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotAdmitted {
    Quota(QuotaExceeded),
    Budget(super::BudgetExceeded),
}

impl NotAdmitted {
    /// The API's error code.
    pub fn code(&self) -> &'static str {
        match self {
            NotAdmitted::Quota(_) => "quota_exceeded",
            NotAdmitted::Budget(_) => "task_budget",
        }
    }

    /// The plugin it concerns.
    pub fn plugin(&self) -> &str {
        match self {
            NotAdmitted::Quota(q) => &q.plugin,
            NotAdmitted::Budget(b) => &b.plugin,
        }
    }
}

impl std::fmt::Display for NotAdmitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotAdmitted::Quota(q) => q.fmt(f),
            NotAdmitted::Budget(b) => b.fmt(f),
        }
    }
}

impl Quotas {
    fn limit(&self, plugin: &str) -> u64 {
        self.own_limit(plugin).unwrap_or(DEFAULT_MAX_PENDING)
    }

    /// A plugin's max_pending when it has one of its own (its admissions go through the ledger).
    fn own_limit(&self, plugin: &str) -> Option<u64> {
        self.policies.get(plugin).max_pending
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<String, Count>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits `asks` (plugin, tasks) all or none against counts read at most `FRESH` ago and
    /// what this store admitted since.
    fn admit(&self, asks: &[(&str, u64)]) -> Result<(), QuotaExceeded> {
        self.check(asks)?;
        let mut counts = self.counts();
        for &(plugin, asked) in asks {
            counts.get_mut(plugin).expect("read before").admitted += asked;
        }
        Ok(())
    }

    /// Whether `asks` fit, without admitting them.
    fn check(&self, asks: &[(&str, u64)]) -> Result<(), QuotaExceeded> {
        let counts = self.counts();
        for &(plugin, asked) in asks {
            let c = counts.get(plugin).expect("read before");
            let (pending, max_pending) = (c.read + c.admitted, self.limit(plugin));
            if pending + asked > max_pending {
                return Err(QuotaExceeded {
                    plugin: plugin.to_owned(),
                    max_pending,
                    pending,
                    asked,
                });
            }
        }
        Ok(())
    }
}

impl Store {
    /// Every plugin's policy, as the last sync of the registry's settings made them (shared by
    /// the stores opened from this one, and by the plugin host the registry serves).
    pub fn policies(&self) -> &crate::policy::Policies {
        &self.inner.quotas.policies
    }

    /// One plugin's policy.
    pub fn policy(&self, plugin: &str) -> Arc<crate::policy::Policy> {
        self.policies().get(plugin)
    }

    /// Admits new tasks against their plugins' max_pending and their teams' task bytes
    /// (`budget`), all or none; counts them once admitted (call it right before scheduling them,
    /// and [`Store::landed`] after).
    pub async fn admit(&self, tasks: &[NewTask]) -> Result<Result<Admitted, NotAdmitted>> {
        let bytes = match self.check_budgets(tasks).await? {
            Ok(asks) => asks,
            Err(b) => return Ok(Err(NotAdmitted::Budget(b))),
        };
        let admitted = self.admit_pending(tasks).await?;
        if admitted.is_ok() {
            self.admitted_bytes(bytes);
        }
        Ok(admitted.map_err(NotAdmitted::Quota))
    }

    /// Admits new tasks against their plugins' max_pending, all or none; counts them as
    /// pending once admitted.
    /// Debounced tasks count one task per key (a batch that repeats a key makes one task), and
    /// one for a key whose task exists already (its payload is held as a task's is).
    async fn admit_pending(&self, tasks: &[NewTask]) -> Result<Result<Admitted, QuotaExceeded>> {
        let mut asks: Vec<(&str, u64)> = Vec::new();
        let mut keys = std::collections::HashSet::new();
        for t in tasks {
            if t.debounce.is_some() && !keys.insert((t.plugin.as_str(), t.id.as_str())) {
                continue;
            }
            match asks.iter_mut().find(|(p, _)| *p == t.plugin) {
                Some((_, n)) => *n += 1,
                None => asks.push((&t.plugin, 1)),
            }
        }
        let quotas = &self.inner.quotas;
        for &(plugin, _) in &asks {
            let stale = quotas
                .counts()
                .get(plugin)
                .is_none_or(|c| c.at.elapsed() >= FRESH);
            if stale {
                let at = Instant::now();
                let at_ms = match quotas.own_limit(plugin) {
                    Some(_) => self.ledger_now(plugin).await?,
                    None => 0,
                };
                let read = self.pending_of(plugin).await?;
                let mut counts = quotas.counts();
                // another call may have read it meanwhile, and admitted on it
                if counts.get(plugin).is_none_or(|c| c.at < at) {
                    let count = Count {
                        read,
                        admitted: 0,
                        at,
                        at_ms,
                    };
                    counts.insert(plugin.to_owned(), count);
                }
            }
        }
        let (shared, own): (Vec<_>, Vec<_>) = asks
            .iter()
            .partition(|(p, _)| quotas.own_limit(p).is_some());
        if shared.is_empty() {
            return Ok(quotas.admit(&own).map(|()| Admitted::default()));
        }
        if let Err(e) = quotas.check(&own) {
            return Ok(Err(e));
        }
        let admitted = match self.admit_shared(&shared).await? {
            Ok(a) => a,
            Err(e) => return Ok(Err(e)),
        };
        Ok(quotas.admit(&own).map(|()| admitted))
    }

    /// The tasks of an admission are written (or were refused): its ledger entries no longer
    /// add to counts read from now on. Best effort: an entry left pending goes after 10 s.
    pub async fn landed(&self, admitted: Admitted) {
        if admitted.0.is_empty() {
            return;
        }
        let mut inv = self.inner.scripts.admit.prepare_invoke();
        inv.arg("landed");
        for (key, member) in &admitted.0 {
            inv.key(key).arg(member);
        }
        if let Err(e) = inv.invoke_async::<i64>(&mut self.conn()).await {
            tracing::debug!("marking admitted tasks written failed (they count 10 s more): {e:#}");
        }
    }

    /// The time by the Redis that holds this plugin's ledger (ms).
    async fn ledger_now(&self, plugin: &str) -> Result<i64> {
        let mut inv = self.inner.scripts.admit.prepare_invoke();
        inv.key(self.keys().plugin_admits(plugin)).arg("now");
        inv.invoke_async(&mut self.conn())
            .await
            .context("reading the time of the quota ledger")
    }

    /// Admits tasks of plugins with a max_pending of their own through the namespace's ledger
    /// (`admit.lua`): each count read plus what every runner admitted and had not written when
    /// it was read (the ledger's entries pending, or landed since).
    async fn admit_shared(&self, asks: &[(&str, u64)]) -> Result<Result<Admitted, QuotaExceeded>> {
        let quotas = &self.inner.quotas;
        let n = ENTRIES.fetch_add(1, Ordering::Relaxed);
        let suffix = format!("{:x}.{n:x}", process_tag());
        let mut inv = self.inner.scripts.admit.prepare_invoke();
        inv.arg("admit").arg(&suffix);
        let mut reads = Vec::with_capacity(asks.len());
        let mut entries = Vec::with_capacity(asks.len());
        {
            let counts = quotas.counts();
            for &(plugin, asked) in asks {
                let c = counts.get(plugin).expect("read before");
                let room = quotas.limit(plugin) as i64 - c.read as i64;
                let key = self.keys().plugin_admits(plugin);
                inv.key(&key).arg(c.at_ms).arg(asked).arg(room);
                reads.push(c.read);
                entries.push((key, format!("{asked}:{suffix}")));
            }
        }
        let (refused, held): (usize, u64) = inv
            .invoke_async(&mut self.conn())
            .await
            .context("admitting tasks under max_pending")?;
        Ok(match refused.checked_sub(1) {
            None => Ok(Admitted(entries)),
            Some(i) => Err(QuotaExceeded {
                plugin: asks[i].0.to_owned(),
                max_pending: quotas.limit(asks[i].0),
                pending: reads[i] + held,
                asked: asks[i].1,
            }),
        })
    }

    /// A plugin's scheduled, dead and running tasks over all shards (a running task may come
    /// back to scheduled, without being admitted again).
    async fn pending_of(&self, plugin: &str) -> Result<u64> {
        let counts = self.plugin_counts(&[plugin.to_owned()]).await?;
        Ok(counts
            .iter()
            .map(|c| c.scheduled + c.dead + c.running)
            .sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(limit: u64, read: u64) -> Quotas {
        let q = Quotas::default();
        let max_pending = Some(limit);
        q.policies.set(HashMap::from([(
            "p".to_owned(),
            crate::plugin_settings::PluginSettings {
                max_pending,
                ..Default::default()
            },
        )]));
        q.counts().insert(
            "p".into(),
            Count {
                read,
                admitted: 0,
                at: Instant::now(),
                at_ms: 0,
            },
        );
        q
    }

    #[test]
    fn what_was_admitted_counts_until_the_next_read() {
        let q = quotas(10, 6);
        assert_eq!(q.admit(&[("p", 3)]), Ok(()));
        let e = q.admit(&[("p", 2)]).unwrap_err();
        assert_eq!((e.pending, e.max_pending, e.asked), (9, 10, 2));
        assert!(
            e.to_string().starts_with(
                "quota_exceeded: plugin \"p\" has 9 scheduled, running and dead tasks"
            )
        );
        assert_eq!(q.admit(&[("p", 1)]), Ok(()));
        assert!(q.admit(&[("p", 1)]).is_err());
    }

    #[test]
    fn a_batch_is_admitted_all_or_none() {
        let q = quotas(10, 0);
        q.counts().insert(
            "other".into(),
            Count {
                read: 0,
                admitted: 0,
                at: Instant::now(),
                at_ms: 0,
            },
        );
        // "other" has the default; "p" would pass its 10: neither is counted
        assert!(q.admit(&[("other", 5), ("p", 11)]).is_err());
        assert_eq!(q.admit(&[("other", 1), ("p", 10)]), Ok(()));
        assert_eq!(q.counts()["other"].admitted, 1);
    }
}
