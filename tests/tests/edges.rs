//! Hardened edges: every input bounded, typed errors, batches all or nothing, an HTTP server that
//! can't be exhausted, the private redis-server locked and with a password, a compiled-plugin
//! cache that is not a way in. All through real processes.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use eggtimer_tests::{
    RedisServer, RunnerProcess, call, eggtimer_bin, eventually, now_ms, plugins_dir, temp_dir,
    wait_state,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

fn start(redis: &RedisServer, extra: &[&str]) -> RunnerProcess {
    RunnerProcess::with_plugins(redis, extra)
}

fn code(b: &Value) -> &str {
    b["error"]["code"].as_str().unwrap_or("")
}

fn message(b: &Value) -> &str {
    b["error"]["message"].as_str().unwrap_or("")
}

/// Sends raw bytes as an HTTP/1.1 request and returns (status, JSON body).
fn raw_http(port: u16, request: &str) -> (u16, Value) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (
        status,
        serde_json::from_str(body).unwrap_or(Value::String(body.into())),
    )
}

#[tokio::test]
async fn out_of_range_times_shifts_ids_and_owners_are_400_naming_the_field_and_change_nothing() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let tasks = format!("{}/v1/tasks", r.url);
    let big = "x".repeat(5000);
    let cases = [
        (
            json!({"plugin": "noop", "run_at": i64::MAX}),
            "run_at must be a time",
        ),
        (
            json!({"plugin": "noop", "run_at": -1}),
            "run_at must be a time",
        ),
        (
            json!({"plugin": "noop", "delay_ms": i64::MAX}),
            "delay_ms must be from 0",
        ),
        (
            json!({"plugin": "noop", "run_at": 1.5}),
            "run_at must be an integer",
        ),
        (
            json!({"plugin": "noop", "id": big}),
            "id must be 1 to 200 bytes",
        ),
        (
            json!({"plugin": "noop", "id": "a\u{0}b"}),
            "id must be 1 to 200 bytes",
        ),
        (
            json!({"plugin": "noop", "owner": big}),
            "owner must be 1 to 200 bytes",
        ),
        (
            json!([{"plugin": "noop"}, {"plugin": "noop", "run_at": u64::MAX}]),
            "[1].run_at must be",
        ),
    ];
    for (body, want) in cases {
        let (s, b) = call("POST", &tasks, Some(body.clone())).await;
        assert_eq!((s, code(&b)), (400, "bad_request"), "{body}: {b}");
        assert!(message(&b).contains(want), "{body}: {b}");
    }
    // a task due in a minute, of an owner
    let due = now_ms() + 60_000;
    let (s, _) = call(
        "POST",
        &tasks,
        Some(json!({"plugin": "noop", "id": "t", "owner": "o", "run_at": due})),
    )
    .await;
    assert_eq!(s, 201);
    for shift in [i64::MAX, i64::MIN, -due - 1] {
        let (s, b) = call(
            "PATCH",
            &format!("{tasks}/t"),
            Some(json!({"shift_ms": shift})),
        )
        .await;
        assert_eq!(s, 400, "shift {shift}: {b}");
        let (s, b) = call(
            "POST",
            &format!("{}/v1/owners/o/shift", r.url),
            Some(json!({"shift_ms": shift})),
        )
        .await;
        assert_eq!(s, 400, "owner shift {shift}: {b}");
        assert!(message(&b).contains("shift_ms"), "{b}");
    }
    let (_, t) = call("GET", &format!("{tasks}/t"), None).await;
    assert_eq!(t["run_at"], due, "nothing moved");
    let (s, b) = call("GET", &format!("{tasks}/{}", "y".repeat(5000)), None).await;
    assert_eq!((s, code(&b)), (400, "bad_request"), "{b}");
    // every answer is JSON: 405, 404, a path that is not UTF-8
    let (s, b) = call("DELETE", &format!("{}/v1/plugins", r.url), None).await;
    assert_eq!((s, code(&b)), (405, "method_not_allowed"), "{b}");
    let (s, b) = call("GET", &format!("{}/nowhere", r.url), None).await;
    assert_eq!((s, code(&b)), (404, "not_found"), "{b}");
    let (s, b) = raw_http(
        r.port,
        "GET /v1/tasks/%FF%FE HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!((s, code(&b)), (400, "bad_request"), "{b}");
}

#[tokio::test]
async fn an_empty_token_is_refused_at_start() {
    let out = Command::new(eggtimer_bin())
        .args(["serve", "--redis", "redis://127.0.0.1:1", "--token", ""])
        .env_remove("EGGTIMER_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--token (or EGGTIMER_TOKEN) is empty"),
        "{err}"
    );
}

#[tokio::test]
async fn a_script_error_is_500_internal_and_only_an_unreachable_redis_is_503() {
    let mut redis = RedisServer::start();
    let r = start(&redis, &[]);
    // Break one shard's due-bucket index (a string where a ZSET belongs): its scripts fail.
    let shard = eggtimer::store::shard_of("boom", 16);
    let _: () = redis::cmd("SET")
        .arg(format!("{{eggtimer:{shard}}}:duex"))
        .arg("not a zset")
        .query(&mut redis.conn())
        .unwrap();
    let (s, b) = call(
        "POST",
        &format!("{}/v1/tasks", r.url),
        Some(json!({"plugin": "noop", "id": "boom"})),
    )
    .await;
    assert_eq!((s, code(&b)), (500, "internal"), "{b}");
    // the details are in the log (read from the runner's stderr as it arrives)
    eventually(T, "the script error in the runner's log", || async {
        r.log_text().contains("WRONGTYPE").then_some(())
    })
    .await;
    redis.stop();
    let (s, b) = call("GET", &format!("{}/v1/tasks/x", r.url), None).await;
    assert_eq!((s, code(&b)), (503, "redis_unavailable"), "{b}");
}

#[tokio::test]
async fn a_batch_with_one_refused_spec_stores_nothing_and_names_it() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--plugin-timeout", "10s"]);
    let tasks = format!("{}/v1/tasks", r.url);
    let (s, _) = call(
        "POST",
        &tasks,
        Some(json!({"plugin": "test-sleep", "id": "busy", "payload": {"ms": 4000}})),
    )
    .await;
    assert_eq!(s, 201);
    wait_state(&r.url, "busy", "running", T).await;
    let batch: Vec<Value> = (0..40)
        .map(|i| json!({"plugin": "noop", "id": format!("b{i}")}))
        .chain([json!({"plugin": "test-sleep", "id": "busy", "payload": {"ms": 1}})])
        .collect();
    let (s, b) = call("POST", &tasks, Some(json!(batch))).await;
    assert_eq!((s, code(&b)), (409, "conflict"), "{b}");
    assert!(
        message(&b).contains("[40]") && message(&b).contains("busy"),
        "{b}"
    );
    for i in 0..40 {
        let (s, _) = call("GET", &format!("{tasks}/b{i}"), None).await;
        assert_eq!(s, 404, "b{i} was stored from a refused batch");
    }
    let batch = json!([{"plugin": "noop", "id": "c0"}, {"plugin": "noop", "id": "c1"}, {"plugin": "nosuch", "id": "c2"}]);
    let (s, b) = call("POST", &tasks, Some(batch)).await;
    assert_eq!((s, code(&b)), (422, "unknown_plugin"), "{b}");
    assert!(message(&b).starts_with("[2] "), "{b}");
    let (s, _) = call("GET", &format!("{tasks}/c0"), None).await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn slow_clients_cannot_exhaust_the_listener() {
    let redis = RedisServer::start();
    let r = start(
        &redis,
        &["--http-max-connections", "4", "--http-header-timeout", "1s"],
    );
    // Four clients that never finish their headers take every connection...
    let mut slow: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", r.port)).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    // ...and are cut at the header timeout, so a normal request gets through.
    let (s, b) = call("GET", &format!("{}/healthz", r.url), None).await;
    assert_eq!((s, b), (200, json!({"ok": true})));
    // Each is closed by the server within 10 s (EOF, possibly after a 408, or a reset); a read
    // that times out means the connection was still open.
    let deadline = Instant::now() + Duration::from_secs(10);
    for c in &mut slow {
        let mut buf = [0u8; 256];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "a slow client was still connected after 10 s"
            );
            c.set_read_timeout(Some(left)).unwrap();
            match c.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    panic!("a slow client was still connected after 10 s")
                }
                Err(_) => break,
            }
        }
    }
}

#[tokio::test]
async fn sigterm_stops_claiming_at_once_even_while_a_client_holds_a_request_open() {
    let redis = RedisServer::start();
    let mut r = start(&redis, &[]);
    // a request whose body never arrives holds its connection
    let mut held = TcpStream::connect(("127.0.0.1", r.port)).unwrap();
    held.write_all(b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{").unwrap();
    let (s, _) = call(
        "POST",
        &format!("{}/v1/tasks", r.url),
        Some(json!({"plugin": "noop", "id": "later", "delay_ms": 1500})),
    )
    .await;
    assert_eq!(s, 201);
    let stopped = Instant::now();
    assert_eq!(r.terminate(), Some(0));
    let lived = stopped.elapsed();
    // HTTP drained the held request for a while after SIGTERM, past the task's due time...
    assert!(
        lived > Duration::from_millis(1500),
        "exited after {lived:?}"
    );
    // ...but claiming stopped at once: the task was never claimed.
    let shard = eggtimer::store::shard_of("later", 16);
    let rec: String = redis::cmd("HGET")
        .arg(format!("{{eggtimer:{shard}}}:tasks"))
        .arg(eggtimer::store::task_key("noop", "later"))
        .query(&mut redis.conn())
        .unwrap();
    assert!(
        rec.starts_with("s\t"),
        "the stopping runner claimed it: {rec}"
    );
    drop(held);
}

#[tokio::test]
async fn the_private_redis_has_a_password_and_its_data_dir_a_lock() {
    let dir = temp_dir("private");
    let plugins = plugins_dir();
    let r = RunnerProcess::start_private(&dir, &["--plugins-dir", plugins.to_str().unwrap()]);
    let url = std::fs::read_to_string(dir.join("redis-url")).unwrap();
    let url = url.trim();
    let mode = std::fs::metadata(dir.join("redis-url"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "redis-url is readable by others");
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert!(!r.log_text().contains(url), "the password is in the log");
    assert!(
        !r.log_text().contains('\u{1b}'),
        "colour codes in a log that is not a terminal"
    );
    // without the password Redis refuses; with the URL it answers
    let port = url.rsplit(':').next().unwrap();
    let open: redis::RedisResult<String> = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .and_then(|mut c| redis::cmd("PING").query(&mut c));
    let err = open.unwrap_err().to_string();
    assert!(
        err.contains("NOAUTH") || err.contains("Authentication"),
        "{err}"
    );
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    assert_eq!(redis::cmd("PING").query::<String>(&mut c).unwrap(), "PONG");
    // a second runner on the same directory is refused, clearly
    let out = Command::new(eggtimer_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ])
        .env_remove("EGGTIMER_REDIS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another eggtimer is already using the data directory"),
        "{err}"
    );
    drop(r);
}

#[tokio::test]
async fn a_tampered_compiled_plugin_is_compiled_again_not_loaded() {
    let redis = RedisServer::start();
    let cache = temp_dir("cache");
    let cache_arg = cache.to_str().unwrap().to_owned();
    let mut a = start(&redis, &["--plugin-cache", &cache_arg]);
    a.terminate();
    assert_eq!(
        std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let mut tampered = 0;
    for e in std::fs::read_dir(&cache).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "cwasm") {
            let mut bytes = std::fs::read(&p).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0xff;
            std::fs::write(&p, bytes).unwrap();
            tampered += 1;
        }
    }
    assert!(
        tampered >= 4,
        "the first runner cached its plugins ({tampered})"
    );
    let b = start(&redis, &["--plugin-cache", &cache_arg]);
    let (s, _) = call("POST", &format!("{}/v1/tasks", b.url), Some(json!({"plugin": "order-cancel", "id": "o", "payload": {"order_id": "1", "user_id": "u"}}))).await;
    assert_eq!(s, 201);
    wait_state(&b.url, "o", "done", T).await;
    eventually(T, "the runner to say it recompiled", || async {
        b.log_text()
            .contains("does not match its MAC")
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn outcomes_out_of_bounds_fail_the_attempt_and_keep_times_in_range() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--retry-base", "50ms"]);
    for what in ["retry-never", "run-again-never"] {
        let (s, _) = call(
            "POST",
            &format!("{}/v1/tasks", r.url),
            Some(json!({"plugin": "test-flood", "id": what, "max_attempts": 2, "payload": {"what": what}})),
        )
        .await;
        assert_eq!(s, 201);
        let t = wait_state(&r.url, what, "dead", T).await;
        let err = t["last_error"].as_str().unwrap_or_default();
        assert!(
            err.contains("the handler's outcome is out of bounds"),
            "{what}: {t}"
        );
        let due = t["run_at"].as_i64().unwrap();
        assert!(
            (0..=eggtimer::limits::MAX_TIME_MS).contains(&due),
            "{what}: {t}"
        );
    }
}

/// A 32 MiB error (a handler's error or a failing outcome) is kept cut to 4 KiB, saying how long
/// it was: the dead letter, its record in Redis and `GET /v1/dead` stay small.
#[tokio::test]
async fn a_32_mib_error_is_kept_cut_saying_how_long_it_was() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--retry-base", "50ms", "--plugin-timeout", "20s"]);
    for what in ["long-error", "long-fail"] {
        let (s, _) = call(
            "POST",
            &format!("{}/v1/tasks", r.url),
            Some(json!({"plugin": "test-flood", "id": what, "max_attempts": 1, "payload": {"what": what}})),
        )
        .await;
        assert_eq!(s, 201);
        let t = wait_state(&r.url, what, "dead", T).await;
        let err = t["last_error"].as_str().unwrap_or_default();
        // the message (a prefix of the host's, then the plugin's 32 MiB), cut, says how long
        let total: usize = err
            .rsplit_once("(cut: ")
            .and_then(|(_, t)| t.strip_suffix(" bytes in all)"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{what}: {}", &err[err.len().saturating_sub(200)..]));
        assert!(total >= 32 << 20, "{what}: {total}");
        assert!(
            err.len() <= eggtimer::limits::MAX_ERROR_BYTES + 64,
            "{what}: {} bytes",
            err.len()
        );
        let shard = eggtimer::store::shard_of(what, 16);
        let rec: String = redis::cmd("HGET")
            .arg(format!("{{eggtimer:{shard}}}:tasks"))
            .arg(eggtimer::store::task_key("test-flood", what))
            .query(&mut redis.conn())
            .unwrap();
        assert!(
            rec.len() < 8192,
            "{what}: the stored record is {} bytes",
            rec.len()
        );
    }
    let (s, b) = call("GET", &format!("{}/v1/dead", r.url), None).await;
    assert_eq!(s, 200);
    assert!(
        b.to_string().len() < 16_384,
        "GET /v1/dead is {} bytes",
        b.to_string().len()
    );
}

/// `cargo xtask run` becomes the runner (exec), so a SIGTERM sent to the process a person or a
/// supervisor started stops the runner and its private redis-server, freeing the port and the
/// data dir's lock.
#[tokio::test]
async fn sigterm_to_cargo_xtask_run_stops_the_runner_and_its_redis() {
    let dir = temp_dir("xtask-run");
    let port = eggtimer_tests::free_port();
    let mut child = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(eggtimer_tests::workspace())
        .args(["xtask", "run", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(&dir)
        .env_remove("EGGTIMER_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // (the first build may take a while; the plugins and the runner are built by now)
    let url = format!("http://127.0.0.1:{port}/healthz");
    eventually(
        Duration::from_secs(300),
        "cargo xtask run to serve",
        || async {
            eggtimer_tests::http()
                .get(&url)
                .send()
                .await
                .ok()?
                .status()
                .is_success()
                .then_some(())
        },
    )
    .await;
    let redis_url = std::fs::read_to_string(dir.join("redis-url")).unwrap();
    let redis_port: u16 = redis_url
        .trim()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = eventually(Duration::from_secs(60), "the runner to exit", || {
        let s = child.try_wait().unwrap();
        async move { s }
    })
    .await;
    assert_eq!(status.code(), Some(0), "{status}");
    for (what, p) in [("the runner", port), ("its redis-server", redis_port)] {
        eventually(
            Duration::from_secs(30),
            &format!("{what}'s port to close"),
            || async { TcpStream::connect(("127.0.0.1", p)).is_err().then_some(()) },
        )
        .await;
    }
}

#[tokio::test]
async fn a_redis_that_evicts_keys_is_refused_at_start_naming_the_setting() {
    let redis = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let out = Command::new(eggtimer_bin())
        .args(["serve", "--redis", &redis.url(), "--listen", "127.0.0.1:0"])
        .env_remove("EGGTIMER_TOKEN")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the runner started on an evicting Redis"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("maxmemory-policy allkeys-lru") && err.contains("noeviction"),
        "{err}"
    );
    // volatile-* evicts the keys with a TTL (leases, markers, slots): refused too
    let redis = RedisServer::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let out = Command::new(eggtimer_bin())
        .args(["serve", "--redis", &redis.url(), "--listen", "127.0.0.1:0"])
        .env_remove("EGGTIMER_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("maxmemory-policy volatile-lru"));
}
