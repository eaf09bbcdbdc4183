//! The claims this runner holds, and the lease keeper that renews their leases while it holds
//! them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{Semaphore, watch};
use tracing::warn;

use eggtimer_store::{Claimed, Store};

/// A claim held: its token, an instant before the request that last set its lease (the claim
/// or a renewal), so the lease runs at least until that instant + the lease, and when the claim's
/// request was sent.
struct Claim {
    token: u64,
    leased_from: Instant,
    claimed: Instant,
}

/// The claims this runner holds: shard → task id → claim.
#[derive(Default)]
pub(super) struct Held(Mutex<HashMap<u32, HashMap<String, Claim>>>);

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, HashMap<String, Claim>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds a claim whose request was sent at `sent`.
    pub(super) fn insert(&self, t: &Claimed, sent: Instant) {
        let claim = Claim {
            token: t.token,
            leased_from: sent,
            claimed: sent,
        };
        self.lock()
            .entry(t.shard)
            .or_default()
            .insert(t.id.clone(), claim);
    }

    /// Removes a claim (only that claim: a newer one of the same id stays).
    pub(super) fn remove(&self, shard: u32, id: &str, token: u64) {
        let mut g = self.lock();
        if let Some(m) = g.get_mut(&shard)
            && m.get(id).is_some_and(|c| c.token == token)
        {
            m.remove(id);
        }
    }

    /// What `read` reads of `t`'s claim, while this runner holds it (None: not held).
    fn held<T>(&self, t: &Claimed, read: impl FnOnce(&Claim) -> T) -> Option<T> {
        self.lock()
            .get(&t.shard)
            .and_then(|m| m.get(&t.id))
            .filter(|c| c.token == t.token)
            .map(read)
    }

    /// Whether this runner holds the claim `token` of the task `key` of `shard`.
    pub(super) fn holds(&self, shard: u32, key: &str, token: u64) -> bool {
        self.lock()
            .get(&shard)
            .and_then(|m| m.get(key))
            .is_some_and(|c| c.token == token)
    }

    /// Since when the lease of a claim held runs (None: not held).
    pub(super) fn leased_from(&self, t: &Claimed) -> Option<Instant> {
        self.held(t, |c| c.leased_from)
    }

    /// When the request of a claim held was sent (None: not held).
    pub(super) fn claimed_at(&self, t: &Claimed) -> Option<Instant> {
        self.held(t, |c| c.claimed)
    }

    /// A renewal sent at `sent` extended these claims' leases.
    fn renewed(&self, shard: u32, claims: &[(String, u64)], sent: Instant) {
        let mut g = self.lock();
        if let Some(m) = g.get_mut(&shard) {
            for (id, token) in claims {
                if let Some(c) = m.get_mut(id)
                    && c.token == *token
                {
                    c.leased_from = c.leased_from.max(sent);
                }
            }
        }
    }

    pub(super) fn snapshot(&self) -> Vec<(u32, Vec<(String, u64)>)> {
        self.lock()
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(s, m)| (*s, m.iter().map(|(i, c)| (i.clone(), c.token)).collect()))
            .collect()
    }

    pub(super) fn count(&self) -> usize {
        self.lock().values().map(HashMap::len).sum()
    }
}

/// Renews the leases of every claim held, every third of the lease: started by the runner, it
/// ends once the runner stops and nothing is held or reserved any more. Each shard is renewed on
/// its own: a shard whose last renewal has not answered yet (its Redis stalls) is skipped, and the
/// other shards' renewals go on every third of the lease.
pub struct LeaseKeeper {
    pub(super) store: Store,
    pub(super) held: Arc<Held>,
    /// The executor's slots (all free: nothing claimed or about to be).
    pub(super) slots: Arc<Semaphore>,
    pub(super) capacity: usize,
    pub(super) lease_ms: u64,
    pub(super) stopping: watch::Receiver<bool>,
}

impl LeaseKeeper {
    pub async fn run(self) {
        let mut tick = tokio::time::interval(Duration::from_millis((self.lease_ms / 3).max(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let this = &self;
        let mut renewing = HashSet::new();
        let mut calls = FuturesUnordered::new();
        loop {
            tokio::select! {
                Some(shard) = calls.next() => {
                    renewing.remove(&shard);
                }
                _ = tick.tick() => {
                    if *self.stopping.borrow()
                        && self.held.count() == 0
                        && self.slots.available_permits() == self.capacity
                    {
                        return;
                    }
                    for (shard, held) in self.held.snapshot() {
                        if renewing.insert(shard) {
                            calls.push(async move {
                                this.renew(shard, held).await;
                                shard
                            });
                        }
                    }
                }
            }
        }
    }

    /// Renews one shard's claims held (in chunks of 1,000); drops the ones lost.
    async fn renew(&self, shard: u32, held: Vec<(String, u64)>) {
        for chunk in held.chunks(1000) {
            let refs: Vec<(&str, u64)> = chunk.iter().map(|(i, t)| (i.as_str(), *t)).collect();
            let sent = Instant::now();
            match self.store.renew(shard, &refs, self.lease_ms).await {
                Ok(current) => {
                    self.held.renewed(shard, chunk, sent);
                    for ((id, token), ok) in chunk.iter().zip(current) {
                        if !ok {
                            warn!(shard, %id, "lost the claim of a running task (its lease expired and it was reaped)");
                            self.held.remove(shard, id, *token);
                        }
                    }
                }
                Err(e) => warn!(shard, "renewing leases failed: {e:#}"),
            }
        }
    }
}
