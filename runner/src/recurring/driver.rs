//! The driver of recurring schedules: turns them into tasks. Each runner drives the schedules whose
//! home shard it owns (shard leases decide, as for polling), so one runner creates each firing,
//! and a firing's creation is idempotent anyway: `fire` creates the task `<schedule>@<ms>` only
//! if it was never created, and the schedule then moves on with a compare-and-set. A runner
//! killed between the two leaves the schedule where it was; whoever drives it next finds the
//! firing created and moves on. The next firing is always read from Redis, never remembered.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::recurring::{CATCH_UP_MS, Overlap, ScheduleDef};
use crate::shards::Shards;
use crate::tasks::{Refusal, Tasks};
use eggtimer_store::{NewTask, Store, TaskState};

/// Longest sleep: how soon a runner notices shards it took over or schedules made elsewhere
/// (those also wake it through the wake channel).
const TICK: Duration = Duration::from_secs(1);
/// Schedules handled per shard per round.
const BATCH: usize = 100;

/// Drives the schedules of the shards this runner owns until `stop`.
/// Drives the schedules of the shards this runner owns until `stop`; firings come through
/// `tasks`, the door every new task takes.
pub async fn run(store: Store, tasks: Tasks, shards: Arc<Shards>, mut stop: watch::Receiver<bool>) {
    loop {
        if *stop.borrow() {
            return;
        }
        // how long until the next firing, in Redis time differences (runners' clocks don't count)
        let mut wait_ms = TICK.as_millis() as i64;
        for shard in shards.owned() {
            match drive(&store, &tasks, shard).await {
                Ok(Some(in_ms)) => wait_ms = wait_ms.min(in_ms),
                Ok(None) => {}
                Err(e) => warn!(shard, "driving schedules failed (will try again): {e:#}"),
            }
        }
        let wait = Duration::from_millis(wait_ms.clamp(1, 1000) as u64);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shards.schedules_changed() => {}
            _ = stop.changed() => {}
        }
    }
}

/// Fires what is due in one shard, by Redis's clock; returns how long until its next firing (ms).
async fn drive(store: &Store, tasks: &Tasks, shard: u32) -> Result<Option<i64>> {
    loop {
        let (now, due, head) = store.schedules_due(shard, BATCH).await?;
        if due.is_empty() {
            return Ok(head.map(|h| h - now));
        }
        for (id, at) in &due {
            if let Err(e) = fire_one(store, tasks, id, *at, now).await {
                if eggtimer_store::is_full(&e) {
                    // the pollers say it once; the firing is made when memory is back
                    debug!(schedule = %id, "a firing waits for Redis to have memory: {e:#}");
                } else {
                    warn!(schedule = %id, "a firing failed (will try again): {e:#}");
                }
                return Ok(Some(200));
            }
        }
    }
}

/// Creates the firing of schedule `id` due at `at` (or, when that is older than the catch-up
/// window, its most recent one) and moves the schedule to its next firing.
async fn fire_one(store: &Store, tasks: &Tasks, id: &str, at: i64, now: i64) -> Result<()> {
    let Some(row) = store.schedule_get(id).await? else {
        return Ok(());
    };
    if row.next != Some(at) {
        return Ok(()); // moved meanwhile
    }
    let def: ScheduleDef = match serde_json::from_str(&row.def) {
        Ok(d) => d,
        Err(e) => {
            warn!(schedule = %id, "a schedule this runner can't read is stopped: {e}");
            store.schedule_advance(id, &row.def, at, None, None).await?;
            return Ok(());
        }
    };
    // firings older than the catch-up window are dropped: the first one inside it is made,
    // or, when none falls inside it, the most recent one
    let fire_at = if now - at > CATCH_UP_MS {
        def.first_from(now - CATCH_UP_MS)
            .filter(|f| *f <= now)
            .or_else(|| def.latest_at_or_before(now))
            .filter(|f| *f >= at)
            .unwrap_or(at)
    } else {
        at
    };
    let mut skip = def.overlap == Overlap::Skip
        && match &row.last {
            Some(last) => store.get(last).await?.is_some_and(|r| {
                r.state == TaskState::Running
                    || (r.state == TaskState::Scheduled && r.run_at <= now)
            }),
            None => false,
        };
    let task_id = format!("{id}@{fire_at}");
    let task = NewTask {
        id: task_id.clone(),
        plugin: def.plugin.clone(),
        payload: def.payload.clone(),
        run_at: fire_at,
        owner: def.owner.clone(),
        max_attempts: def.max_attempts,
        unique_for_ms: 0,
        traceparent: None,
        start_by: None,
        priority: def.priority,
        ..Default::default()
    };
    if skip {
        debug!(schedule = %id, at = fire_at, "skipped: the previous firing has not finished");
    } else {
        match tasks.fire(&task).await {
            Err(Refusal::Failed(e)) => return Err(e.context("creating a firing")),
            Err(refused) => {
                warn!(schedule = %id, at = fire_at, "a firing is skipped: {refused}");
                skip = true;
            }
            Ok(created) => debug!(schedule = %id, at = fire_at, created, "fired"),
        }
    }
    let next = def.next_after(fire_at.max(at));
    // the schedule records its firing by the key it is stored under
    let key = eggtimer_store::task_key(&def.plugin, &task_id);
    let moved = store
        .schedule_advance(id, &row.def, at, next, (!skip).then_some(key.as_str()))
        .await?;
    if moved && !skip {
        store.unfire(&key).await?;
    }
    Ok(())
}
