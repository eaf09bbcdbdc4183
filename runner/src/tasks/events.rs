//! Events a caller publishes, and the listening tasks they cancel or start.

use super::{Refusal, Tasks};
use eggtimer_base::access::Caller;
use eggtimer_base::names::Topic;
use eggtimer_store::{Event, Published};

/// What an event costs Redis besides its data, topic and key (its entries in the event shard's
/// hash and index), as a publish is charged to its key's budget.
const EVENT_OVERHEAD: usize = 64;

impl Tasks {
    /// Refused unless `caller`'s key may publish on `topic` ([`Tasks::publish`] asks again; a
    /// route asks first, before it reads a body it would refuse).
    pub fn may_publish(&self, caller: &Caller, topic: &Topic) -> Result<(), Refusal> {
        match caller.refuses_topic(topic, true) {
            None => Ok(()),
            Some(why) => Err(Refusal::NoPublish { why }),
        }
    }

    /// Publishes `events` on `topic` for `caller`: its key may publish there, their bytes fit
    /// the key's event budget (its `event_bytes`, else `default_budget`) over the event
    /// retention, then the tasks listening for them act (cancelled or due now), and the publish
    /// is counted.
    pub async fn publish(
        &self,
        caller: &Caller,
        topic: &Topic,
        events: &[Event],
        default_budget: u64,
    ) -> Result<Published, Refusal> {
        self.may_publish(caller, topic)?;
        // what Redis keeps of each: the data, its topic and key, and its entries' own cost
        let bytes: u64 = events
            .iter()
            .map(|e| (e.data.len() + e.topic.len() + e.key.len() + EVENT_OVERHEAD) as u64)
            .sum();
        let budget = caller.limits.event_bytes.unwrap_or(default_budget);
        if let Err(used) = self
            .store
            .charge_events(&caller.key_id, bytes, budget)
            .await?
        {
            return Err(Refusal::EventBudget {
                key: caller.name.clone(),
                used,
                bytes,
                budget,
                retention_s: self.store.options().event_retention_ms / 1000,
            });
        }
        let done = self.store.publish(events).await?;
        self.metrics
            .observe_events(topic, done.stored, done.unmatched, done.acted);
        Ok(done)
    }
}
