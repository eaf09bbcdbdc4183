//! The limits a run must fit before it starts, across all runners: its plugin's rate
//! (`rate_limit`), and concurrency slots (`max_concurrency`, `max_concurrency_per_owner`). A
//! run that doesn't fit is deferred with its attempt given back.

use tracing::warn;

use super::Executor;
use crate::store::{Claimed, Finish, SlotsOf};

impl Executor {
    /// Over its plugin's rate: back to scheduled at the start reserved for it, the attempt
    /// given back (asked before the slots: a start it can't take is its rate's, not others').
    pub(super) async fn over_rate(&self, task: &Claimed) -> Option<Finish> {
        let rate = self.handler.rate_limit(&task.plugin)?;
        match self
            .store
            .rate_take(&task.plugin, (&task.id, task.attempt), rate)
            .await
        {
            Ok(0) => None,
            Ok(wait) => {
                let after_ms = i64::try_from(wait)
                    .unwrap_or(i64::MAX)
                    .min(crate::limits::MAX_DURATION_MS);
                Some(Finish::Defer { after_ms })
            }
            Err(e) => {
                warn!(plugin = %task.plugin, "asking the rate limit failed: {e:#}");
                Some(Finish::Defer { after_ms: 1_000 })
            }
        }
    }

    /// The concurrency limits a task's run must fit: its plugin's `max_concurrency`, and its
    /// owner's `max_concurrency_per_owner`.
    pub(super) fn slot_limits<'a>(&self, task: &'a Claimed) -> Vec<(SlotsOf<'a>, u32)> {
        let mut limits = Vec::new();
        if let Some(max) = self.handler.max_concurrency(&task.plugin) {
            limits.push((SlotsOf::Plugin(&task.plugin), max));
        }
        if let (Some(max), Some(owner)) = (
            self.handler.max_concurrency_per_owner(&task.plugin),
            task.owner.as_deref(),
        ) {
            let plugin = &task.plugin;
            limits.push((SlotsOf::Owner { plugin, owner }, max));
        }
        limits
    }

    /// Takes (or renews) a slot of each limit, in order; false, with those taken given back,
    /// when one is full.
    pub(super) async fn take_slots(
        &self,
        task: &Claimed,
        holder: &str,
        limits: &[(SlotsOf<'_>, u32)],
    ) -> bool {
        let lease = self.handler.slot_lease_ms(&task.plugin);
        for (i, &(of, max)) in limits.iter().enumerate() {
            let taken = match self.store.slot_take(of, holder, max, lease).await {
                Ok(taken) => taken,
                Err(e) => {
                    warn!(plugin = %task.plugin, "taking a concurrency slot failed: {e:#}");
                    false
                }
            };
            if !taken {
                self.give_slots(holder, &limits[..i]).await;
                return false;
            }
        }
        true
    }

    pub(super) async fn give_slots(&self, holder: &str, limits: &[(SlotsOf<'_>, u32)]) {
        for &(of, _) in limits {
            if let Err(e) = self.store.slot_give(of, holder).await {
                warn!("giving a concurrency slot back failed (it expires on its own): {e:#}");
            }
        }
    }

    /// Renews the slots a run holds (a run after a conflict starts a new time limit; a holder
    /// that has a slot renews it even when the rest are taken).
    pub(super) async fn renew_slots(
        &self,
        task: &Claimed,
        holder: &str,
        limits: &[(SlotsOf<'_>, u32)],
    ) {
        let lease = self.handler.slot_lease_ms(&task.plugin);
        for &(of, max) in limits {
            if let Err(e) = self.store.slot_take(of, holder, max, lease).await {
                warn!(plugin = %task.plugin, "renewing a concurrency slot failed: {e:#}");
            }
        }
    }
}
