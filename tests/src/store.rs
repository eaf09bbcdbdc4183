//! Helpers for the tests that drive the store directly (no runner).

use std::time::Duration;

use eggtimer::Store;
use eggtimer::store::{ClaimBatch, FindQuery, TaskState};

use crate::{RedisServer, eventually};

/// A store on `redis` with `shards` shards (done records kept a minute), for the store tests.
pub async fn store_on(redis: &RedisServer, shards: u32) -> Store {
    store_keeping_done(redis, shards, 60_000).await
}

/// A store on `redis` with `shards` shards that keeps done records `keep_done_ms`.
pub async fn store_keeping_done(redis: &RedisServer, shards: u32, keep_done_ms: u64) -> Store {
    let opts = eggtimer::store::StoreOptions {
        shards,
        keep_done_ms,
        ..eggtimer::store::StoreOptions::default()
    };
    eggtimer::Store::open(eggtimer::RedisTarget::Single(redis.url()), opts)
        .await
        .unwrap()
}

/// A task of the `noop` plugin (3 attempts), for the store tests.
/// The key a `noop` task of id `id` is stored under (a task id belongs to its plugin).
pub fn key(id: &str) -> String {
    eggtimer::store::task_key("noop", id)
}

pub fn noop_task(id: &str, run_at: i64) -> eggtimer::store::NewTask {
    eggtimer::store::NewTask {
        id: id.into(),
        plugin: "noop".into(),
        payload: "{\"n\":1}".into(),
        run_at,
        owner: None,
        max_attempts: 3,
        unique_for_ms: 0,
        traceparent: None,
        start_by: None,
        ..Default::default()
    }
}

/// The next non-empty claim of up to `limit` tasks of `shard` (lease 30 s), retried for up to
/// 5 s while nothing is due yet; `what` names what the wait is for.
pub async fn claim_when_due(s: &Store, shard: u32, limit: usize, what: &str) -> ClaimBatch {
    eventually(Duration::from_secs(5), what, || async {
        let b = s.claim(shard, limit, 30_000).await.unwrap();
        (!b.tasks.is_empty()).then_some(b)
    })
    .await
}

/// The ids of the first page (up to 100) of tasks in `state`, sorted.
pub async fn found_ids(s: &Store, state: TaskState) -> Vec<String> {
    let q = FindQuery {
        state: Some(state),
        limit: 100,
        ..FindQuery::default()
    };
    let mut ids: Vec<String> = s
        .find(&q, None)
        .await
        .unwrap()
        .0
        .into_iter()
        .map(|r| r.id)
        .collect();
    ids.sort();
    ids
}

/// The ids of every task matching `q`, walking find's pages to the end; each page is checked to
/// hold at most `q.limit`.
pub async fn find_all(s: &Store, q: &FindQuery) -> Vec<String> {
    let (mut ids, mut cursor) = (Vec::new(), None);
    loop {
        let (page, next) = s.find(q, cursor).await.unwrap();
        assert!(page.len() <= q.limit, "a page longer than its limit");
        ids.extend(page.into_iter().map(|t| t.id));
        match next {
            Some(c) => cursor = Some(c),
            None => return ids,
        }
    }
}

/// The entries of a shard's due buckets (id, due), in due order, read key by key (not through
/// the store's scripts), after checking the buckets' invariants: every bucket in the index is
/// non-empty, its entries (offsets from its bound) lie from its bound up to the next bucket's,
/// and one of at most 128 entries is a listpack (Redis's compact encoding, the point of the
/// buckets).
pub fn due_entries(redis: &RedisServer, k: &eggtimer::store::ShardKeys) -> Vec<(String, i64)> {
    let mut c = redis.conn();
    let index: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(&k.duex)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut c)
        .unwrap();
    let mut out = Vec::new();
    for (i, (name, bound)) in index.iter().enumerate() {
        let key = k.due_bucket(name);
        let entries: Vec<(String, i64)> = redis::cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(&mut c)
            .unwrap();
        assert!(
            !entries.is_empty(),
            "bucket {name} is in the index but empty"
        );
        // a bucket's scores are offsets from its bound
        let entries: Vec<(String, i64)> = entries
            .into_iter()
            .map(|(id, offset)| (id, bound + offset))
            .collect();
        let end = index.get(i + 1).map_or(i64::MAX, |b| b.1);
        for (id, due) in &entries {
            assert!(
                *bound <= *due && *due < end,
                "{id} due {due} is in bucket {name} of [{bound}, {end})"
            );
        }
        if entries.len() <= 128 {
            let enc: String = redis::cmd("OBJECT")
                .arg("ENCODING")
                .arg(&key)
                .query(&mut c)
                .unwrap();
            assert_eq!(
                enc,
                "listpack",
                "bucket {name} of {} entries",
                entries.len()
            );
        }
        out.extend(entries);
    }
    out
}

/// The data layout a shard records (its meta's `layout`).
pub fn layout_of(redis: &RedisServer, k: &eggtimer::store::ShardKeys) -> String {
    redis::cmd("HGET")
        .arg(&k.meta)
        .arg("layout")
        .query(&mut redis.conn())
        .unwrap()
}
