//! What a team's plugins make Redis hold is bounded, tried as an attacking team would (a key of
//! its own, a real runner, a real redis-server): the bytes of its tasks per team, whatever number
//! of plugins it spreads them over, counted exactly through every path a task takes; a plugin's
//! emitted streams by bytes.

use std::collections::BTreeMap;
use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, make_key, req, upload_as};
use eggtimer_tests::events::{recorder_runner_with, runs};
use eggtimer_tests::{RedisServer, eventually, plugin_wasm};
use serde_json::{Value, json};

/// The bytes each plugin's records hold as the scripts count them (`by:<plugin>` in every
/// shard's `meta`), summed over the shards.
fn counted(redis: &RedisServer) -> BTreeMap<String, i64> {
    let mut conn = redis.conn();
    let metas: Vec<String> = redis::cmd("KEYS")
        .arg("{eggtimer:*}:meta")
        .query(&mut conn)
        .unwrap();
    let mut out = BTreeMap::new();
    for meta in metas {
        let fields: Vec<(String, String)> =
            redis::cmd("HGETALL").arg(&meta).query(&mut conn).unwrap();
        for (f, v) in fields {
            if let Some(plugin) = f.strip_prefix("by:") {
                *out.entry(plugin.to_owned()).or_insert(0) += v.parse::<i64>().unwrap();
            }
        }
    }
    out
}

/// What one record holds for its plugin, computed here from the record: its last field (the
/// payload and what it carries before it) and the bytes of a debounced task's lists, which its
/// `w` and `N` extras say.
fn weight(last: &[u8]) -> i64 {
    let mut n = last.len() as i64;
    if let Some(s) = last.iter().position(|&b| b == 0x1c) {
        let e = last[s + 1..]
            .iter()
            .position(|&b| b == 0x1c)
            .map_or(last.len(), |e| s + 2 + e);
        for entry in last[s..e].split(|&b| b == 0x1c || b == 0x1f) {
            if let [b'w' | b'N', rest @ ..] = entry
                && let Some(sep) = rest.iter().position(|&b| b == 0x1e)
                && rest[..sep].iter().all(u8::is_ascii_digit)
            {
                n += std::str::from_utf8(&rest[sep + 1..])
                    .unwrap()
                    .parse::<i64>()
                    .unwrap();
            }
        }
    }
    n
}

/// The bytes each plugin's records hold, from the records themselves (every shard's `tasks`).
fn held(redis: &RedisServer) -> BTreeMap<String, i64> {
    let mut conn = redis.conn();
    let hashes: Vec<String> = redis::cmd("KEYS")
        .arg("{eggtimer:*}:tasks")
        .query(&mut conn)
        .unwrap();
    let mut out = BTreeMap::new();
    for tasks in hashes {
        let records: Vec<(Vec<u8>, Vec<u8>)> =
            redis::cmd("HGETALL").arg(&tasks).query(&mut conn).unwrap();
        for (_, rec) in records {
            let fields: Vec<&[u8]> = rec.splitn(10, |&b| b == b'\t').collect();
            let plugin = String::from_utf8(fields[6].to_vec()).unwrap();
            *out.entry(plugin).or_insert(0) += weight(fields[9]);
        }
    }
    out
}

/// Tasks of `n` payloads of `size` bytes for `plugin`, due in an hour, ids `<prefix>-<i>`.
fn far_tasks(plugin: &str, prefix: &str, n: usize, size: usize) -> Value {
    let blob = "x".repeat(size);
    json!(
        (0..n)
            .map(|i| json!({"id": format!("{prefix}-{i}"), "plugin": plugin,
                            "payload": {"blob": blob}, "delay_ms": 3_600_000}))
            .collect::<Vec<_>>()
    )
}

/// `POST` of `body` to `url` with `bearer`: (status, answer).
async fn post(url: &str, bearer: &str, body: Value) -> (u16, Value) {
    req("POST", url, Some(bearer), Some(body)).await
}

/// What a team's plugins' tasks make Redis hold is bounded per team (`--team-task-bytes`),
/// whatever number of plugins it spreads them over: team A fills its 2 MiB with tasks of two
/// plugins of its own, and its next batch (and a debounced task) is 429 `task_budget` naming the
/// flag, with nothing of it written; team B schedules all the while; the count in Redis is the
/// records' bytes exactly; cancelling A's tasks gives the room back. (0.2.0 bounded tasks only by
/// count: a team held up to `max_pending` × 64 KiB per plugin.)
#[tokio::test]
async fn a_teams_tasks_hold_no_more_than_its_budget_whatever_its_plugins() {
    let redis = RedisServer::start();
    let r = eggtimer_tests::RunnerProcess::start(
        &redis.url(),
        &["--token", ADMIN, "--team-task-bytes", "2097152"],
    );
    let base = r.url.as_str();
    let (id_a, a) = make_key(base, "team-a", "developer", &["a-*"]).await;
    let (id_b, b) = make_key(base, "team-b", "developer", &["b-*"]).await;
    for (key, name) in [(&a, "a-one"), (&a, "a-two"), (&b, "b-one")] {
        let (s, up) = upload_as(base, key, name, plugin_wasm("bench-record")).await;
        assert_eq!(s, 201, "{up}");
    }
    let url = format!("{base}/v1/tasks");
    // 50 tasks of 10 KB: about 500 KB a batch, alternately into A's two plugins
    let mut refused = None;
    for round in 0..6 {
        let plugin = if round % 2 == 0 { "a-one" } else { "a-two" };
        let (s, e) = post(
            &url,
            &a,
            far_tasks(plugin, &format!("r{round}"), 50, 10_000),
        )
        .await;
        match s {
            201 => assert!(
                refused.is_none(),
                "a batch taken after one was refused: {e}"
            ),
            429 => refused = refused.or(Some((round, e))),
            _ => panic!("{s} {e}"),
        }
    }
    let (round, e) = refused.expect("3 MB of tasks passed a 2 MiB budget");
    assert_eq!(round, 4, "four batches (2.0 MB) fit, a fifth does not");
    assert_eq!(e["error"]["code"], "task_budget", "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("--team-task-bytes") && message.contains(&id_a),
        "{message}"
    );
    let (s, _) = req("GET", &format!("{url}/r4-0"), Some(ADMIN), None).await;
    assert_eq!(s, 404, "a task of the refused batch was written");
    // debounced tasks are held as any other: ten of 10 KB don't fit the ~95 KB left
    let debounced: Vec<Value> = (0..10)
        .map(|i| {
            json!({"plugin": "a-one", "payload": {"blob": "y".repeat(10_000)},
            "debounce": {"key": format!("d{i}"), "quiet_ms": 60_000, "max_wait_ms": 600_000}})
        })
        .collect();
    let (s, e) = post(&url, &a, json!(debounced)).await;
    assert_eq!(
        (s, &e["error"]["code"]),
        (429, &json!("task_budget")),
        "{e}"
    );
    // another team's budget is its own
    let (s, e) = post(&url, &b, far_tasks("b-one", "b", 50, 10_000)).await;
    assert_eq!(s, 201, "{e}");
    // what the scripts counted is what the records hold
    let (counts, records) = (counted(&redis), held(&redis));
    assert_eq!(counts, records);
    let one = r#"{"blob":""#.len() as i64 + 10_000 + 2;
    assert_eq!(counts["a-one"], 100 * one);
    assert_eq!(counts["a-two"], 100 * one);
    // cancelling gives the room back
    for round in [0, 2] {
        for i in 0..50 {
            let (s, e) = req(
                "DELETE",
                &format!("{url}/r{round}-{i}?plugin=a-one"),
                Some(&a),
                None,
            )
            .await;
            assert_eq!(s, 204, "{e}");
        }
    }
    assert_eq!(counted(&redis).get("a-one"), None, "a-one holds no task");
    eventually(
        Duration::from_secs(10),
        "team A's room to come back",
        || {
            let a = a.clone();
            let url = url.clone();
            async move {
                let (s, _) = post(&url, &a, far_tasks("a-one", "again", 50, 10_000)).await;
                (s == 201).then_some(())
            }
        },
    )
    .await;
    assert_eq!(counted(&redis), held(&redis));
    // an admin gives team B a budget of its own, 1 MiB: it holds 500 KB, so 1 MB more is refused
    let (s, k) = req(
        "PATCH",
        &format!("{base}/v1/keys/{id_b}"),
        Some(ADMIN),
        Some(json!({"task_bytes": 1_048_576})),
    )
    .await;
    assert_eq!((s, &k["task_bytes"]), (200, &json!(1_048_576)), "{k}");
    let (s, e) = post(&url, &b, far_tasks("b-one", "b2", 100, 10_000)).await;
    assert_eq!(
        (s, &e["error"]["code"]),
        (429, &json!("task_budget")),
        "{e}"
    );
    let (s, e) = post(&url, &b, far_tasks("b-one", "b3", 40, 10_000)).await;
    assert_eq!(s, 201, "400 KB more fit team B's 1 MiB: {e}");
}

/// The count of a plugin's task bytes follows its records through every path that writes or
/// deletes one: scheduling, replacing, running to done and the trim of done records past
/// `--keep-done`, an event that starts or cancels a listening task, a debounced window's merges,
/// its run and a new window over its done record, an owner's tasks cancelled. After each step the
/// scripts' count equals what the records hold.
#[tokio::test]
async fn a_plugins_task_bytes_follow_its_records_through_every_path() {
    let redis = RedisServer::start();
    let r = recorder_runner_with(&redis, &["--keep-done", "2s"]).await;
    let base = r.url.as_str();
    let url = format!("{base}/v1/tasks");
    let schedule = |body: Value| {
        let url = url.clone();
        async move {
            let (s, e) = post(&url, ADMIN, body).await;
            assert!(s == 201 || s == 200, "{s} {e}");
            e
        }
    };
    let settled = |what: &'static str| {
        let redis = &redis;
        async move {
            eventually(Duration::from_secs(20), what, || async move {
                let (c, h) = (counted(redis), held(redis));
                (c == h).then_some(())
            })
            .await;
        }
    };
    // scheduled, then replaced by a larger payload, then run at once
    schedule(far_tasks("bench-record", "p", 20, 300)).await;
    schedule(far_tasks("bench-record", "p", 10, 900)).await;
    settled("scheduled and replaced tasks").await;
    let now: Vec<Value> = (0..20)
        .map(|i| json!({"id": format!("now-{i}"), "plugin": "bench-record", "payload": {"i": i}}))
        .collect();
    schedule(json!(now)).await;
    eventually(Duration::from_secs(20), "20 runs", || async {
        (runs(&redis).len() >= 20).then_some(())
    })
    .await;
    settled("tasks run to done").await;
    // listening tasks: an event starts ten (it is kept in their records) and cancels ten
    let listening = |prefix: &str, then: &str| -> Value {
        json!(
            (0..10)
                .map(
                    |i| json!({"id": format!("{prefix}-{i}"), "plugin": "bench-record",
                    "payload": {"i": i}, "delay_ms": 3_600_000,
                    "on": [{"topic": "orders", "key": format!("k{i}"), "then": then}]})
                )
                .collect::<Vec<_>>()
        )
    };
    schedule(listening("run", "run")).await;
    schedule(listening("cancel", "cancel")).await;
    settled("listening tasks").await;
    let events: Vec<Value> = (0..10)
        .map(|i| json!({"key": format!("k{i}"), "data": {"paid": "z".repeat(500)}}))
        .collect();
    let (s, e) = req(
        "POST",
        &format!("{base}/v1/events/orders"),
        Some(ADMIN),
        Some(json!(events)),
    )
    .await;
    assert_eq!(s, 200, "{e}");
    eventually(Duration::from_secs(20), "the event's runs", || async {
        (runs(&redis).len() >= 30).then_some(())
    })
    .await;
    settled("an event's runs and cancels").await;
    // a debounced window: merges, its run, and the next window made of what came meanwhile
    for i in 0..30 {
        schedule(
            json!({"plugin": "bench-record", "payload": {"n": i, "pad": "q".repeat(200)},
                    "debounce": {"key": "dk", "quiet_ms": 300, "max_wait_ms": 2_000}}),
        )
        .await;
    }
    settled("a debounced window").await;
    eventually(Duration::from_secs(20), "the debounced run", || async {
        runs(&redis).contains_key("dk").then_some(())
    })
    .await;
    settled("a debounced run").await;
    // the key again: a new window replaces the done record
    for i in 0..5 {
        schedule(json!({"plugin": "bench-record", "payload": {"again": i},
                    "debounce": {"key": "dk", "quiet_ms": 60_000, "max_wait_ms": 600_000}}))
        .await;
    }
    settled("a new window over a done one").await;
    // an owner's tasks cancelled
    let owned: Vec<Value> = (0..10)
        .map(|i| {
            json!({"id": format!("o-{i}"), "plugin": "bench-record", "owner": "u1",
                        "payload": {"pad": "o".repeat(100)}, "delay_ms": 3_600_000})
        })
        .collect();
    schedule(json!(owned)).await;
    let (s, e) = req(
        "DELETE",
        &format!("{base}/v1/owners/u1/tasks"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!((s, e["cancelled"].as_u64()), (200, Some(10)), "{e}");
    settled("an owner's tasks cancelled").await;
    // done records go once they are past --keep-done, as later runs finish
    eventually(
        Duration::from_secs(30),
        "done records trimmed past --keep-done",
        || async {
            schedule(json!({"plugin": "bench-record", "payload": 1})).await;
            let (s, _) = req("GET", &format!("{url}/now-0"), Some(ADMIN), None).await;
            (s == 404).then_some(())
        },
    )
    .await;
    settled("done records trimmed").await;
}

/// A plugin's emitted streams are bounded by bytes (`--emitted-max-bytes`) as well as entries: 60
/// runs of `bench-record` emitting 50 KB each (3 MB) leave its stream holding at most 1 MiB (and
/// no less than one entry under it), every run done; the count the runner keeps is the bytes the stream holds.
/// (0.2.0 bounded a stream by entries only: 1,000,000 entries of up to 1 MiB each.)
#[tokio::test]
async fn a_plugins_emitted_streams_hold_at_most_its_bytes() {
    let redis = RedisServer::start();
    let r = recorder_runner_with(&redis, &["--emitted-max-bytes", "1048576"]).await;
    let url = format!("{}/v1/tasks", r.url);
    let blob = "e".repeat(50_000);
    let tasks: Vec<Value> = (0..60)
        .map(|i| {
            json!({"id": format!("big-{i:02}"), "plugin": "bench-record",
                        "payload": {"blob": blob}, "max_attempts": 1})
        })
        .collect();
    let (s, e) = post(&url, ADMIN, json!(tasks)).await;
    assert_eq!(s, 201, "{e}");
    eventually(Duration::from_secs(30), "60 runs done", || async {
        let mut done = 0;
        for i in 0..60 {
            let (_, t) = req("GET", &format!("{url}/big-{i:02}"), Some(ADMIN), None).await;
            match t["state"].as_str() {
                Some("done") => done += 1,
                Some("dead") => panic!("a run failed: {t}"),
                _ => {}
            }
        }
        (done == 60).then_some(())
    })
    .await;
    let stream = "{eggtimer}:events:bench-record:bench";
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query(&mut redis.conn())
        .unwrap();
    let bytes: usize = entries
        .iter()
        .flat_map(|(_, fields)| fields.iter().map(|(k, v)| k.len() + v.len()))
        .sum();
    assert!(bytes <= 1 << 20, "the stream holds {bytes} bytes");
    assert!(
        bytes > (1 << 20) - 60_000,
        "the stream dropped more than it needed: {bytes} bytes left"
    );
    assert!(
        (15..=21).contains(&entries.len()),
        "{} entries",
        entries.len()
    );
    let counted: Option<u64> = redis::cmd("HGET")
        .arg("{eggtimer}:plugin:emitted:bench-record")
        .arg(stream)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(counted, Some(bytes as u64));
    // each kept entry is one run's
    let kept: Vec<String> = entries
        .iter()
        .map(|(_, f)| {
            let data = &f.iter().find(|(k, _)| k == "data").unwrap().1;
            serde_json::from_str::<Value>(data).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let mut unique = kept.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), kept.len(), "a run's entry is there twice");
}
