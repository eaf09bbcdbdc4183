//! `max_pending_per_owner` over two real runner processes and a real redis-server: exact when
//! both runners admit one owner's tasks at once, held by a plugin whose runs fork that owner's
//! follow-ups, blind to every other owner; and the count it reads follows a task through every
//! way one comes and goes (upsert to another owner, cancel, debounce, run to done).

use std::time::Duration;

use eggtimer_tests::{
    RedisServer, call, eventually, runner_fast_retry as start, runners_holding_shards,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// The owner's counts of one plugin, as `GET /v1/owners/{owner}/stats` gives them.
async fn owner_counts(base: &str, owner: &str, plugin: &str) -> Option<Value> {
    let (s, stats) = call("GET", &format!("{base}/v1/owners/{owner}/stats"), None).await;
    assert_eq!(s, 200, "{stats}");
    let found = stats["plugins"]
        .as_array()?
        .iter()
        .find(|p| p["plugin"] == plugin);
    found.cloned()
}

fn n(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {v}"))
}

#[tokio::test]
async fn an_owners_quota_is_exact_across_two_runners_and_holds_against_its_forks() {
    let redis = RedisServer::start();
    let first = start(&redis, &["--workers", "4"]);
    let a = first.url.clone();
    let max = 100;
    let plugin = format!("{a}/v1/plugins/test-flood");
    let (s, p) = call(
        "PATCH",
        &plugin,
        Some(json!({"max_pending_per_owner": max})),
    )
    .await;
    assert_eq!((s, &p["max_pending_per_owner"]), (200, &json!(max)), "{p}");
    let second = start(&redis, &["--workers", "4"]);
    let b = second.url.clone();
    runners_holding_shards(&a, 2).await;
    // paused: what is admitted stays scheduled
    let (s, _) = call("POST", &format!("{plugin}/pause"), None).await;
    assert_eq!(s, 200);

    // 40 requests of 5 of alice's tasks at once, half to each runner: exactly 100 admitted
    let requests = (0..40).map(|r| {
        let base = if r % 2 == 0 { a.clone() } else { b.clone() };
        async move {
            let specs: Vec<Value> = (0..5)
                .map(|i| {
                    json!({"plugin": "test-flood", "id": format!("q{r}-{i}"), "owner": "alice",
                                "payload": {"what": "print"}})
                })
                .collect();
            call("POST", &format!("{base}/v1/tasks"), Some(json!(specs))).await
        }
    });
    let replies = futures::future::join_all(requests).await;
    let admitted = replies.iter().filter(|(s, _)| *s == 201).count();
    for (s, e) in replies.iter().filter(|(s, _)| *s != 201) {
        assert_eq!(
            (*s, e["error"]["code"].as_str()),
            (429, Some("owner_quota_exceeded")),
            "{e}"
        );
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("owner \"alice\" has")
                && msg.contains("of plugin \"test-flood\", whose max_pending_per_owner is 100"),
            "{e}"
        );
    }
    assert_eq!(admitted * 5, max as usize, "admitted requests of 5");
    let alice = owner_counts(&a, "alice", "test-flood").await.unwrap();
    assert_eq!(
        (n(&alice, "scheduled"), n(&alice, "pending")),
        (100, 100),
        "{alice}"
    );
    // another owner, and tasks without one, are not held by alice's quota
    let others: Vec<Value> = (0..5)
        .map(|i| {
            json!({"plugin": "test-flood", "id": format!("bob-{i}"), "owner": "bob",
                        "payload": {"what": "print"}})
        })
        .chain((0..5).map(|i| {
            json!({"plugin": "test-flood", "id": format!("none-{i}"),
                                     "payload": {"what": "print"}})
        }))
        .collect();
    let (s, e) = call("POST", &format!("{b}/v1/tasks"), Some(json!(others))).await;
    assert_eq!(s, 201, "{e}");

    // they run and are done: alice's quota is free again
    let (s, _) = call("POST", &format!("{plugin}/resume"), None).await;
    assert_eq!(s, 200);
    eventually(T, "alice's tasks done", || async {
        owner_counts(&a, "alice", "test-flood")
            .await
            .is_none()
            .then_some(())
    })
    .await;

    // a run that forks 50 of alice's follow-ups each: on both runners, alice never holds more
    // than 100, and the runs whose follow-ups would pass it fail their attempt, naming it
    let (s, e) = call(
        "POST",
        &format!("{a}/v1/tasks"),
        Some(
            json!({"plugin": "test-flood", "id": "fork-0", "owner": "alice",
                    "payload": {"what": "fork"}}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{e}");
    let refused = eventually(T, "a fork refused by alice's quota", || async {
        for state in ["scheduled", "dead"] {
            let url = format!("{a}/v1/tasks?owner=alice&state={state}&limit=500");
            let (_, page) = call("GET", &url, None).await;
            let found = page["tasks"].as_array()?.iter().find(|t| {
                let e = t["last_error"].as_str().unwrap_or_default();
                e.starts_with("owner_quota_exceeded")
            });
            if let Some(t) = found {
                return Some(t.clone());
            }
        }
        None
    })
    .await;
    let err = refused["last_error"].as_str().unwrap();
    assert!(
        err.contains("owner \"alice\"") && err.contains("max_pending_per_owner is 100"),
        "{refused}"
    );
    // bob still schedules while alice is full
    let (s, e) = call(
        "POST",
        &format!("{b}/v1/tasks"),
        Some(
            json!({"plugin": "test-flood", "id": "bob-late", "owner": "bob",
                    "payload": {"what": "print"}}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{e}");
    // paused, once the runs in flight end: the count the quota reads is the tasks alice holds,
    // at most 100
    let (s, _) = call("POST", &format!("{plugin}/pause"), None).await;
    assert_eq!(s, 200);
    let alice = eventually(T, "alice's runs ended", || async {
        let c = owner_counts(&a, "alice", "test-flood").await?;
        (n(&c, "running") == 0).then_some(c)
    })
    .await;
    let held = n(&alice, "scheduled") + n(&alice, "dead");
    assert_eq!(n(&alice, "pending"), held, "{alice}");
    assert!(held <= max && held >= 50, "{alice}");
    drop((first, second));
}

#[tokio::test]
async fn an_owners_count_follows_a_task_through_every_way_it_comes_and_goes() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let base = r.url.as_str();
    let plugin = format!("{base}/v1/plugins/noop");
    let (s, _) = call("PATCH", &plugin, Some(json!({"max_pending_per_owner": 3}))).await;
    assert_eq!(s, 200);
    let (s, _) = call("POST", &format!("{plugin}/pause"), None).await;
    assert_eq!(s, 200);
    let task = |id: &str, owner: &str| json!({"plugin": "noop", "id": id, "owner": owner});
    let post =
        |body: Value| async move { call("POST", &format!("{base}/v1/tasks"), Some(body)).await };
    let pending = |owner: &'static str| async move {
        owner_counts(base, owner, "noop")
            .await
            .map_or(0, |c| n(&c, "pending"))
    };
    let (s, e) = post(json!([
        task("a1", "alice"),
        task("a2", "alice"),
        task("a3", "alice")
    ]))
    .await;
    assert_eq!(s, 201, "{e}");
    assert_eq!(pending("alice").await, 3);
    let (s, e) = post(task("a4", "alice")).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (429, Some("owner_quota_exceeded")),
        "{e}"
    );
    // a1 scheduled again for bob: it leaves alice's count for bob's
    let (s, e) = post(task("a1", "bob")).await;
    assert_eq!(s, 201, "{e}");
    assert_eq!((pending("alice").await, pending("bob").await), (2, 1));
    // cancelled: it leaves the count
    let (s, _) = call("DELETE", &format!("{base}/v1/tasks/a2"), None).await;
    assert_eq!(s, 204);
    assert_eq!(pending("alice").await, 1);
    // one debounce key twice is one task
    let debounced = json!({"plugin": "noop", "owner": "alice",
                           "debounce": {"key": "d1", "quiet_ms": 100, "max_wait_ms": 1000}});
    for _ in 0..2 {
        let (s, e) = post(debounced.clone()).await;
        assert_eq!(s, 201, "{e}");
    }
    assert_eq!(pending("alice").await, 2);
    // run and done: alice holds none, and takes 3 again (not 4)
    let (s, _) = call("POST", &format!("{plugin}/resume"), None).await;
    assert_eq!(s, 200);
    eventually(T, "alice's and bob's tasks done", || async {
        let gone = owner_counts(base, "alice", "noop").await.is_none()
            && owner_counts(base, "bob", "noop").await.is_none();
        gone.then_some(())
    })
    .await;
    let (s, _) = call("POST", &format!("{plugin}/pause"), None).await;
    assert_eq!(s, 200);
    let (s, e) = post(json!([
        task("b1", "alice"),
        task("b2", "alice"),
        task("b3", "alice")
    ]))
    .await;
    assert_eq!(s, 201, "{e}");
    let (s, e) = post(task("b4", "alice")).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (429, Some("owner_quota_exceeded")),
        "{e}"
    );
    assert_eq!(pending("alice").await, 3);
    // null lifts it
    let (s, p) = call(
        "PATCH",
        &plugin,
        Some(json!({"max_pending_per_owner": null})),
    )
    .await;
    assert_eq!((s, &p["max_pending_per_owner"]), (200, &Value::Null), "{p}");
    let (s, e) = post(task("b4", "alice")).await;
    assert_eq!(s, 201, "{e}");
}
