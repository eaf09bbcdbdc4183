//! What the event tests share: a runner with `bench-record` (which emits what it was handed: its
//! event and batch), what that plugin recorded, a listening task's spec.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::as_key::{ADMIN, upload_as};
use crate::{RedisServer, RunnerProcess, plugin_wasm};

/// A runner (the admin token `ADMIN`) with `bench-record` uploaded.
pub async fn recorder_runner(redis: &RedisServer) -> RunnerProcess {
    recorder_runner_with(redis, &[]).await
}

/// [`recorder_runner`] started with more flags (`--shards 1`, say).
pub async fn recorder_runner_with(redis: &RedisServer, flags: &[&str]) -> RunnerProcess {
    let args: Vec<&str> = ["--token", ADMIN].iter().chain(flags).copied().collect();
    let r = RunnerProcess::start(&redis.url(), &args);
    let (s, up) = upload_as(&r.url, ADMIN, "bench-record", plugin_wasm("bench-record")).await;
    assert_eq!(s, 201, "{up}");
    r
}

/// The stream `bench-record` emits each run to.
const RUNS: &str = "{eggtimer}:events:bench-record:bench";

/// Forgets what `bench-record` emitted so far (what `runs` reads starts again empty).
pub fn forget_runs(redis: &RedisServer) {
    let () = redis::cmd("DEL")
        .arg(RUNS)
        .query(&mut redis.conn())
        .unwrap();
}

/// What `bench-record` emitted so far, by task id (each run one entry).
pub fn runs(redis: &RedisServer) -> HashMap<String, Vec<Value>> {
    let mut conn = redis.conn();
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(RUNS)
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap_or_default();
    let mut out: HashMap<String, Vec<Value>> = HashMap::new();
    for (_, fields) in entries {
        for (k, v) in fields {
            if k == "data" {
                let v: Value = serde_json::from_str(&v).unwrap();
                out.entry(v["id"].as_str().unwrap().to_owned())
                    .or_default()
                    .push(v);
            }
        }
    }
    out
}

/// A listening task's spec: `bench-record`, due in an hour.
pub fn listening(id: &str, topic: &str, key: &str, then: &str) -> Value {
    json!({"id": id, "plugin": "bench-record", "payload": {"n": id}, "delay_ms": 3_600_000,
           "on": [{"topic": topic, "key": key, "then": then}]})
}

/// Every outbox of the namespace is empty: nothing owed between shards is left undelivered.
pub fn outboxes_empty(redis: &RedisServer) -> bool {
    outboxes_empty_on(&mut redis.conn())
}

/// Every outbox the server of `conn` holds is empty (on a cluster: ask each master).
pub fn outboxes_empty_on(conn: &mut redis::Connection) -> bool {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("{eggtimer:*}:outbox")
        .query(conn)
        .unwrap();
    keys.iter()
        .all(|k| redis::cmd("ZCARD").arg(k).query::<u64>(conn).unwrap() == 0)
}
