//! The limits a run must fit before it starts, across all runners: its plugin's rate
//! (`rate_limit`), and concurrency slots (`max_concurrency`, `max_concurrency_per_owner`). A
//! run that doesn't fit is deferred with its attempt given back: under a rate, to the start
//! reserved for it; for a slot, among the runs waiting for one, woken when a slot is given back.

use tracing::{debug, warn};

use super::Executor;
use eggtimer_store::{Claimed, Finish, SlotWaiter, SlotsOf, Store};

/// How long after an upload a runner that has not loaded the plugin yet puts its tasks back
/// instead of failing them (a compile takes seconds for a large plugin).
const LOAD_GRACE_MS: i64 = 60_000;

/// Stale entries (runs woken or gone another way) one given-back slot looks past to wake a run
/// that still waits.
const WAKE_TRIES: usize = 8;

/// A run put back because a concurrency limit had no slot free, to wait among that limit's
/// runs once its put-back is recorded.
#[derive(Debug)]
pub(super) struct SlotWait {
    plugin: String,
    /// The owner, for an owner's limit.
    owner: Option<String>,
    max: u32,
    run: SlotWaiter,
    /// Its due time at the claim and its priority: the waiting runs are woken the highest
    /// priority first, each in due order (one waiting past the aging first of all).
    due: i64,
    priority: u8,
    /// How long it is put back for: if no slot's return wakes it, it comes back by itself then.
    pub(super) within_ms: u64,
}

impl SlotWait {
    fn of(&self) -> SlotsOf<'_> {
        match &self.owner {
            None => SlotsOf::Plugin(&self.plugin),
            Some(owner) => SlotsOf::Owner {
                plugin: &self.plugin,
                owner,
            },
        }
    }

    /// Puts the run (put back) among those waiting; a slot free by now wakes it at once (or,
    /// should it no longer wait, the next one that does).
    pub(super) async fn enter(&self, store: &Store) {
        match store
            .slot_wait(self.of(), &self.run, self.max, self.due, self.priority)
            .await
        {
            Ok(false) => {}
            Ok(true) => wake_next(store, self.of(), self.run.clone(), self.within_ms).await,
            Err(e) => {
                debug!(id = %self.run.id, "waiting for a slot failed (it comes back by itself): {e:#}")
            }
        }
    }
}

/// Wakes `run`, or the next waiting run of `of` when it no longer waits, up to [`WAKE_TRIES`].
async fn wake_next(store: &Store, of: SlotsOf<'_>, mut run: SlotWaiter, within_ms: u64) {
    for _ in 0..WAKE_TRIES {
        match store.wake_waiter(&run, within_ms).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => {
                debug!(id = %run.id, "waking a run waiting for a slot failed (it comes back by itself): {e:#}");
                return;
            }
        }
        // an entry of a run that no longer waits: the next one (giving back no holder)
        match store.slot_give(of, "").await {
            Ok(Some(next)) => run = next,
            Ok(None) => return,
            Err(e) => {
                debug!("taking the next run waiting for a slot failed: {e:#}");
                return;
            }
        }
    }
}

impl Executor {
    /// Over its plugin's rate or its owner's: back to scheduled at the start reserved for it,
    /// the attempt given back (asked before the slots: a start it can't take is its rate's, not
    /// others').
    pub(super) async fn over_rate(&self, task: &Claimed) -> Option<Finish> {
        let policy = self.store.policy(&task.plugin);
        let owner = task.owner.as_deref().zip(policy.owner_rate_limit);
        if policy.rate_limit.is_none() && owner.is_none() {
            return None;
        }
        match self
            .store
            .rate_take(
                &task.plugin,
                (&task.id, task.attempt),
                policy.rate_limit,
                owner,
            )
            .await
        {
            Ok(0) => None,
            Ok(wait) => {
                let after_ms = i64::try_from(wait)
                    .unwrap_or(i64::MAX)
                    .min(eggtimer_base::limits::MAX_DURATION_MS);
                Some(Finish::Defer { after_ms })
            }
            Err(e) => {
                warn!(plugin = %task.plugin, "asking the rate limit failed: {e:#}");
                Some(Finish::Defer { after_ms: 1_000 })
            }
        }
    }

    /// A task of a plugin uploaded moments ago that this runner has not loaded yet (the word of
    /// it still on its way, or its compile under way): put back for a moment, the attempt given
    /// back, so an upload's 201 is followed by runs, not by failed attempts, on every runner.
    /// Past [`LOAD_GRACE_MS`] after the upload it runs (and fails) as any unknown plugin's task.
    pub(super) async fn not_loaded_yet(&self, task: &Claimed) -> Option<Finish> {
        if self.handler.has_plugin(&task.plugin) {
            return None;
        }
        match self.store.plugin_current(&task.plugin).await {
            Ok(Some(e)) if self.store.clock().now_ms() - e.uploaded_at < LOAD_GRACE_MS => {
                debug!(id = %task.id, plugin = %task.plugin, "plugin not loaded here yet: put back");
                Some(Finish::Defer { after_ms: 250 })
            }
            _ => None,
        }
    }

    /// The concurrency limits a task's run must fit: its plugin's `max_concurrency`, and its
    /// owner's `max_concurrency_per_owner`.
    pub(super) fn slot_limits<'a>(&self, task: &'a Claimed) -> Vec<(SlotsOf<'a>, u32)> {
        let mut limits = Vec::new();
        let policy = self.store.policy(&task.plugin);
        if let Some(max) = policy.max_concurrency {
            limits.push((SlotsOf::Plugin(&task.plugin), max));
        }
        if let (Some(max), Some(owner)) = (policy.max_concurrency_per_owner, task.owner.as_deref())
        {
            let plugin = &task.plugin;
            limits.push((SlotsOf::Owner { plugin, owner }, max));
        }
        limits
    }

    /// Takes (or renews) a slot of each limit, in order; when one is full, those taken are given
    /// back and the answer is that limit's place.
    pub(super) async fn take_slots(
        &self,
        task: &Claimed,
        holder: &str,
        limits: &[(SlotsOf<'_>, u32)],
    ) -> Result<(), usize> {
        let lease = self.store.policy(&task.plugin).slot_lease_ms();
        for (i, &(of, max)) in limits.iter().enumerate() {
            let taken = match self.store.slot_take(of, holder, max, lease).await {
                Ok(taken) => taken,
                Err(e) => {
                    warn!(plugin = %task.plugin, "taking a concurrency slot failed: {e:#}");
                    false
                }
            };
            if !taken {
                self.give_slots(task, holder, &limits[..i]).await;
                return Err(i);
            }
        }
        Ok(())
    }

    /// Gives the slots back, each waking the earliest run waiting for one of its limit.
    pub(super) async fn give_slots(
        &self,
        task: &Claimed,
        holder: &str,
        limits: &[(SlotsOf<'_>, u32)],
    ) {
        let within_ms = self.store.policy(&task.plugin).slot_lease_ms();
        for &(of, _) in limits {
            match self.store.slot_give(of, holder).await {
                Ok(Some(next)) => wake_next(&self.store, of, next, within_ms).await,
                Ok(None) => {}
                Err(e) => {
                    warn!("giving a concurrency slot back failed (it expires on its own): {e:#}")
                }
            }
        }
    }

    /// How a run that found `limit` full waits for one of its slots.
    pub(super) fn slot_wait(&self, task: &Claimed, limit: &(SlotsOf<'_>, u32)) -> SlotWait {
        let &(of, max) = limit;
        let owner = match of {
            SlotsOf::Plugin(_) => None,
            SlotsOf::Owner { owner, .. } => Some(owner.to_owned()),
        };
        SlotWait {
            plugin: task.plugin.clone(),
            owner,
            max,
            run: SlotWaiter {
                id: task.id.clone(),
                created: task.created,
                // the put-back gives the attempt back
                attempts: task.attempt.saturating_sub(1),
            },
            due: task.due,
            priority: task.priority,
            within_ms: self.store.policy(&task.plugin).slot_lease_ms(),
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
        let lease = self.store.policy(&task.plugin).slot_lease_ms();
        for &(of, max) in limits {
            if let Err(e) = self.store.slot_take(of, holder, max, lease).await {
                warn!(plugin = %task.plugin, "renewing a concurrency slot failed: {e:#}");
            }
        }
    }
}
