//! `max_pending`: at most that many scheduled and dead tasks of a plugin (a dead letter waits to
//! be retried: counting it keeps failing tasks from piling up past the quota and a retry of them
//! all from passing it, and a retry, which moves a task from dead to scheduled, needs no room).
//! What would pass it is refused before anything is written (the API answers 429
//! `quota_exceeded`, a run whose follow-ups would pass it fails its attempt, a schedule's firing is
//! skipped).
//!
//! A plugin's pending tasks are the shards' per-plugin counts (`scheduled`, which every script
//! keeps, and the plugin's entries of `byplugin`, the dead index), read again at most every 250 ms per plugin; what this store admitted since the read
//! is added to it, so one runner never passes a quota by itself. Runners admitting at once may
//! pass it together by what they admit within those 250 ms: a quota is held across runners only
//! that closely (counting them exactly would need one key every schedule of the plugin writes,
//! on one Redis node, whatever shard its tasks are on).

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::{NewTask, Store};

/// A plugin's max_pending unless it has its own.
pub const DEFAULT_MAX_PENDING: u64 = 1_000_000;
/// The most an admin can set.
pub const MAX_MAX_PENDING: u64 = 1_000_000_000;
/// How long a read of a plugin's pending count is trusted.
const FRESH: Duration = Duration::from_millis(250);

/// The quotas, shared by every store opened from one (`Store::own_connection`).
#[derive(Default)]
pub(super) struct Quotas {
    /// Each plugin's max_pending, where it is not the default.
    limits: RwLock<HashMap<String, u64>>,
    /// Each plugin's pending count as last read, and what was admitted since.
    counts: Mutex<HashMap<String, Count>>,
}

struct Count {
    read: u64,
    admitted: u64,
    at: Instant,
}

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
            "quota_exceeded: plugin {:?} has {} scheduled and dead tasks and its max_pending is {}; {} more would pass it",
            self.plugin, self.pending, self.max_pending, self.asked
        )
    }
}

impl Quotas {
    fn limit(&self, plugin: &str) -> u64 {
        let limits = self.limits.read().unwrap_or_else(|e| e.into_inner());
        limits.get(plugin).copied().unwrap_or(DEFAULT_MAX_PENDING)
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<String, Count>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits `asks` (plugin, tasks) all or none against counts read at most `FRESH` ago.
    fn admit(&self, asks: &[(&str, u64)]) -> Result<(), QuotaExceeded> {
        let mut counts = self.counts();
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
        for &(plugin, asked) in asks {
            counts.get_mut(plugin).expect("read before").admitted += asked;
        }
        Ok(())
    }
}

impl Store {
    /// Takes every plugin's max_pending (those not listed have the default).
    pub fn use_quotas(&self, limits: HashMap<String, u64>) {
        *self
            .inner
            .quotas
            .limits
            .write()
            .unwrap_or_else(|e| e.into_inner()) = limits;
    }

    /// Admits new tasks against their plugins' max_pending, all or none; counts them as
    /// pending once admitted (call it right before scheduling them).
    pub async fn admit(&self, tasks: &[NewTask]) -> Result<Result<(), QuotaExceeded>> {
        let mut asks: Vec<(&str, u64)> = Vec::new();
        for t in tasks {
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
                let read = self.pending_of(plugin).await?;
                let mut counts = quotas.counts();
                // another call may have read it meanwhile, and admitted on it
                if counts.get(plugin).is_none_or(|c| c.at < at) {
                    let count = Count {
                        read,
                        admitted: 0,
                        at,
                    };
                    counts.insert(plugin.to_owned(), count);
                }
            }
        }
        Ok(quotas.admit(&asks))
    }

    /// A plugin's scheduled and dead tasks over all shards.
    async fn pending_of(&self, plugin: &str) -> Result<u64> {
        let counts = self.plugin_counts(&[plugin.to_owned()]).await?;
        Ok(counts.iter().map(|c| c.scheduled + c.dead).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(limit: u64, read: u64) -> Quotas {
        let q = Quotas::default();
        q.limits.write().unwrap().insert("p".into(), limit);
        q.counts().insert(
            "p".into(),
            Count {
                read,
                admitted: 0,
                at: Instant::now(),
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
            e.to_string()
                .starts_with("quota_exceeded: plugin \"p\" has 9 scheduled and dead tasks")
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
            },
        );
        // "other" has the default; "p" would pass its 10: neither is counted
        assert!(q.admit(&[("other", 5), ("p", 11)]).is_err());
        assert_eq!(q.admit(&[("other", 1), ("p", 10)]), Ok(()));
        assert_eq!(q.counts()["other"].admitted, 1);
    }
}
