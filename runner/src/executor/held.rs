//! The claims this runner holds, and the renewal of their leases while it holds them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use tracing::warn;

use super::Executor;
use crate::store::Claimed;

/// The claims this runner holds: shard → task id → claim token.
#[derive(Default)]
pub(super) struct Held(Mutex<HashMap<u32, HashMap<String, u64>>>);

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, HashMap<String, u64>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn insert(&self, t: &Claimed) {
        self.lock()
            .entry(t.shard)
            .or_default()
            .insert(t.id.clone(), t.token);
    }

    /// Removes a claim (only that claim: a newer one of the same id stays).
    pub(super) fn remove(&self, shard: u32, id: &str, token: u64) {
        let mut g = self.lock();
        if let Some(m) = g.get_mut(&shard)
            && m.get(id) == Some(&token)
        {
            m.remove(id);
        }
    }

    pub(super) fn holds(&self, t: &Claimed) -> bool {
        self.lock()
            .get(&t.shard)
            .is_some_and(|m| m.get(&t.id) == Some(&t.token))
    }

    pub(super) fn snapshot(&self) -> Vec<(u32, Vec<(String, u64)>)> {
        self.lock()
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(s, m)| (*s, m.iter().map(|(i, t)| (i.clone(), *t)).collect()))
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
                        match this.store.renew(shard, &refs, lease).await {
                            Ok(current) => {
                                for ((id, token), ok) in chunk.iter().zip(current) {
                                    if !ok {
                                        warn!(shard, %id, "lost the claim of a running task (cancelled, replaced or reaped)");
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
