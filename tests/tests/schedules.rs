//! Recurring schedules through real runner processes: every firing once over a restart and a
//! kill -9 of the runners driving them, and cron in a time zone with daylight saving time.

use std::collections::HashMap;
use std::time::Duration;

use eggtimer_tests::{
    RedisServer, RunnerProcess, call, eventually, read_events, runner_fast_retry as start,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);

/// The shards a runner owns, from the namespace's runner list.
async fn shards_of(r: &RunnerProcess) -> Vec<u64> {
    let (s, list) = call("GET", &format!("{}/v1/runners", r.url), None).await;
    assert_eq!(s, 200, "{list}");
    list.as_array()
        .unwrap()
        .iter()
        .find(|x| x["address"] == format!("http://127.0.0.1:{}", r.port))
        .map(|x| {
            x["shards"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_u64().unwrap())
                .collect()
        })
        .unwrap_or_default()
}

/// The index of the runner that owns the home shard of schedule `id` (and so drives it).
async fn driver(id: &str, rs: &[RunnerProcess]) -> usize {
    let home = u64::from(eggtimer::store::shard_of(id, 16));
    for (i, r) in rs.iter().enumerate() {
        if shards_of(r).await.contains(&home) {
            return i;
        }
    }
    panic!("nobody drives {id}")
}

/// Every-second schedules on three runners, over a graceful restart of one runner and a kill -9
/// of another (each the driver of a schedule): every firing between the first and the last is
/// created and run exactly once.
#[tokio::test]
async fn schedules_fire_every_firing_once_over_a_restart_and_a_kill() {
    let redis = RedisServer::start();
    let mut runners: Vec<RunnerProcess> = (0..3).map(|_| start(&redis, &[])).collect();
    let base = runners[0].url.clone();
    let ids = ["every-a", "every-b", "every-c"];
    for id in ids {
        let url = format!("{base}/v1/schedules/{id}");
        let body = json!({"plugin": "coupon-expiry", "every_ms": 1000, "overlap": "allow",
                          "payload": {"coupon_id": id, "user_id": "u", "expires_at": 0}});
        let (s, b) = call("PUT", &url, Some(body.clone())).await;
        assert_eq!(s, 201, "{b}");
        // the same definition again changes nothing
        let (s2, b2) = call("PUT", &url, Some(body)).await;
        assert_eq!((s2, &b2["next_run_at"]), (200, &b["next_run_at"]), "{b2}");
    }
    // membership settles: every shard owned
    eventually(T, "all shards owned", || async {
        let mut n = 0;
        for r in &runners {
            n += shards_of(r).await.len();
        }
        (n == 16).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    // restart (SIGTERM) the runner driving every-a, kill -9 the one driving every-b
    let a = driver("every-a", &runners).await;
    assert!(
        runners[a].terminate().is_some(),
        "the runner stopped on SIGTERM"
    );
    runners[a] = start(&redis, &[]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let b = driver("every-b", &runners).await;
    runners[b].kill();
    tokio::time::sleep(Duration::from_secs(12)).await;
    for id in ids {
        let (s, _) = call(
            "DELETE",
            &format!("{}/v1/schedules/{id}", runners[(b + 1) % 3].url),
            None,
        )
        .await;
        assert_eq!(s, 204);
    }
    let live = runners[(b + 1) % 3].url.clone();
    // every firing created runs (the killed runner's tasks after their leases)
    eventually(T, "every firing done", || async {
        let (_, page) = call(
            "GET",
            &format!("{live}/v1/tasks?plugin=coupon-expiry&state=scheduled&limit=1000"),
            None,
        )
        .await;
        let (_, running) = call(
            "GET",
            &format!("{live}/v1/tasks?plugin=coupon-expiry&state=running&limit=1000"),
            None,
        )
        .await;
        (page["tasks"].as_array().unwrap().is_empty()
            && running["tasks"].as_array().unwrap().is_empty())
        .then_some(())
    })
    .await;
    let events = read_events(&mut redis.conn(), &["coupon-expiry"], "push");
    let mut runs: HashMap<String, usize> = HashMap::new();
    for (task, _, _) in &events {
        *runs.entry(task.clone()).or_default() += 1;
    }
    let doubled: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "firings that ran twice: {doubled:?}");
    for id in ids {
        let mut times: Vec<i64> = runs
            .keys()
            .filter_map(|t| t.strip_prefix(&format!("{id}@")))
            .map(|t| t.parse().unwrap())
            .collect();
        times.sort();
        assert!(
            times.len() >= 20,
            "{id} fired {} times: {times:?}",
            times.len()
        );
        let missing: Vec<i64> = times
            .windows(2)
            .filter(|w| w[1] - w[0] != 1000)
            .map(|w| w[0] + 1000)
            .collect();
        assert!(
            missing.is_empty(),
            "{id}: firings lost after {missing:?} (of {times:?})"
        );
        assert!(
            times.iter().all(|t| t % 1000 == 0),
            "{id}: off its every_ms grid"
        );
    }
}

/// Cron in a time zone with daylight saving time, as the API reports the next fire times.
#[tokio::test]
async fn cron_schedules_follow_dst_in_their_time_zone() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let ny = |y: i32, mo: u32, d: u32, h: u32, mi: u32| -> i64 {
        use chrono::TimeZone;
        chrono_tz::America::New_York
            .with_ymd_and_hms(y, mo, d, h, mi, 0)
            .earliest()
            .unwrap()
            .timestamp_millis()
    };
    // 2027-03-14: clocks jump from 02:00 to 03:00 in New York
    let (s, b) = call(
        "PUT",
        &format!("{}/v1/schedules/spring", r.url),
        Some(
            json!({"plugin": "coupon-expiry", "cron": "30 2 * * *", "tz": "America/New_York",
                    "payload": {"coupon_id": "c", "user_id": "u", "expires_at": 0},
                    "start_at": ny(2027, 3, 13, 0, 0)}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["next_run_at"], ny(2027, 3, 13, 2, 30));
    let (_, g) = call("GET", &format!("{}/v1/schedules/spring", r.url), None).await;
    let up: Vec<i64> = g["upcoming"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(up.len(), 5, "{g}");
    assert_eq!(
        &up[..3],
        &[
            ny(2027, 3, 13, 2, 30),
            ny(2027, 3, 14, 3, 0),
            ny(2027, 3, 15, 2, 30)
        ],
        "the 02:30 that does not exist fires once, at 03:00"
    );
    // 2027-11-07: clocks go back from 02:00 to 01:00; 01:30 happens twice
    let (s, _) = call(
        "PUT",
        &format!("{}/v1/schedules/fall", r.url),
        Some(
            json!({"plugin": "coupon-expiry", "cron": "30 1 * * *", "tz": "America/New_York",
                    "payload": {"coupon_id": "c", "user_id": "u", "expires_at": 0},
                    "start_at": ny(2027, 11, 6, 0, 0)}),
        ),
    )
    .await;
    assert_eq!(s, 201);
    let (_, g) = call("GET", &format!("{}/v1/schedules/fall", r.url), None).await;
    let up: Vec<i64> = g["upcoming"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(up[1], ny(2027, 11, 7, 1, 30), "the first 01:30");
    assert_eq!(
        up[2] - up[1],
        25 * 3_600_000,
        "no second firing in the repeated hour: {up:?}"
    );
    // the list, pause and resume
    let (_, list) = call("GET", &format!("{}/v1/schedules", r.url), None).await;
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    let (s, p) = call("POST", &format!("{}/v1/schedules/fall/pause", r.url), None).await;
    assert_eq!(
        (s, &p["paused"], &p["next_run_at"]),
        (200, &json!(true), &Value::Null)
    );
    let (s, p) = call("POST", &format!("{}/v1/schedules/fall/resume", r.url), None).await;
    assert_eq!((s, &p["paused"]), (200, &json!(false)));
    assert_eq!(p["next_run_at"], ny(2027, 11, 6, 1, 30));
    // bad input names the field: 400 malformed, 422 a cron or time zone that does not exist
    for (body, field, status) in [
        (
            json!({"plugin": "coupon-expiry", "cron": "61 * * * *"}),
            "cron",
            422,
        ),
        (
            json!({"plugin": "coupon-expiry", "cron": "* * * * *", "tz": "Mars/Base"}),
            "tz",
            422,
        ),
        (
            json!({"plugin": "coupon-expiry", "cron": "* * * * *", "every_ms": 1000}),
            "exactly one",
            400,
        ),
        (
            json!({"plugin": "coupon-expiry", "every_ms": 5}),
            "every_ms",
            400,
        ),
        (json!({"plugin": "coupon-expiry", "cron": ""}), "cron", 400),
        (
            json!({"plugin": "coupon-expiry", "cron": "* * * *"}),
            "5 fields",
            400,
        ),
    ] {
        let (s, e) = call("PUT", &format!("{}/v1/schedules/bad", r.url), Some(body)).await;
        assert_eq!(s, status, "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(field),
            "{e}"
        );
    }
}
