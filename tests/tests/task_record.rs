//! A task's own record: the log lines of its last three attempts, and `start_by`. A real runner
//! process, real plugins, a real redis-server.

use std::time::Duration;

use eggtimer_tests::{
    RedisServer, call, eventually, now_ms, post_tasks as schedule, runner_fast_retry as start,
    wait_state,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// The raw log Redis keeps for a task of `plugin` (None: none).
fn stored_log(redis: &RedisServer, plugin: &str, id: &str) -> Option<String> {
    let shard = eggtimer::store::shard_of(id, 16);
    redis::cmd("HGET")
        .arg(format!("{{eggtimer:{shard}}}:logs"))
        .arg(eggtimer::store::task_key(plugin, id))
        .query(&mut redis.conn())
        .unwrap()
}

fn lines_of(t: &Value, attempt: u64) -> Vec<(String, String)> {
    t["log"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["attempt"] == attempt)
        .map(|l| {
            (
                l["level"].as_str().unwrap().to_owned(),
                l["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_task_keeps_the_log_lines_of_its_last_three_attempts() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let base = r.url.as_str();
    // attempts 1 to 3 log, print and fail; attempt 4 logs, prints and is done
    schedule(
        base,
        json!([
            {"plugin": "test-flood", "id": "logged", "max_attempts": 5, "payload": {"what": "log-attempts"}},
            {"plugin": "noop", "id": "quiet"}
        ]),
    )
    .await;
    let t = wait_state(base, "logged", "done", T).await;
    assert_eq!(t["attempts"], 4, "{t}");
    let attempts: Vec<u64> = t["log"]
        .as_array()
        .unwrap_or_else(|| panic!("no log: {t}"))
        .iter()
        .map(|l| l["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts, [2, 2, 2, 3, 3, 3, 4, 4], "{t}");
    for n in [2, 3] {
        assert_eq!(
            lines_of(&t, n),
            [
                ("info".to_owned(), format!("attempt {n} begins")),
                ("warn".to_owned(), format!("attempt {n} fails")),
                ("stdout".to_owned(), format!("printed in attempt {n}")),
            ],
            "{t}"
        );
    }
    assert_eq!(
        lines_of(&t, 4),
        [
            ("info".to_owned(), "attempt 4 begins".to_owned()),
            ("stdout".to_owned(), "printed in attempt 4".to_owned()),
        ]
    );
    // each line has its time, within the task's life
    let (created, finished) = (
        t["created_at"].as_i64().unwrap(),
        t["finished_at"].as_i64().unwrap(),
    );
    for l in t["log"].as_array().unwrap() {
        let at = l["time"].as_i64().unwrap();
        assert!(
            created <= at && at <= finished,
            "{l} outside {created}..{finished}"
        );
    }
    // a task that logged nothing shows no log, and Redis keeps none for it
    let quiet = wait_state(base, "quiet", "done", T).await;
    assert!(quiet.get("log").is_none(), "{quiet}");
    assert_eq!(stored_log(&redis, "noop", "quiet"), None);
    // scheduling the id again is a new task: the old one's log goes with it
    schedule(
        base,
        json!({"plugin": "test-flood", "id": "logged", "delay_ms": 3_600_000,
            "payload": {"what": "none"}}),
    )
    .await;
    let again = wait_state(base, "logged", "scheduled", T).await;
    assert!(again.get("log").is_none(), "{again}");
    assert_eq!(stored_log(&redis, "test-flood", "logged"), None);
}

#[tokio::test]
async fn a_flood_of_log_lines_keeps_8_kib_and_goes_with_its_task() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let base = r.url.as_str();
    // 64 KiB lines until the run's effects budget stops it, on each of two attempts
    schedule(
        base,
        json!({"plugin": "test-flood", "id": "chatty", "max_attempts": 2, "payload": {"what": "logs"}}),
    )
    .await;
    let t = wait_state(base, "chatty", "dead", T).await;
    let stored = stored_log(&redis, "test-flood", "chatty").expect("a log kept");
    assert!(stored.len() <= 8192, "{} bytes kept", stored.len());
    let log = t["log"].as_array().unwrap();
    // one attempt's lines fill the 8 KiB: only the last attempt's are kept
    assert!(log.iter().all(|l| l["attempt"] == 2), "{t}");
    let (first, last) = (&log[0]["message"], &log[log.len() - 1]["message"]);
    let first = first.as_str().unwrap();
    assert!(
        first.starts_with("xxxx") && first.ends_with(&format!("(cut: {} bytes in all)", 64 * 1024)),
        "{}",
        &first[first.len().saturating_sub(100)..]
    );
    assert!(
        last.as_str()
            .unwrap()
            .ends_with("more lines not kept (a task keeps 8192 bytes of log)"),
        "{last}"
    );
    // dropping the dead letter drops its log
    let (s, _) = call("DELETE", &format!("{base}/v1/dead/chatty"), None).await;
    assert_eq!(s, 204);
    assert_eq!(stored_log(&redis, "test-flood", "chatty"), None);
}

#[tokio::test]
async fn a_task_not_started_by_its_start_by_is_dead_as_expired() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let base = r.url.as_str();
    // a start_by before the task is due could never be met
    let now = now_ms();
    let (s, e) = call(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(json!({"plugin": "noop", "run_at": now + 60_000, "start_by": now + 1_000})),
    )
    .await;
    assert_eq!(
        (s, &e["error"]["code"]),
        (422, &json!("invalid_task")),
        "{e}"
    );
    assert!(
        e["error"]["message"].as_str().unwrap().contains("start_by"),
        "{e}"
    );
    // a paused plugin holds its tasks past one's start_by
    let (s, _) = call("POST", &format!("{base}/v1/plugins/noop/pause"), None).await;
    assert_eq!(s, 200);
    let by = now_ms() + 300;
    schedule(
        base,
        json!([
            {"plugin": "noop", "id": "late", "start_by": by},
            {"plugin": "noop", "id": "in-time", "start_by": by + 3_600_000}
        ]),
    )
    .await;
    let (_, t) = call("GET", &format!("{base}/v1/tasks/late"), None).await;
    assert_eq!(
        (&t["state"], &t["start_by"]),
        (&json!("scheduled"), &json!(by)),
        "{t}"
    );
    eventually(T, "start_by to pass", || async {
        (now_ms() > by + 50).then_some(())
    })
    .await;
    let (s, _) = call("POST", &format!("{base}/v1/plugins/noop/resume"), None).await;
    assert_eq!(s, 200);
    let late = wait_state(base, "late", "dead", T).await;
    let err = late["last_error"].as_str().unwrap();
    assert!(
        err.starts_with("expired: not started by its start_by"),
        "{late}"
    );
    let fine = wait_state(base, "in-time", "done", T).await;
    assert_eq!(fine["attempts"], 1, "{fine}");
}
