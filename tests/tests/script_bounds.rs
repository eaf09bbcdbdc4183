//! Every script eggtimer runs in Redis, driven with the largest inputs the API and the host
//! functions admit, is called, and no call comes near the time at which Redis stops answering
//! everyone else (`busy-reply-threshold`, 5 s; asserted under 1 s). How long the slowest call of
//! each script takes is printed, not asserted (the goal is 10 ms; the scripts that miss it are
//! listed in ARCHITECTURE.md). Read from Redis's own slow log (every command of 1 ms or
//! more: at 0 a shift of 10,000 tasks alone logs more than the log keeps, since Redis logs the
//! commands a script runs as well) and from the functions Redis loaded (a runner loads a
//! script's function at its first call), on a runner of one shard, so each per-shard call gets
//! all of what a request brings.

#[path = "script_bounds/seen.rs"]
mod seen;

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, req, upload_as, wait_state};
use eggtimer_tests::redis_log::{FAR_FROM_BUSY_MICROS, log_every_call};
use eggtimer_tests::{RedisServer, RunnerProcess, eventually, padded, plugin_wasm};
use seen::{Seen, every_script, loaded};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(120);

/// POSTs `body` to `path` as the admin and asserts the answer's status.
async fn call(base: &str, method: &str, path: &str, body: Option<Value>, want: u16) -> Value {
    let (s, t) = req(method, &format!("{base}{path}"), Some(ADMIN), body).await;
    let text = t.to_string();
    assert_eq!(s, want, "{method} {path}: {}", &text[..text.len().min(400)]);
    t
}

/// Waits until `path`'s answer says `done`.
async fn until(base: &str, path: &str, what: &str, done: impl Fn(&Value) -> bool) {
    eventually(T, what, || async {
        let (s, t) = req("GET", &format!("{base}{path}"), Some(ADMIN), None).await;
        (s == 200 && done(&t)).then_some(())
    })
    .await
}

/// The number of tasks a page of `GET /v1/tasks` holds.
fn count(page: &Value) -> usize {
    page["tasks"].as_array().map_or(0, Vec::len)
}

/// Each of the 44 scripts is called with the largest input a request, a run's effects or the
/// runner's own work can give it: a 30 MB batch of 60 KB payloads (plain, debounced on one key,
/// of one owner), 600 tasks listening eight times each with one topic and key in common (an
/// event that reaches more listeners than one call hands over, so a drain), 250 events of 60 KB,
/// runs that write kv, events, logs and follow-ups up to the host's limits, a claim of
/// 60 KB tasks all due at once, 200 runs held past a third of their lease, a plugin of 63 MiB
/// uploaded, promoted and rolled back, pauses and resumes of 10,000 tasks of a plugin and of an
/// owner, a shift and a cancel of that owner's 10,000, pages of 1,000, a cancel of a task
/// claimed ahead (a revocation), schedules that fire, dead letters retried and dropped, a plugin
/// deleted with its tasks and kv, tasks in the far tier read, cancelled, moved, replaced and
/// brought back by that delete. Every script's function is loaded (called), and no call held
/// Redis for a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_called_with_its_largest_inputs_stays_far_from_blocking_redis() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--token",
            ADMIN,
            "--shards",
            "1",
            "--lease",
            "3s",
            // (done records are swept by later finishes: the waits below see them done first)
            "--keep-done",
            "10s",
            "--team-task-bytes",
            "1073741824",
            // (the tasks the other steps schedule stay live: none is plain and 2 h away)
            "--far-horizon",
            "2h",
        ],
    );
    let base = r.url.clone();
    let base = base.as_str();
    let mut conn = redis.conn();
    log_every_call(&mut conn);
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(1000)
        .query(&mut conn)
        .unwrap();
    let mut seen = Seen::default();
    let pad = "x".repeat(60_000);

    // plugins: the runner's own, and the largest the API takes, twice (promote, rollback)
    for p in ["bench-record", "test-flood", "test-panic", "test-sleep"] {
        let (s, up) = upload_as(base, ADMIN, p, plugin_wasm(p)).await;
        assert_eq!(s, 201, "{up}");
    }
    let big = padded(&plugin_wasm("bench-record"), 63 << 20);
    let (s, up) = upload_as(base, ADMIN, "big", big.clone()).await;
    assert_eq!(s, 201, "{up}");
    let mut bigger = big;
    bigger.truncate(bigger.len() - 1024);
    let bigger = padded(&plugin_wasm("bench-record"), bigger.len());
    let (s, up) = upload_as(base, ADMIN, "big", bigger).await;
    assert_eq!(s, 201, "{up}");
    call(base, "POST", "/v1/plugins/big/rollback", None, 200).await;
    call(
        base,
        "POST",
        "/v1/plugins/big/promote",
        Some(json!({"version": 2})),
        200,
    )
    .await;
    // a quota of the plugin's own (its admission ledger), a concurrency and a rate limit
    call(
        base,
        "PATCH",
        "/v1/plugins/bench-record",
        Some(json!({"max_pending": 100_000})),
        200,
    )
    .await;
    call(
        base,
        "PATCH",
        "/v1/plugins/test-sleep",
        Some(
            json!({"max_concurrency": 150, "rate_limit": {"max": 1000, "per_ms": 1000},
                    "time_limit_ms": 5000}),
        ),
        200,
    )
    .await;
    seen.read(&mut conn, "uploads and settings");

    // the largest batches: 500 × 60 KB, plain (an hour ahead), debounced on one key, owned
    let batch = |f: &dyn Fn(usize) -> Value| -> Value { (0..500).map(f).collect() };
    call(
        base,
        "POST",
        "/v1/tasks",
        Some(batch(&|i| {
            json!({"plugin": "bench-record", "id": format!("p{i}"), "delay_ms": 3_600_000,
                   "priority": i % 10, "unique_for_ms": 600_000, "payload": {"i": i, "pad": pad}})
        })),
        201,
    )
    .await;
    for _ in 0..2 {
        call(
            base,
            "POST",
            "/v1/tasks",
            Some(batch(&|i| {
                json!({"plugin": "bench-record", "payload": {"i": i, "pad": pad},
                       "debounce": {"key": "flood", "quiet_ms": 3_600_000, "max_wait_ms": 3_600_000}})
            })),
            201,
        )
        .await;
    }
    seen.read(&mut conn, "batches of 30 MB");

    // the far tier: 500 × 60 KB plain tasks three hours ahead in one minute (a far slot takes
    // 256 KiB of them, the rest stay live) and 2,000 small ones in the next; one of them read,
    // one missing id read, one cancelled, one moved, one replaced (the plugin's delete at the
    // end brings the rest back and deletes them)
    let far = eggtimer_tests::now_ms() + 3 * 3_600_000;
    let far = far - far % 60_000 + 60_000;
    call(
        base,
        "POST",
        "/v1/tasks",
        Some(batch(&|i| {
            json!({"plugin": "bench-record", "id": format!("far{i}"), "run_at": far + i as i64,
                   "payload": {"i": i, "pad": pad}})
        })),
        201,
    )
    .await;
    for b in 0..4 {
        call(
            base,
            "POST",
            "/v1/tasks",
            Some(batch(&|i| {
                json!({"plugin": "bench-record", "id": format!("fs{b}-{i}"),
                       "run_at": far + 60_000 + i as i64, "payload": i})
            })),
            201,
        )
        .await;
    }
    let fs0 = call(base, "GET", "/v1/tasks/fs0-0", None, 200).await;
    assert_eq!(fs0["run_at"], far + 60_000, "{fs0}");
    let (s, _) = req(
        "GET",
        &format!("{base}/v1/tasks/nowhere"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, 404);
    call(base, "DELETE", "/v1/tasks/fs0-1", None, 204).await;
    call(
        base,
        "PATCH",
        "/v1/tasks/fs0-2",
        Some(json!({"shift_ms": 60_000})),
        200,
    )
    .await;
    call(
        base,
        "POST",
        "/v1/tasks",
        Some(json!([{"plugin": "bench-record", "id": "fs0-3", "run_at": far + 120_000, "payload": 3}])),
        201,
    )
    .await;
    seen.read(&mut conn, "the far tier");

    // an owner's 10,000 tasks, in batches of 500
    for b in 0..20 {
        call(
            base,
            "POST",
            "/v1/tasks",
            Some(batch(&|i| {
                json!({"plugin": "bench-record", "id": format!("o{b}-{i}"), "owner": "acme",
                       "delay_ms": 3_600_000 + i * 10, "payload": i})
            })),
            201,
        )
        .await;
        seen.read(&mut conn, "an owner's 10,000 tasks");
    }
    // paused and resumed, as an owner and as a plugin (the resumes walk all of them)
    for (pause, resume) in [
        ("/v1/owners/acme/pause", "/v1/owners/acme/resume"),
        (
            "/v1/plugins/bench-record/pause",
            "/v1/plugins/bench-record/resume",
        ),
    ] {
        call(base, "POST", pause, None, 200).await;
        seen.read(&mut conn, "a pause of 10,000");
        call(base, "POST", resume, None, 200).await;
        seen.read(&mut conn, "a resume of 10,000");
    }
    call(
        base,
        "POST",
        "/v1/owners/acme/shift",
        Some(json!({"shift_ms": 60_000})),
        200,
    )
    .await;
    seen.read(&mut conn, "a shift of 10,000");
    call(base, "GET", "/v1/owners/acme/stats", None, 200).await;
    // pages of 1,000 of every index; the counts and the owners' backlog of /metrics
    for q in [
        "state=scheduled&limit=1000",
        "state=scheduled&owner=acme&limit=1000",
        "state=scheduled&due_after=0&due_before=253402300799999&limit=1000",
    ] {
        let page = call(base, "GET", &format!("/v1/tasks?{q}"), None, 200).await;
        assert!(count(&page) > 0, "{q}: none listed");
    }
    call(base, "GET", "/v1/stats", None, 200).await;
    let (s, _) = req("GET", &format!("{base}/metrics"), Some(ADMIN), None).await;
    assert_eq!(s, 200);
    let (s, _) = req("GET", &format!("{base}/readyz"), None, None).await;
    assert_eq!(s, 200);
    seen.read(&mut conn, "pauses, shift, pages of an owner's 10,000");

    // 600 tasks listening eight times each, one topic and key in common; 500 events of 60 KB
    let on = |i: usize| -> Value {
        let mut on = vec![json!({"topic": "shared", "key": "all", "then": "run"})];
        on.extend(
            (1..8).map(|k| json!({"topic": "own", "key": format!("{i}-{k}"), "then": "cancel"})),
        );
        json!(on)
    };
    for b in 0..2 {
        call(
            base,
            "POST",
            "/v1/tasks",
            Some(
                (0..300)
                    .map(|i| {
                        let i = b * 300 + i;
                        json!({"plugin": "bench-record", "id": format!("l{i}"),
                               "delay_ms": 3_600_000, "payload": i, "on": on(i)})
                    })
                    .collect(),
            ),
            201,
        )
        .await;
    }
    // one let go by a cancel, one by its event
    call(base, "DELETE", "/v1/tasks/l0", None, 204).await;
    call(
        base,
        "POST",
        "/v1/events/own",
        Some(json!([{"key": "1-1", "data": {"pad": pad}}])),
        200,
    )
    .await;
    // (250: the most a key publishes within the retention is 16 MiB, --events-max-bytes)
    let events: Vec<Value> = (0..250)
        .map(|i| json!({"key": format!("e{i}"), "data": {"i": i, "pad": pad}}))
        .collect();
    call(
        base,
        "POST",
        "/v1/events/elsewhere",
        Some(json!(events)),
        200,
    )
    .await;
    call(
        base,
        "POST",
        "/v1/events/shared",
        Some(json!([{"key": "all", "data": {"go": 1}}])),
        200,
    )
    .await;
    until(
        base,
        "/v1/tasks?state=scheduled&limit=1000",
        "the 598 listeners to run",
        |page| {
            !page["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["id"].as_str().is_some_and(|id| id.starts_with('l')))
        },
    )
    .await;
    seen.read(&mut conn, "listeners and events");

    // a claim of 60 KB tasks all due at once; runs that flood every effect to its limit
    call(
        base,
        "POST",
        "/v1/tasks",
        Some(batch(&|i| {
            json!({"plugin": "bench-record", "id": format!("now{i}"), "payload": {"i": i, "pad": pad}})
        })),
        201,
    )
    .await;
    // (each stops at the host's first refusal and ends done: what it was given is committed)
    let floods = ["kv", "events", "follow-ups", "log-attempts", "one-of-each"];
    for what in floods {
        call(
            base,
            "POST",
            "/v1/tasks",
            Some(
                json!({"plugin": "test-flood", "id": format!("flood-{what}"), "max_attempts": 1,
                        "owner": "floods", "payload": {"what": what, "keep": true}}),
            ),
            201,
        )
        .await;
    }
    wait_state(base, "now499", "done").await;
    for what in floods {
        eventually(T, &format!("flood-{what} to end"), || async {
            let (s, t) = req(
                "GET",
                &format!("{base}/v1/tasks/flood-{what}"),
                Some(ADMIN),
                None,
            )
            .await;
            (s == 200 && (t["state"] == "done" || t["state"] == "dead")).then_some(())
        })
        .await;
    }
    seen.read(&mut conn, "a claim of 60 KB tasks, floods");

    // 200 runs held past a third of their lease (renewals), under the concurrency and rate
    // limits; dead letters retried and dropped
    call(
        base,
        "POST",
        "/v1/tasks",
        Some(
            (0..200)
                .map(|i| json!({"plugin": "test-sleep", "id": format!("s{i}"), "payload": {"ms": 1500}}))
                .collect(),
        ),
        201,
    )
    .await;
    call(
        base,
        "POST",
        "/v1/tasks",
        Some(
            (0..500)
                .map(|i| {
                    json!({"plugin": "test-panic", "id": format!("d{i}"), "max_attempts": 1,
                                "payload": {"pad": pad}})
                })
                .collect(),
        ),
        201,
    )
    .await;
    until(
        base,
        "/v1/tasks?plugin=test-panic&state=dead&limit=1000",
        "500 dead letters",
        |p| p["tasks"].as_array().is_some_and(|t| t.len() == 500),
    )
    .await;
    call(base, "POST", "/v1/dead/d0/retry", None, 200).await;
    call(
        base,
        "POST",
        "/v1/dead/retry",
        Some(json!({"plugin": "test-panic"})),
        200,
    )
    .await;
    until(
        base,
        "/v1/tasks?plugin=test-panic&state=dead&limit=1000",
        "the retried to die again",
        |p| p["tasks"].as_array().is_some_and(|t| t.len() == 500),
    )
    .await;
    call(base, "DELETE", "/v1/dead?plugin=test-panic", None, 200).await;
    wait_state(base, "s199", "done").await;
    seen.read(&mut conn, "held runs, dead letters");

    // a steady stream (one task a ms) claimed ahead, and a cancel of a task claimed ahead: a
    // revocation (answered 204 when its runner took it back in time, 409 when it had started).
    // Each look asks for the next task a few ms from due; a stream that ends before one is
    // found claimed ahead (a loaded machine's claims may be full: nothing ahead) is followed by
    // another.
    let stream_at = |k: usize| {
        let first = eggtimer_tests::now_ms() + 1500;
        let specs: Vec<Value> = (0..3000)
            .map(|i| json!({"plugin": "bench-record", "id": format!("a{k}-{i}"), "run_at": first + i}))
            .collect();
        (first, specs)
    };
    let streams = std::cell::RefCell::new(Vec::<i64>::new());
    eventually(T, "a cancel of a task claimed ahead", || async {
        let now = eggtimer_tests::now_ms();
        let last = streams.borrow().last().copied();
        let Some(first) = last.filter(|f| now + 20 < f + 3000) else {
            let k = streams.borrow().len();
            let (first, specs) = stream_at(k);
            for chunk in specs.chunks(1000) {
                call(base, "POST", "/v1/tasks", Some(json!(chunk)), 201).await;
            }
            streams.borrow_mut().push(first);
            return None;
        };
        let k = streams.borrow().len() - 1;
        // (well inside the window a claim takes ahead, so the cancel meets it not started)
        let i = (now + 20 - first).max(0);
        let id = format!("a{k}-{i}");
        let (s, t) = req("GET", &format!("{base}/v1/tasks/{id}"), Some(ADMIN), None).await;
        if s != 200 || t["state"] != "running" || first + i < eggtimer_tests::now_ms() + 10 {
            return None;
        }
        let (s, t) = req(
            "DELETE",
            &format!("{base}/v1/tasks/{id}"),
            Some(ADMIN),
            None,
        )
        .await;
        assert!(
            s == 204 || s == 409,
            "the cancel of {id}, claimed ahead: {s} {t}"
        );
        Some(())
    })
    .await;
    seen.read(&mut conn, "a stream claimed ahead, a revocation");

    // schedules that fire with 60 KB payloads; a move; an owner's 10,000 cancelled
    for i in 0..3 {
        call(
            base,
            "PUT",
            &format!("/v1/schedules/every-{i}"),
            Some(json!({"plugin": "bench-record", "every_ms": 1000, "payload": {"pad": pad}})),
            201,
        )
        .await;
    }
    until(base, "/v1/schedules/every-2", "a firing", |s| {
        s["last_task_id"].is_string()
    })
    .await;
    call(
        base,
        "PATCH",
        "/v1/tasks/p1",
        Some(json!({"shift_ms": 60_000})),
        200,
    )
    .await;
    call(base, "DELETE", "/v1/owners/acme/tasks", None, 200).await;
    seen.read(&mut conn, "schedules, a move, an owner cancelled");

    // a key changed (the audit of changes meanwhile); a plugin deleted with its tasks and kv
    let key = call(
        base,
        "POST",
        "/v1/keys",
        Some(json!({"name": "team-a", "role": "developer", "plugins": ["bench-*"]})),
        201,
    )
    .await;
    call(
        base,
        "PATCH",
        &format!("/v1/keys/{}", key["id"].as_str().unwrap()),
        Some(json!({"plugins": ["bench-record"]})),
        200,
    )
    .await;
    call(
        base,
        "DELETE",
        "/v1/plugins/test-flood?tasks=cancel",
        None,
        204,
    )
    .await;
    call(
        base,
        "DELETE",
        "/v1/plugins/bench-record?tasks=cancel",
        None,
        204,
    )
    .await;
    // the runner's own work goes on meanwhile: heartbeats, shard leases, renewals
    tokio::time::sleep(Duration::from_millis(1500)).await;
    seen.read(&mut conn, "keys, plugins deleted");

    let mut table = String::new();
    for (script, (calls, max, phase)) in &seen.scripts {
        table.push_str(&format!(
            "{script:>16} {calls:>6} calls of 1 ms or more, slowest {max:>6} µs ({phase})\n"
        ));
    }
    println!("{table}");
    let called = loaded(&mut conn);
    let missing: Vec<String> = every_script()
        .into_iter()
        .filter(|s| !called.contains(s))
        .collect();
    assert!(
        missing.is_empty(),
        "scripts never called: {missing:?}\n{table}"
    );
    let slow: Vec<_> = seen
        .scripts
        .iter()
        .filter(|(_, (_, max, _))| *max >= FAR_FROM_BUSY_MICROS)
        .collect();
    assert!(slow.is_empty(), "calls near Redis's BUSY time:\n{table}");
}
