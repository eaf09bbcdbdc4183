//! The claims this runner holds, and the renewal of their leases while it holds them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use tracing::warn;

use super::Executor;
use crate::store::Claimed;

/// A claim held: its token, and an instant before the request that last set its lease (the
/// claim or a renewal), so the lease runs at least until that instant + the lease.
struct Claim {
    token: u64,
    leased_from: Instant,
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

    /// Since when the lease of a claim held runs (None: not held).
    pub(super) fn leased_from(&self, t: &Claimed) -> Option<Instant> {
        self.lock()
            .get(&t.shard)
            .and_then(|m| m.get(&t.id))
            .filter(|c| c.token == t.token)
            .map(|c| c.leased_from)
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

impl Executor {
    /// Renews the leases of everything held, every third of the lease, until stopped and empty.
    pub(super) async fn renew_loop(self: Arc<Self>) {
        let every = Duration::from_millis((self.opts.lease_ms / 3).max(10));
        loop {
            tokio::time::sleep(every).await;
            if *self.stopping.borrow()
                && self.held.count() == 0
                && self.slots.available_permits() == self.capacity()
            {
                return;
            }
            let lease = self.opts.lease_ms;
            let calls = self.held.snapshot().into_iter().map(|(shard, held)| {
                let this = &self;
                async move {
                    for chunk in held.chunks(1000) {
                        let refs: Vec<(&str, u64)> = chunk.iter().map(|(i, t)| (i.as_str(), *t)).collect();
                        let sent = Instant::now();
                        match this.store.renew(shard, &refs, lease).await {
                            Ok(current) => {
                                this.held.renewed(shard, chunk, sent);
                                for ((id, token), ok) in chunk.iter().zip(current) {
                                    if !ok {
                                        warn!(shard, %id, "lost the claim of a running task (its lease expired and it was reaped)");
                                        this.held.remove(shard, id, *token);
                                    }
                                }
                            }
                            Err(e) => warn!(shard, "renewing leases failed: {e:#}"),
                        }
                    }
                }
            });
            join_all(calls).await;
        }
    }
}
