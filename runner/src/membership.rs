//! Membership: which shards this runner polls.
//!
//! Runners of a namespace announce themselves with a heartbeat and share the shards through shard
//! leases in Redis (acquired with SET NX PX, renewed every tick, released on shutdown). Each tick a
//! runner computes its fair share from the live runners (sorted by id: the first `M mod n` take one
//! more), renews what it holds, gives back what is above its share and takes free shards up to it.
//! A runner that dies stops renewing: its leases expire and the others take its shards over; a
//! runner that joins is seen by the others' next tick, which give back their extras.
//!
//! Leases only avoid wasted work: claims are atomic, so two runners polling one shard (during a
//! hand-over) is still correct.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::shards::Shards;
use eggtimer_store::{LeaseOp, RunnerInfo, Store};

/// This runner in the namespace: its id and the shards it holds.
pub struct Membership {
    pub id: String,
    pub shards: Arc<Shards>,
}

impl Membership {
    pub fn new(id: String, shards: Arc<Shards>) -> Arc<Membership> {
        Arc::new(Membership { id, shards })
    }

    pub fn owns(&self, shard: u32) -> bool {
        self.shards.get(shard).owned()
    }

    pub fn owned(&self) -> Vec<u32> {
        self.shards.owned()
    }

    fn set(&self, shard: u32, v: bool) {
        self.shards.get(shard).set_owned(v);
    }
}

/// This runner's share of `shards` among `live` runners (sorted ids).
pub fn fair_share(shards: u32, live: &[String], me: &str) -> u32 {
    let n = live.len().max(1) as u32;
    let i = live.iter().position(|r| r == me).unwrap_or(live.len()) as u32;
    shards / n + u32::from(i < shards % n)
}

/// Settings of membership.
#[derive(Clone, Debug)]
pub struct MembershipOptions {
    /// Lease of a shard (and how long a silent runner counts as alive).
    pub lease: Duration,
    /// Extra info shown in `GET /v1/runners` (e.g. the API address).
    pub address: Option<String>,
}

/// Keeps heartbeats and shard leases until `stop`; then gives every shard back.
pub async fn run(
    store: Store,
    me: Arc<Membership>,
    opts: MembershipOptions,
    mut stop: watch::Receiver<bool>,
) {
    let lease_ms = opts.lease.as_millis() as u64;
    let tick = (opts.lease / 3).max(Duration::from_millis(50));
    let started = store.clock().now_ms();
    loop {
        if let Err(e) = step(&store, &me, &opts, lease_ms, started).await {
            warn!("membership: {e:#}");
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => break,
        }
    }
    for s in me.owned() {
        me.set(s, false);
        let _ = store
            .shard_lease(s, LeaseOp::Release, &me.id, lease_ms)
            .await;
    }
    let _ = store.forget_runner(&me.id).await;
}

async fn step(
    store: &Store,
    me: &Membership,
    opts: &MembershipOptions,
    lease_ms: u64,
    started: i64,
) -> anyhow::Result<()> {
    let shards = store.shards();
    let info = RunnerInfo {
        id: me.id.clone(),
        address: opts.address.clone(),
        shards: me.owned(),
        last_seen: store.clock().now_ms(),
        started_at: started,
        clock_ahead_ms: Some(store.clock().own_ahead_of_redis_ms()),
    };
    let info = serde_json::to_string(&info).expect("serializes");
    let live = store
        .heartbeat(&me.id, &info, lease_ms * 2, lease_ms)
        .await?;
    let share = fair_share(shards, &live, &me.id);
    // renew what we hold
    for s in me.owned() {
        if !store
            .shard_lease(s, LeaseOp::Renew, &me.id, lease_ms)
            .await?
        {
            warn!(shard = s, "lost the lease of a shard");
            me.set(s, false);
        }
    }
    // give back extras (the highest numbers first)
    let mut held = me.owned();
    while held.len() as u32 > share {
        let s = held.pop().expect("non-empty");
        me.set(s, false);
        store
            .shard_lease(s, LeaseOp::Release, &me.id, lease_ms)
            .await?;
        info!(shard = s, share, "gave a shard back");
    }
    // take free shards up to the share, starting at a runner-specific offset to avoid contention
    let mut count = held.len() as u32;
    let i = live.iter().position(|r| r == &me.id).unwrap_or(0) as u32;
    let offset = (i * shards) / live.len().max(1) as u32;
    for k in 0..shards {
        if count >= share {
            break;
        }
        let s = (offset + k) % shards;
        if me.owns(s) {
            continue;
        }
        if store
            .shard_lease(s, LeaseOp::Acquire, &me.id, lease_ms)
            .await?
        {
            me.set(s, true); // wakes its poller
            count += 1;
            info!(shard = s, share, "took a shard");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_to_all_shards() {
        let live: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let shares: Vec<u32> = live.iter().map(|r| fair_share(16, &live, r)).collect();
        assert_eq!(shares, [6, 5, 5]);
        assert_eq!(
            fair_share(16, &[], "a"),
            16,
            "alone (not yet seen) it takes everything"
        );
        assert_eq!(fair_share(2, &live, "c"), 0);
    }
}
