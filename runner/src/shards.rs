//! What membership and the pollers share about each shard: whether this runner owns it
//! (membership writes it), and when its poller plans to wake and how to wake it early (the
//! poller and the wake-up listener use it). One small type, so neither module depends on the other.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use tokio::sync::Notify;

/// One shard's slot.
pub struct ShardSlot {
    owned: AtomicBool,
    notify: Notify,
    /// The Redis time (ms) the poller plans to wake at; i64::MAX while it works, i64::MIN while
    /// the shard is not owned.
    planned: AtomicI64,
}

impl ShardSlot {
    fn new() -> Self {
        ShardSlot {
            owned: AtomicBool::new(false),
            notify: Notify::new(),
            planned: AtomicI64::new(i64::MAX),
        }
    }

    /// Whether this runner polls the shard.
    pub fn owned(&self) -> bool {
        self.owned.load(Ordering::Acquire)
    }

    /// Sets ownership; a shard that became owned is woken so its poller starts at once.
    pub fn set_owned(&self, owned: bool) {
        let was = self.owned.swap(owned, Ordering::AcqRel);
        if owned && !was {
            self.wake();
        }
    }

    /// Wakes the poller now.
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// Wakes the poller if `due` is earlier than its planned wake-up.
    pub fn offer(&self, due: i64) {
        if due < self.planned.load(Ordering::Acquire) {
            self.notify.notify_one();
        }
    }

    /// Records when the poller plans to wake (Redis time, ms).
    pub fn plan(&self, at: i64) {
        self.planned.store(at, Ordering::Release);
    }

    /// Waits for a wake-up.
    pub async fn woken(&self) {
        self.notify.notified().await
    }
}

/// The slots of all shards of the namespace, and the scheduler's wake-up.
pub struct Shards(Vec<ShardSlot>, Notify);

impl Shards {
    pub fn new(count: u32) -> Arc<Self> {
        Arc::new(Shards(
            (0..count).map(|_| ShardSlot::new()).collect(),
            Notify::new(),
        ))
    }

    /// Waits until a schedule was created or resumed (a wake message `s<shard>:<ms>`).
    pub async fn schedules_changed(&self) {
        self.1.notified().await
    }

    pub fn get(&self, shard: u32) -> &ShardSlot {
        &self.0[shard as usize]
    }

    pub fn count(&self) -> u32 {
        self.0.len() as u32
    }

    /// The shards this runner owns, ascending.
    pub fn owned(&self) -> Vec<u32> {
        (0..self.count()).filter(|s| self.get(*s).owned()).collect()
    }

    /// Handles a wake message `<shard>:<due>`, or `s<shard>:<ms>` for the scheduler (unknown or
    /// malformed ones are ignored).
    pub fn on_wake_message(&self, msg: &str) {
        if msg.starts_with('s') {
            self.1.notify_one();
            return;
        }
        let Some((s, d)) = msg.split_once(':') else {
            return;
        };
        if let (Ok(s), Ok(d)) = (s.parse::<usize>(), d.parse::<i64>())
            && let Some(slot) = self.0.get(s)
        {
            slot.offer(d);
        }
    }

    /// Wakes every poller (after a reconnect, when messages may have been missed).
    pub fn wake_all(&self) {
        for s in &self.0 {
            s.wake();
        }
        self.1.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_messages_reach_only_their_shard_and_only_when_earlier() {
        let shards = Shards::new(2);
        shards.get(0).plan(100);
        shards.get(1).plan(100);
        shards.on_wake_message("0:50");
        shards.on_wake_message("1:150");
        shards.on_wake_message("9:1");
        shards.on_wake_message("garbage");
        let woken = |s: u32| {
            let f = shards.get(s).woken();
            futures::FutureExt::now_or_never(f).is_some()
        };
        assert!(woken(0), "an earlier due time wakes the poller");
        assert!(!woken(1), "a later due time does not");
    }

    #[test]
    fn owning_a_shard_wakes_its_poller() {
        let shards = Shards::new(1);
        shards.get(0).set_owned(true);
        assert!(futures::FutureExt::now_or_never(shards.get(0).woken()).is_some());
        assert_eq!(shards.owned(), vec![0]);
    }
}
