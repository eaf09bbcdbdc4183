//! Due times kept in small buckets (layout 5): every change keeps each task in exactly the bucket
//! its due time falls in, buckets stay listpacks up to 128 entries (`due_entries` checks both),
//! and claims, find, counts and the histogram see the same tasks as one ZSET per shard would.
//! Also the upgrade: tasks the previous main scheduled into its one `due` ZSET move into buckets
//! when this build opens the namespace, and later strays of a runner not yet upgraded at its next
//! start.

use std::collections::BTreeMap;

use eggtimer::Store;
use eggtimer::store::public_id;
use eggtimer::store::{FindQuery, Move, ScheduleMode, TaskState};
use eggtimer_tests::{RedisServer, claim_when_due, due_entries, find_all, key};

/// The shard's due entries, each named by its task's id.
fn due_ids(redis: &RedisServer, k: &eggtimer::store::ShardKeys) -> Vec<(String, i64)> {
    due_entries(redis, k)
        .into_iter()
        .map(|(key, due)| (public_id(&key).to_owned(), due))
        .collect()
}
use eggtimer_tests::{noop_task as task, now_ms as now, store_on as store};

/// A small deterministic generator (xorshift), so a failure replays.
struct Gen(u64);

impl Gen {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// What the buckets must hold: id -> due, as (id, due) in the buckets' order (due, then id).
fn in_order(model: &BTreeMap<String, i64>) -> Vec<(String, i64)> {
    let mut v: Vec<(String, i64)> = model.iter().map(|(i, d)| (i.clone(), *d)).collect();
    v.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    v
}

async fn schedule(s: &Store, model: &mut BTreeMap<String, i64>, batch: &[(String, i64)]) {
    let tasks: Vec<_> = batch.iter().map(|(id, due)| task(id, *due)).collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    model.extend(batch.iter().cloned());
}

#[tokio::test]
async fn every_change_keeps_tasks_in_their_buckets_and_claims_take_them_in_due_order() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let k = s.keys().shard(0);
    let mut g = Gen(0x9e37_79b9_7f4a_7c15);
    let mut model = BTreeMap::new();
    let base = now() + 3_600_000;
    // spread out, in batches of 1 to 300, in no order; one run of 400 due at one instant
    let mut n = 0;
    while n < 3000 {
        let size = 1 + g.below(300) as usize;
        let batch: Vec<(String, i64)> = (n..n + size)
            .map(|i| (format!("t{i}"), base + g.below(600_000) as i64))
            .collect();
        schedule(&s, &mut model, &batch).await;
        n += size;
    }
    let run: Vec<(String, i64)> = (0..400).map(|i| (format!("r{i}"), base + 1)).collect();
    schedule(&s, &mut model, &run).await;
    assert_eq!(due_ids(&redis, &k), in_order(&model));
    // upserts to new times, moves, cancels, and tasks earlier than every bucket
    for i in 0..300 {
        let id = format!("t{}", g.below(3000));
        match i % 4 {
            0 => {
                let due = base + g.below(600_000) as i64;
                schedule(&s, &mut model, &[(id, due)]).await;
            }
            1 => {
                let due = base + g.below(600_000) as i64;
                if let Some(d) = model.get_mut(&id) {
                    s.move_task(&key(&id), Move::At(due))
                        .await
                        .unwrap()
                        .unwrap();
                    *d = due;
                }
            }
            2 => {
                if model.remove(&id).is_some() {
                    s.cancel(&key(&id)).await.unwrap().unwrap();
                }
            }
            _ => {
                let due = base - 1 - g.below(1000) as i64;
                schedule(&s, &mut model, &[(id, due)]).await;
            }
        }
    }
    let entries = due_ids(&redis, &k);
    assert_eq!(entries, in_order(&model));
    // the run of 400 at one instant is one bucket; the others stay listpacks (checked above)
    let buckets: u64 = redis::cmd("ZCARD")
        .arg(&k.duex)
        .query(&mut redis.conn())
        .unwrap();
    assert!(
        buckets as usize >= model.len() / 128,
        "{buckets} buckets for {}",
        model.len()
    );
    // find lists them in due order, within a due range too
    let q = FindQuery {
        state: Some(TaskState::Scheduled),
        limit: 77,
        ..FindQuery::default()
    };
    let ids: Vec<String> = in_order(&model).into_iter().map(|e| e.0).collect();
    assert_eq!(find_all(&s, &q).await, ids);
    let (lo, hi) = (base + 100_000, base + 200_000);
    let q = FindQuery {
        due_after: Some(lo),
        due_before: Some(hi),
        ..q
    };
    let within: Vec<String> = in_order(&model)
        .into_iter()
        .filter(|e| lo <= e.1 && e.1 <= hi)
        .map(|e| e.0)
        .collect();
    assert!(within.len() > 100);
    assert_eq!(find_all(&s, &q).await, within);
    // the counts and the histogram
    assert_eq!(
        s.shard_counts().await.unwrap()[0].scheduled,
        model.len() as u64
    );
    let h = s.due_histogram(base, 60_000, 10).await.unwrap();
    let want: Vec<u64> = (0..10)
        .map(|i| {
            let hi = base + (i + 1) * 60_000;
            let lo = if i == 0 { i64::MIN } else { base + i * 60_000 };
            model.values().filter(|d| lo <= **d && **d < hi).count() as u64
        })
        .collect();
    assert_eq!(h.counts, want);
    assert_eq!(s.due_len(0).await.unwrap(), model.len() as u64);

    // all due now: claims take them earliest first, each once, and report the next due time
    let shift = now() - base - 700_000;
    for id in model.keys() {
        s.move_task(&key(id), Move::Shift(shift))
            .await
            .unwrap()
            .unwrap();
    }
    let mut want = in_order(&model);
    for e in &mut want {
        e.1 += shift;
    }
    assert_eq!(due_ids(&redis, &k), want);
    let mut claimed = Vec::new();
    while claimed.len() < want.len() {
        let b = claim_when_due(&s, 0, 97, "the shifted tasks").await;
        claimed.extend(b.tasks.iter().map(|t| (public_id(&t.id).to_owned(), t.due)));
        assert_eq!(b.next_due, want.get(claimed.len()).map(|e| e.1));
    }
    assert_eq!(claimed, want);
    assert!(due_ids(&redis, &k).is_empty());
    let left: u64 = redis::cmd("EXISTS")
        .arg(&k.duex)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(left, 0, "the index is gone with the last bucket");
}
