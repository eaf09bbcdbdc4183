//! Committing a run's effects: a claim check, then kv writes and events in one script (only if
//! the kv entries the run read are unchanged), then follow-ups and cancels.

use std::time::Duration;

use tracing::{Instrument, Span, debug, info_span};

use super::{Effects, Executor};
use crate::tasks::Refusal;
use crate::trace;
use eggtimer_store::{Claimed, Committed};

/// Why a run's effects were not committed.
pub(super) enum NotCommitted {
    /// A kv entry the run read changed: run it again.
    Conflict,
    /// The claim is no longer ours: drop everything.
    Lost,
    /// Redis failed: let the lease expire, the task runs again.
    Failed(anyhow::Error),
    /// Its follow-ups would pass their plugin's max_pending, or its events the plugin's
    /// `--max-topics`: a failed attempt, nothing written.
    OverQuota(String),
}

impl Executor {
    /// Commits a run's effects, carrying the trace on to its follow-ups and events (as children
    /// of this run).
    pub(super) async fn commit_run(
        &self,
        task: &Claimed,
        mut fx: Effects,
        traced: &Span,
        marked: &mut bool,
    ) -> Result<(), NotCommitted> {
        let tp = trace::child_traceparent(traced, task.traceparent.as_deref());
        for t in &mut fx.schedule {
            t.traceparent.clone_from(&tp);
        }
        fx.ns.traceparent = tp;
        self.commit(task, &fx, marked)
            .instrument(info_span!(target: trace::TARGET, parent: traced, "effects.commit"))
            .await?;
        self.metrics.observe_effects(&task.plugin, fx.bytes());
        Ok(())
    }

    /// Commits a run's effects: only while the claim is current, kv writes and events together
    /// and only if the kv entries read are unchanged, then follow-ups and cancels.
    async fn commit(
        &self,
        task: &Claimed,
        fx: &Effects,
        marked: &mut bool,
    ) -> Result<(), NotCommitted> {
        let Some(leased_from) = self.held.leased_from(task) else {
            return Err(NotCommitted::Lost);
        };
        // Only lease expiry loses a claim (a running task can't be moved, replaced or cancelled),
        // so with half of its lease left the claim is current and the commit has time to finish:
        // no round trip. Else a claim check, which also extends the lease. (A runner stalled past
        // its lease after this point commits under the same marker as the task's rerun does,
        // `effects_claim`, so the kv writes and events of only one of the two land.)
        if leased_from.elapsed() >= Duration::from_millis(self.opts.lease_ms) / 2 {
            let current = self
                .store
                .renew(
                    task.shard,
                    &[(task.id.as_str(), task.token)],
                    self.opts.lease_ms,
                )
                .await
                .map_err(NotCommitted::Failed)?;
            if current != [true] {
                return Err(NotCommitted::Lost);
            }
        }
        // admitted before anything is written: a run whose follow-ups would pass a budget writes
        // nothing
        match self
            .tasks
            .admitted(&fx.schedule, self.write_effects(task, fx, marked))
            .await
        {
            Ok(written) => written,
            Err(Refusal::Failed(e)) => Err(NotCommitted::Failed(e)),
            Err(refused) => Err(NotCommitted::OverQuota(refused.to_string())),
        }
    }

    /// Writes a run's admitted effects: kv writes and events, follow-ups, cancels.
    async fn write_effects(
        &self,
        task: &Claimed,
        fx: &Effects,
        marked: &mut bool,
    ) -> Result<(), NotCommitted> {
        let ns = &fx.ns;
        if !ns.kv.is_empty() || !ns.events.is_empty() || !ns.reads.is_empty() {
            match self.store.commit_ns_effects(task, ns).await {
                Ok(Committed::Applied | Committed::AppliedBefore) => *marked = true,
                Ok(Committed::Conflict) => return Err(NotCommitted::Conflict),
                Ok(Committed::TooManyTopics { max }) => {
                    return Err(NotCommitted::OverQuota(format!(
                        "plugin {:?} would write events to more than {max} topics (--max-topics); nothing of this run was written",
                        task.plugin
                    )));
                }
                Ok(Committed::KvFull {
                    max_keys,
                    max_bytes,
                    team,
                }) => {
                    let bound = match team {
                        None => "--kv-max-bytes".to_owned(),
                        Some(budget) => format!(
                            "what its team's other plugins leave of the team's {budget}: its key's kv_bytes, else --team-kv-bytes"
                        ),
                    };
                    return Err(NotCommitted::OverQuota(format!(
                        "plugin {:?} would keep more than {max_keys} kv keys (--kv-max-keys) or {max_bytes} bytes of kv keys and values ({bound}); nothing of this run was written",
                        task.plugin
                    )));
                }
                Ok(Committed::EmittedFull { max_bytes, team }) => {
                    let bound = match team {
                        None => "--emitted-max-bytes".to_owned(),
                        Some(budget) => format!(
                            "what its team's other plugins leave of the team's {budget}: its key's emitted_bytes, else --team-emitted-bytes"
                        ),
                    };
                    return Err(NotCommitted::OverQuota(format!(
                        "plugin {:?} would hold more than {max_bytes} bytes in its emitted streams ({bound}) even with the oldest entries of the streams this run writes dropped; nothing of this run was written",
                        task.plugin
                    )));
                }
                Err(e) => return Err(NotCommitted::Failed(e)),
            }
        }
        if !fx.schedule.is_empty() {
            // While Redis is out of memory it refuses new tasks: the follow-ups wait for memory
            // while the claim is held (its lease is kept meanwhile) rather than the run being
            // done again on a new attempt.
            self.tasks
                .write_follow_ups(&fx.schedule, || self.held.leased_from(task).is_some())
                .await
                .map_err(NotCommitted::Failed)?;
        }
        let also = fx.cancel_also.as_deref().unwrap_or_default();
        for id in &fx.cancel {
            match self.tasks.cancel_for_run(id, &task.plugin, also).await {
                Ok(()) => debug!(%id, "cancelled"),
                Err(Refusal::Failed(e)) => return Err(NotCommitted::Failed(e)),
                Err(why) => debug!(%id, "not cancelled: {why}"),
            }
        }
        Ok(())
    }
}
