//! No call holds Redis long, whatever one team sends: scripts driven with the largest inputs the
//! API admits (30 MB bodies, 10,000-task batches), on a runner of one shard so that all of it
//! lands in one place, while Redis's `SLOWLOG` records every call over 10 ms. Each phase is read
//! on its own, so a slow call is reported with what caused it. (The paths not here yet, each
//! over 10 ms at times today: a 60 MB plugin's upload, an owner's shift, bulk cancels and
//! dead-letter retries in chunks of 500, a claim of 256 tasks of 60 KB, and listeners of one
//! topic and key counted in the thousands.)
//!
//! This file holds one test, so no other test of the suite shares the machine while it runs.

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, req, upload_as};
use eggtimer_tests::{RedisServer, RunnerProcess, eventually, plugin_wasm};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(120);

/// The calls Redis logged as slower than 10 ms since the last read, as (ms, the command's first
/// words), and the log emptied.
fn slow_calls(conn: &mut redis::Connection) -> Vec<(f64, String)> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query(conn)
        .unwrap();
    let () = redis::cmd("SLOWLOG").arg("RESET").query(conn).unwrap();
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).chars().take(60).collect(),
        redis::Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    };
    entries
        .iter()
        .filter_map(|e| match e {
            redis::Value::Array(f) if f.len() >= 4 => {
                let us = match f[2] {
                    redis::Value::Int(us) => us,
                    _ => return None,
                };
                let words = match &f[3] {
                    redis::Value::Array(a) => a.iter().take(3).map(text).collect::<Vec<_>>(),
                    _ => vec![],
                };
                Some((us as f64 / 1000.0, words.join(" ")))
            }
            _ => None,
        })
        .collect()
}

/// Uploads `wasm` as `name` (as the admin), expecting 201.
async fn upload(base: &str, name: &str, wasm: Vec<u8>) {
    let (s, up) = upload_as(base, ADMIN, name, wasm).await;
    assert_eq!(s, 201, "uploading {name}: {up}");
}

/// `POST`s `body` to `path` as the admin, expecting `want`; the reply.
async fn post(base: &str, path: &str, body: Value, want: u16) -> Value {
    let (s, v) = req("POST", &format!("{base}{path}"), Some(ADMIN), Some(body)).await;
    let shown = v.to_string();
    assert_eq!(s, want, "POST {path}: {}", &shown[..shown.len().min(300)]);
    v
}

/// Waits until nothing is due or running and `dead` tasks are dead (the runner's stats).
async fn settled(base: &str, dead: u64) {
    eventually(
        T,
        &format!("nothing due or running, {dead} dead"),
        || async {
            let (_, st) = req("GET", &format!("{base}/v1/stats"), Some(ADMIN), None).await;
            (st["due_now"] == 0 && st["running"] == 0 && st["dead"] == dead).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_redis_call_takes_over_10_ms_under_the_largest_inputs_the_api_admits() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(
        &redis.url(),
        &["--token", ADMIN, "--shards", "1", "--retry-base", "50ms"],
    );
    let base = r.url.as_str();
    let mut conn = redis.conn();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(10_000)
        .query(&mut conn)
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-max-len")
        .arg(10_000)
        .query(&mut conn)
        .unwrap();
    let mut slow: Vec<(&str, f64, String)> = Vec::new();
    let mut phase = |name: &'static str, conn: &mut redis::Connection| {
        for (ms, what) in slow_calls(conn) {
            eprintln!("{name}: {ms:.1} ms in {what}");
            slow.push((name, ms, what));
        }
    };
    phase("starting", &mut conn);

    let record = plugin_wasm("bench-record");
    upload(base, "bench-record", record.clone()).await;
    upload(base, "test-panic", plugin_wasm("test-panic")).await;

    // 10,000 tasks of one owner in one request (30 MB of payloads)
    let pad = "x".repeat(2_900);
    let owned: Value = (0..10_000)
        .map(|i| {
            json!({"id": format!("l{i}"), "plugin": "bench-record", "owner": "o1",
                   "delay_ms": 3_600_000, "payload": {"i": i, "pad": pad}})
        })
        .collect();
    post(base, "/v1/tasks", owned, 201).await;
    phase("scheduling 10,000 tasks of 3 KB", &mut conn);

    // the deploy check of the plugin's 10,000 waiting payloads
    upload(base, "bench-record", eggtimer_tests::variant(&record, 1)).await;
    phase("a deploy check of 10,000 waiting tasks", &mut conn);

    // 10,000 tasks that die at once
    let dying: Value = (0..10_000)
        .map(|i| json!({"id": format!("x{i}"), "plugin": "test-panic", "max_attempts": 1}))
        .collect();
    post(base, "/v1/tasks", dying, 201).await;
    settled(base, 10_000).await;
    phase("10,000 tasks dying", &mut conn);
    let shown: Vec<String> = slow
        .iter()
        .map(|(phase, ms, what)| format!("{phase}: {ms:.1} ms in {what}"))
        .collect();
    assert!(
        slow.is_empty(),
        "Redis calls over 10 ms:\n{}",
        shown.join("\n")
    );
}
