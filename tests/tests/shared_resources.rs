//! What one team sends can't stall or fill what every team shares, tried as an attacking team
//! would (a developer key of its own plugin, a real runner, a real redis-server): one request of
//! one debounce key, one plain batch or one plugin upload holds Redis no longer than a short call,
//! debounced tasks pass `max_pending` like any other, a deleted plugin leaves nothing to the next
//! owner of its name. (Listeners: `shared_listeners.rs`.)

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, make_key, req, upload_as};
use eggtimer_tests::events::{recorder_runner as runner, recorder_runner_with, runs};
use eggtimer_tests::redis_log::{
    FAR_FROM_BUSY_MICROS, Logged, keys, log_every_call, logged, script_calls,
};
use eggtimer_tests::{RedisServer, eventually};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// 500 specs of one debounce key with 60 KB payloads (a 30 MB body) in one request, twice: the
/// specs go to Redis in calls of about 128 KiB, and no call comes near the time at which Redis
/// stops answering others (0.2.0 re-encoded every held payload at each merge, so this one request
/// held Redis for 146 s; how long the calls take is in BENCHMARKS.md, not asserted here); the
/// window keeps what its byte bound allows, in order, and counts the rest. (A run reading the
/// window: `a_window_kept_in_its_record_by_0_2_0_is_read_and_moved`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_debounced_request_of_one_key_holds_redis_no_longer_than_a_short_call() {
    let redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.as_str();
    let (_, dev) = make_key(base, "team-a", "developer", &["bench-record"]).await;
    let mut conn = redis.conn();
    // (the first call of a script loads it: not counted below)
    let warm = json!({"plugin": "bench-record", "payload": 1,
                      "debounce": {"key": "warm", "quiet_ms": 3_600_000, "max_wait_ms": 3_600_000}});
    let (s, t) = req("POST", &format!("{base}/v1/tasks"), Some(&dev), Some(warm)).await;
    assert_eq!(s, 201, "{t}");
    log_every_call(&mut conn);
    let pad = "x".repeat(60_000);
    let batch = |from: usize| -> Value {
        (from..from + 500)
            .map(|i| {
                json!({"plugin": "bench-record", "payload": {"i": i, "pad": pad},
                       "debounce": {"key": "flood", "quiet_ms": 3_600_000, "max_wait_ms": 3_600_000}})
            })
            .collect()
    };
    let url = format!("{base}/v1/tasks");
    for from in [0, 500] {
        let (s, reply) = req("POST", &url, Some(&dev), Some(batch(from))).await;
        assert_eq!(
            s,
            201,
            "{}",
            &reply.to_string()[..200.min(reply.to_string().len())]
        );
        let want = if from == 0 { "new" } else { "merged" };
        assert_eq!(reply[0]["debounced"], want);
        assert_eq!(reply[499]["debounced"], "merged");
        // two 60 KB specs fit in 128 KiB, a third does not: 250 calls for the 500
        let calls = script_calls(&mut conn, "eggtimer_debounce");
        assert_eq!(calls.len(), 250, "calls of the debounce script: {calls:?}");
        let slowest = calls.iter().max_by_key(|c| c.micros).unwrap();
        assert!(
            slowest.micros < FAR_FROM_BUSY_MICROS,
            "a debounce call after {} payloads held Redis {} µs",
            from + 500,
            slowest.micros
        );
    }
    let (s, t) = req("GET", &format!("{url}/flood"), Some(&dev), None).await;
    assert_eq!(s, 200);
    // 1 MiB of payloads of ~60 KB: 17 kept, the other 983 counted
    let kept = t["batch"].as_array().unwrap();
    assert_eq!(kept.len(), 17);
    assert_eq!(t["batch_dropped"], 983);
    for (i, p) in kept.iter().enumerate() {
        assert_eq!(p["i"], i, "the window keeps the first payloads in order");
    }
    assert_eq!(t["payload"]["i"], 999, "the latest payload is the task's");

    let bytes: usize = kept.iter().map(|p| p.to_string().len()).sum();
    assert!(bytes <= 1 << 20, "the window holds {bytes} bytes");
}

/// One plain batch of the largest body the API takes (500 specs of 60 KB, 30 MB) on a runner of
/// one shard holds Redis no longer than a short call: the shard's tasks go in calls of about
/// 256 KiB of payloads, one after another (0.2.0 sent them in one call of 30 MB, 114 ms; what the
/// calls cost now is in BENCHMARKS.md, not asserted here). The batch is still all or nothing: one
/// of its ids inside its dedup window refuses the whole of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_plain_batch_of_one_shard_holds_redis_no_longer_than_a_short_call() {
    let redis = RedisServer::start();
    let r = recorder_runner_with(&redis, &["--shards", "1"]).await;
    let base = r.url.as_str();
    let (_, dev) = make_key(base, "team-a", "developer", &["bench-record"]).await;
    let mut conn = redis.conn();
    let url = format!("{base}/v1/tasks");
    // p250 done, inside a dedup window
    let (s, t) = req(
        "POST",
        &url,
        Some(&dev),
        Some(
            json!({"plugin": "bench-record", "id": "p250", "payload": 1, "unique_for_ms": 600_000}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{t}");
    eggtimer_tests::as_key::wait_state(base, "p250", "done").await;
    let pad = "x".repeat(60_000);
    let batch = |skip: Option<usize>| -> Value {
        (0..500)
            .filter(|i| Some(*i) != skip)
            .map(|i| {
                json!({"plugin": "bench-record", "id": format!("p{i}"), "delay_ms": 3_600_000,
                       "payload": {"i": i, "pad": pad}})
            })
            .collect()
    };
    let tasks = |conn: &mut redis::Connection| -> u64 {
        redis::cmd("HLEN")
            .arg("{eggtimer:0}:tasks")
            .query(conn)
            .unwrap()
    };
    // all or nothing across its calls: p250's window refuses the whole batch
    let (s, e) = req("POST", &url, Some(&dev), Some(batch(None))).await;
    assert_eq!((s, &e["error"]["code"]), (409, &json!("duplicate")), "{e}");
    assert_eq!(tasks(&mut conn), 1, "nothing of the refused batch written");
    log_every_call(&mut conn);
    let (s, reply) = req("POST", &url, Some(&dev), Some(batch(Some(250)))).await;
    assert_eq!(
        s,
        201,
        "{}",
        &reply.to_string()[..200.min(reply.to_string().len())]
    );
    // 60 KB payloads, 256 KiB a call: four tasks a call, 125 calls for the 499; a call's
    // arguments are its 19 keys, 3 before them, 4 of its own and 5 per task
    let calls = script_calls(&mut conn, "eggtimer_schedule");
    assert_eq!(calls.len(), 125, "calls of the schedule script: {calls:?}");
    let most = calls.iter().map(|c| (c.args - 26) / 5).max().unwrap();
    assert_eq!(most, 4, "most tasks in one call: {calls:?}");
    assert!(
        calls.iter().all(|c| c.micros < FAR_FROM_BUSY_MICROS),
        "{calls:?}"
    );
    assert_eq!(tasks(&mut conn), 500, "every task of the batch written");
}

/// A team's upload of a 40 MB binary (its plugin padded with a custom section) reaches Redis in
/// commands of at most 1 MiB of bytes each and comes back to the runners that load it the same
/// way (0.2.0 sent all of it in one script call, 185–526 ms for 60 MB, and read it back with one
/// GET); the binary is stored whole, without a time to live, and no piece is left behind, nor
/// by a second upload of the same bytes under another name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_plugin_upload_goes_to_redis_and_back_in_pieces() {
    const PIECE: usize = 1 << 20;
    let redis = RedisServer::start();
    let r = eggtimer_tests::RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let base = r.url.as_str();
    let (_, dev) = make_key(base, "team-a", "developer", &["big", "big-too"]).await;
    let wasm = eggtimer_tests::padded(&eggtimer_tests::plugin_wasm("bench-record"), 40 << 20);
    let mut conn = redis.conn();
    log_every_call(&mut conn);
    let (s, up) = upload_as(base, &dev, "big", wasm.clone()).await;
    assert_eq!(s, 201, "{up}");
    let (s, t) = req(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(&dev),
        Some(json!({"plugin": "big", "id": "b1", "payload": 1})),
    )
    .await;
    assert_eq!(s, 201, "{t}");
    eggtimer_tests::as_key::wait_state(base, "b1", "done").await;
    let calls = logged(&mut conn);
    let largest = calls
        .iter()
        .max_by_key(|c| c.lens.iter().sum::<usize>())
        .unwrap();
    assert!(
        largest.lens.iter().sum::<usize>() <= PIECE + 4096,
        "a command of {} bytes: {:?}",
        largest.lens.iter().sum::<usize>(),
        largest.shown.iter().take(3).collect::<Vec<_>>()
    );
    let named = |cmd: &str, key: &str| -> Vec<&Logged> {
        calls
            .iter()
            .filter(|c| c.shown[0].eq_ignore_ascii_case(cmd))
            .filter(|c| c.shown.get(1).is_some_and(|k| k.contains(key)))
            .collect()
    };
    let sent: usize = ["SET", "APPEND"]
        .iter()
        .flat_map(|cmd| named(cmd, ":plugin:staging:"))
        .map(|c| c.lens[2])
        .sum();
    assert_eq!(sent, wasm.len(), "the bytes sent in pieces");

    // a second runner loads it from Redis: in GETRANGEs of at most a piece, never one GET
    let _b = eggtimer_tests::RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let mut read = 0;
    eventually(T, "the second runner to read the binary", || {
        for c in logged(&mut conn) {
            let cmd = c.shown[0].to_ascii_uppercase();
            if c.shown.get(1).is_some_and(|k| k.contains(":plugin:blob:")) {
                assert!(cmd != "GET", "a blob read whole");
                if cmd == "GETRANGE" {
                    let (from, to): (usize, usize) =
                        (c.shown[2].parse().unwrap(), c.shown[3].parse().unwrap());
                    assert!(to + 1 - from <= PIECE, "a read of {} bytes", to + 1 - from);
                    read += to + 1 - from;
                }
            }
        }
        std::future::ready((read >= wasm.len()).then_some(()))
    })
    .await;

    let digest = up["digest"].as_str().unwrap().to_owned();
    let blob = format!("{{eggtimer}}:plugin:blob:{digest}");
    let stored: Vec<u8> = redis::cmd("GET").arg(&blob).query(&mut conn).unwrap();
    assert!(stored == wasm, "the blob holds the binary");
    let ttl: i64 = redis::cmd("PTTL").arg(&blob).query(&mut conn).unwrap();
    assert_eq!(ttl, -1, "the blob stays");
    let (s, up) = upload_as(base, &dev, "big-too", wasm).await;
    assert_eq!(s, 201, "{up}");
    assert!(
        keys(&redis, "*:plugin:staging:*").is_empty(),
        "a piece left"
    );
}

/// A plugin at its max_pending takes no debounced task either (0.2.0 scheduled them past it);
/// a batch that repeats one key is one task.
#[tokio::test]
async fn debounced_tasks_count_against_max_pending_one_per_key() {
    let redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.as_str();
    let (_, dev) = make_key(base, "team-a", "developer", &["bench-record"]).await;
    let (s, p) = req(
        "PATCH",
        &format!("{base}/v1/plugins/bench-record"),
        Some(ADMIN),
        Some(json!({"max_pending": 3})),
    )
    .await;
    assert_eq!(s, 200, "{p}");
    let url = format!("{base}/v1/tasks");
    let plain =
        |id: &str| json!({"id": id, "plugin": "bench-record", "payload": 1, "delay_ms": 3_600_000});
    for id in ["a", "b"] {
        let (s, t) = req("POST", &url, Some(&dev), Some(plain(id))).await;
        assert_eq!(s, 201, "{t}");
    }
    let debounced = |key: &str, n: usize| -> Value {
        (0..n)
            .map(|i| json!({"plugin": "bench-record", "payload": i,
                            "debounce": {"key": key, "quiet_ms": 3_600_000, "max_wait_ms": 3_600_000}}))
            .collect()
    };
    // 50 payloads of one key: one task, the third of three
    let (s, reply) = req("POST", &url, Some(&dev), Some(debounced("k1", 50))).await;
    assert_eq!(s, 201, "{reply}");
    // full: another key, a batch of 5,000 keys, and a merge are refused
    let many: Value = (0..5000)
        .map(|i| json!({"plugin": "bench-record", "payload": i,
                        "debounce": {"key": format!("k-{i}"), "quiet_ms": 3_600_000, "max_wait_ms": 3_600_000}}))
        .collect();
    for body in [debounced("k2", 1), many, debounced("k1", 1)] {
        let (s, e) = req("POST", &url, Some(&dev), Some(body)).await;
        assert_eq!(
            (s, &e["error"]["code"]),
            (429, &json!("quota_exceeded")),
            "{e}"
        );
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains("max_pending is 3"), "{e}");
    }
    let (_, stats) = req("GET", &format!("{base}/v1/stats"), Some(ADMIN), None).await;
    assert_eq!(stats["scheduled"], 3, "{stats}");
}

/// A window 0.2.0 kept inside its record (`b` entries) is still read (get, run), and the first
/// payload added to it moves those payloads into the list beside the record, in order.
#[tokio::test]
async fn a_window_kept_in_its_record_by_0_2_0_is_read_and_moved() {
    let redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.as_str();
    let url = format!("{base}/v1/tasks");
    let spec = |n: u64| {
        json!({"plugin": "bench-record", "payload": {"n": n},
               "debounce": {"key": "legacy", "quiet_ms": 3_600_000, "max_wait_ms": 3_600_000}})
    };
    let (s, t) = req("POST", &url, Some(ADMIN), Some(spec(0))).await;
    assert_eq!(s, 201, "{t}");
    // rewrite it as 0.2.0 wrote it: both payloads inside the record, no list
    let shard = eggtimer::store::shard_of("legacy", 16);
    let tasks = format!("{{eggtimer:{shard}}}:tasks");
    let key = eggtimer::store::task_key("bench-record", "legacy");
    let mut conn = redis.conn();
    let rec: String = redis::cmd("HGET")
        .arg(&tasks)
        .arg(&key)
        .query(&mut conn)
        .unwrap();
    let (head, last) = rec.rsplit_once('\t').unwrap();
    let q = last
        .trim_start_matches('\x1c')
        .split(['\x1f', '\x1c'])
        .find(|e| e.starts_with('q'))
        .unwrap()
        .to_owned();
    let old = format!("{head}\t\x1c{q}\x1fb{{\"n\":0}}\x1fb{{\"n\":1}}\x1c{{\"n\":1}}");
    let () = redis::cmd("HSET")
        .arg(&tasks)
        .arg(&key)
        .arg(old)
        .query(&mut conn)
        .unwrap();
    let () = redis::cmd("DEL")
        .arg(format!("{tasks}:w:{key}"))
        .query(&mut conn)
        .unwrap();
    let (_, t) = req("GET", &format!("{url}/legacy"), Some(ADMIN), None).await;
    assert_eq!(t["batch"], json!([{"n": 0}, {"n": 1}]), "{t}");

    let (s, t) = req("POST", &url, Some(ADMIN), Some(spec(2))).await;
    assert_eq!((s, &t["debounced"]), (201, &json!("merged")), "{t}");
    let (_, t) = req("GET", &format!("{url}/legacy"), Some(ADMIN), None).await;
    assert_eq!(t["batch"], json!([{"n": 0}, {"n": 1}, {"n": 2}]), "{t}");
    let held: u64 = redis::cmd("LLEN")
        .arg(format!("{tasks}:w:{key}"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(held, 3, "the record's payloads moved into the list");
    let (s, _) = req("POST", &format!("{url}/legacy/run"), Some(ADMIN), None).await;
    assert_eq!(s, 202);
    let run = eventually(T, "the task to run", || async {
        runs(&redis).remove("legacy").map(|mut v| v.remove(0))
    })
    .await;
    assert_eq!(run["batch"], json!([{"n": 0}, {"n": 1}, {"n": 2}]), "{run}");
}

/// Deleting a plugin takes its schedules and done tasks with it: the next owner of the name
/// (another team) neither sees the old schedule with its payload (a token) nor reads the done
/// records, and no firing runs the new owner's code with the old payload (0.2.0 kept both).
#[tokio::test]
async fn a_deleted_plugins_schedules_and_done_tasks_go_with_it() {
    let redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.as_str();
    let (_, a) = make_key(base, "team-a", "developer", &["victim"]).await;
    let (_, b) = make_key(base, "team-b", "developer", &["victim"]).await;
    let wasm = eggtimer_tests::plugin_wasm("bench-record");
    let (s, up) = upload_as(base, &a, "victim", wasm.clone()).await;
    assert_eq!(s, 201, "{up}");
    let token = json!({"token": "team-a-secret"});
    let (s, sched) = req(
        "PUT",
        &format!("{base}/v1/schedules/nightly"),
        Some(&a),
        Some(json!({"plugin": "victim", "every_ms": 3_600_000, "overlap": "allow", "payload": token})),
    )
    .await;
    assert_eq!(s, 201, "{sched}");
    let url = format!("{base}/v1/tasks");
    let (s, t) = req(
        "POST",
        &url,
        Some(&a),
        Some(json!({"id": "done-1", "plugin": "victim", "payload": token})),
    )
    .await;
    assert_eq!(s, 201, "{t}");
    eventually(T, "the task to be done", || async {
        let (_, t) = req("GET", &format!("{url}/done-1"), Some(&a), None).await;
        (t["state"] == "done").then_some(())
    })
    .await;

    let (s, e) = req(
        "DELETE",
        &format!("{base}/v1/plugins/victim?tasks=cancel"),
        Some(&a),
        None,
    )
    .await;
    assert_eq!(s, 204, "{e}");
    let (s, up) = upload_as(base, &b, "victim", wasm).await;
    assert_eq!(s, 201, "{up}");
    let (_, list) = req("GET", &format!("{base}/v1/schedules"), Some(&b), None).await;
    assert_eq!(list, json!([]), "the next owner sees the old schedule");
    let (s, t) = req("GET", &format!("{url}/done-1"), Some(&b), None).await;
    assert_eq!(s, 404, "the next owner reads the old done task: {t}");
    // nothing of team A's payload is left in Redis
    let left: Vec<String> = keys(&redis, "{eggtimer*")
        .into_iter()
        .filter(|k| {
            values_of(&redis, k)
                .iter()
                .any(|v| v.contains("team-a-secret"))
        })
        .collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "keys still holding team A's payload"
    );
}

/// Every value a key holds, as text (strings, hashes, lists, sets, sorted sets, streams).
fn values_of(redis: &RedisServer, key: &str) -> Vec<String> {
    let mut conn = redis.conn();
    let kind: String = redis::cmd("TYPE").arg(key).query(&mut conn).unwrap();
    let mut cmd = |c: &str, extra: &[&str]| -> Vec<String> {
        let v: redis::Value = redis::cmd(c).arg(key).arg(extra).query(&mut conn).unwrap();
        let mut out = Vec::new();
        flatten(&v, &mut out);
        out
    };
    match kind.as_str() {
        "string" => cmd("GET", &[]),
        "hash" => cmd("HGETALL", &[]),
        "list" => cmd("LRANGE", &["0", "-1"]),
        "set" => cmd("SMEMBERS", &[]),
        "zset" => cmd("ZRANGE", &["0", "-1"]),
        "stream" => cmd("XRANGE", &["-", "+"]),
        other => panic!("{key} is a {other}"),
    }
}

fn flatten(v: &redis::Value, out: &mut Vec<String>) {
    match v {
        redis::Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => out.push(s.clone()),
        redis::Value::Array(a) => a.iter().for_each(|x| flatten(x, out)),
        _ => {}
    }
}
