//! Tasks that listen for events can't stall or fill what every team shares, tried against a real
//! runner and a real redis-server: thousands listening for one topic and key join, leave and are
//! handed an event in calls of bounded size; cancelling listening tasks by owner goes in calls
//! bounded by their listeners; every cancel path lets a task's listeners and payloads go.

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, req};
use eggtimer_tests::events::{
    listening, outboxes_empty, recorder_runner as runner, recorder_runner_with,
};
use eggtimer_tests::redis_log::{calls_of, keys, listener_entries, log_every_call, logged};
use eggtimer_tests::{RedisServer, eventually};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// 3,000 tasks listening for one topic and key each join and leave in one command (the key's
/// listeners are a hash of their own once past eight; 0.2.0 copied the key's whole list at each
/// join and leave), and an event for all of them is handed over in calls of at most 500 (0.2.0
/// wrote a delivery for every one of them in one call): each task cancelled, nothing left. A
/// list of listeners as 0.2.0 kept it in the field is still read, and moved once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_for_thousands_of_listeners_goes_in_calls_of_500() {
    let redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.as_str();
    let url = format!("{base}/v1/tasks");
    for from in (0..3_000).step_by(500) {
        let specs: Value = (from..from + 500)
            .map(|i| listening(&format!("l-{i}"), "orders", "big", "cancel"))
            .collect();
        let (s, t) = req("POST", &url, Some(ADMIN), Some(specs)).await;
        assert_eq!(s, 201, "{t}");
    }
    assert_eq!(listener_entries(&redis), 3_000);
    let (s, t) = req("DELETE", &format!("{url}/l-7"), Some(ADMIN), None).await;
    assert_eq!(s, 204, "{t}");
    eventually(T, "l-7's listener let go", || async {
        (listener_entries(&redis) == 2_999).then_some(())
    })
    .await;

    // 20 more on another key, then their list rewritten as 0.2.0 kept it: in the field
    let specs: Value = (0..20)
        .map(|i| listening(&format!("m-{i}"), "orders", "old", "cancel"))
        .collect();
    let (s, t) = req("POST", &url, Some(ADMIN), Some(specs)).await;
    assert_eq!(s, 201, "{t}");
    let mut conn = redis.conn();
    let own = keys(&redis, "{eggtimer:*}:listeners:orders\x1fold");
    assert_eq!(own.len(), 1, "20 listeners are a hash of their own");
    let field_of = |hash: &str| hash.rsplit_once(':').unwrap().0.to_owned();
    let listeners_key = field_of(&own[0]);
    let held: Vec<(String, String)> = redis::cmd("HGETALL").arg(&own[0]).query(&mut conn).unwrap();
    let list: Vec<String> = held
        .iter()
        .map(|(ts, th)| format!("{th}\x1e{ts}"))
        .collect();
    let () = redis::cmd("DEL").arg(&own[0]).query(&mut conn).unwrap();
    let () = redis::cmd("HSET")
        .arg(&listeners_key)
        .arg("orders\x1fold")
        .arg(list.join("\x1d"))
        .query(&mut conn)
        .unwrap();
    let (s, t) = req("DELETE", &format!("{url}/m-3"), Some(ADMIN), None).await;
    assert_eq!(s, 204, "{t}");
    let one = listening("m-new", "orders", "old", "cancel");
    let (s, t) = req("POST", &url, Some(ADMIN), Some(one)).await;
    assert_eq!(s, 201, "{t}");
    eventually(T, "m-3's listener let go, m-new's joined", || async {
        (listener_entries(&redis) == 2_999 + 20).then_some(())
    })
    .await;

    log_every_call(&mut conn);
    for (key, n) in [("big", 2_999), ("old", 20)] {
        let (s, p) = req(
            "POST",
            &format!("{base}/v1/events/orders"),
            Some(ADMIN),
            Some(json!({"key": key})),
        )
        .await;
        assert_eq!((s, &p["matched"]), (200, &json!(n)), "{p}");
    }
    let calls = logged(&mut conn);
    let named = |f: &str| calls_of(&calls, f);
    // 2,999 listeners: at least six calls of at most 500 (the sweeper may help a drain that
    // took longer than a second); 20: the publish's own
    let drains = named("eggtimer_drain").len();
    assert!(drains >= 6, "{drains} calls of the drain script");
    // a call's arguments: FCALL, its function, the key count, 19 keys, the channel, the shard
    // and one D message per listener
    let most = named("eggtimer_deliver")
        .iter()
        .map(|c| c.args)
        .max()
        .unwrap();
    assert!(most <= 24 + 500, "a deliver call of {most} arguments");
    let (_, stats) = req("GET", &format!("{base}/v1/stats"), Some(ADMIN), None).await;
    assert_eq!(
        stats["scheduled"], 0,
        "every listening task cancelled: {stats}"
    );
    eventually(T, "no listener and no message left", || async {
        (listener_entries(&redis) == 0 && outboxes_empty(&redis)).then_some(())
    })
    .await;
}

/// Cancelling an owner's 1,000 tasks that listen for 8 events each (on a runner of one shard):
/// the cancel goes in calls that stop once their tasks and the listeners they let go reach 500
/// (0.2.0 took 500 tasks a call whatever they held: 59–91 ms with 8 listeners each), and the
/// 8,000 listeners are let go in calls of at most 500 messages; none is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_an_owners_listening_tasks_goes_in_calls_bounded_by_their_listeners() {
    let redis = RedisServer::start();
    let r = recorder_runner_with(&redis, &["--shards", "1"]).await;
    let base = r.url.as_str();
    let url = format!("{base}/v1/tasks");
    for from in (0..1_000).step_by(250) {
        let specs: Value = (from..from + 250)
            .map(|i| {
                let id = format!("o-{i}");
                let mut t = listening(&id, "orders", &id, "cancel");
                t["owner"] = json!("o1");
                t["on"] = (0..8)
                    .map(|j| json!({"topic": format!("t{j}"), "key": id, "then": "cancel"}))
                    .collect();
                t
            })
            .collect();
        let (s, t) = req("POST", &url, Some(ADMIN), Some(specs)).await;
        assert_eq!(s, 201, "{t}");
    }
    assert_eq!(listener_entries(&redis), 8_000);
    let mut conn = redis.conn();
    log_every_call(&mut conn);
    let (s, c) = req(
        "DELETE",
        &format!("{base}/v1/owners/o1/tasks"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!((s, &c["cancelled"]), (200, &json!(1_000)), "{c}");
    eventually(T, "no listener left", || async {
        (listener_entries(&redis) == 0 && outboxes_empty(&redis)).then_some(())
    })
    .await;
    let calls = logged(&mut conn);
    let of = |f: &str| calls_of(&calls, f);
    // each task is 1 and 8 listeners: 55 tasks fill a call's 500, so 19 calls for the 1,000
    let bulk = of("eggtimer_bulk").len();
    assert!(bulk >= 18, "{bulk} calls of the bulk script");
    // an unlisten call's arguments: FCALL, its function, the key count, 19 keys, then its messages
    let unlisten = of("eggtimer_unlisten");
    assert!(unlisten.len() >= 16, "{} unlisten calls", unlisten.len());
    let most = unlisten.iter().map(|c| c.args).max().unwrap();
    assert!(most <= 22 + 500, "an unlisten call of {most} arguments");
}

/// Cancelling listening tasks lets their listeners go on every path (by owner, by plugin, one
/// by one), and a cancelled debounced task leaves no payload list behind (0.2.0 kept 8,000
/// listener entries for 1,000 tasks cancelled by owner, without end).
#[tokio::test]
async fn every_cancel_path_lets_listeners_and_payloads_go() {
    let redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.as_str();
    let url = format!("{base}/v1/tasks");
    let listening_as = |id: String, owner: &str| {
        let mut t = listening(&id, "orders", &id, "cancel");
        t["owner"] = json!(owner);
        t["on"] = (0..8)
            .map(|j| json!({"topic": format!("t{j}"), "key": id, "then": "cancel"}))
            .collect();
        t
    };
    let all_gone =
        || async { (listener_entries(&redis) == 0 && outboxes_empty(&redis)).then_some(()) };

    // by owner
    let specs: Value = (0..100)
        .map(|i| listening_as(format!("o-{i}"), "o1"))
        .collect();
    let (s, t) = req("POST", &url, Some(ADMIN), Some(specs)).await;
    assert_eq!(s, 201, "{t}");
    eventually(T, "the listeners written", || async {
        (listener_entries(&redis) == 800).then_some(())
    })
    .await;
    let (s, c) = req(
        "DELETE",
        &format!("{base}/v1/owners/o1/tasks"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!((s, &c["cancelled"]), (200, &json!(100)), "{c}");
    eventually(T, "no listener left after cancelling by owner", all_gone).await;

    // one by one, a debounced task among them
    let (s, t) = req(
        "POST",
        &url,
        Some(ADMIN),
        Some(listening_as("one".into(), "o2")),
    )
    .await;
    assert_eq!(s, 201, "{t}");
    let d = json!({"plugin": "bench-record", "payload": 1,
                   "debounce": {"key": "deb", "quiet_ms": 3_600_000, "max_wait_ms": 3_600_000}});
    for _ in 0..3 {
        let (s, t) = req("POST", &url, Some(ADMIN), Some(d.clone())).await;
        assert_eq!(s, 201, "{t}");
    }
    assert_eq!(keys(&redis, "{eggtimer:*}:tasks:w:*").len(), 1);
    for id in ["one", "deb"] {
        let (s, t) = req("DELETE", &format!("{url}/{id}"), Some(ADMIN), None).await;
        assert_eq!(s, 204, "{t}");
    }
    eventually(T, "no listener left after cancelling one by one", all_gone).await;
    assert_eq!(keys(&redis, "{eggtimer:*}:tasks:w:*"), Vec::<String>::new());

    // by plugin (deleting it with its tasks)
    let specs: Value = (0..50)
        .map(|i| listening_as(format!("p-{i}"), "o3"))
        .collect();
    let (s, t) = req("POST", &url, Some(ADMIN), Some(specs)).await;
    assert_eq!(s, 201, "{t}");
    for _ in 0..2 {
        let (s, t) = req("POST", &url, Some(ADMIN), Some(d.clone())).await;
        assert_eq!(s, 201, "{t}");
    }
    let (s, t) = req(
        "DELETE",
        &format!("{base}/v1/plugins/bench-record?tasks=cancel"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, 204, "{t}");
    eventually(T, "no listener left after deleting the plugin", all_gone).await;
    assert_eq!(keys(&redis, "{eggtimer:*}:tasks:w:*"), Vec::<String>::new());
    assert_eq!(keys(&redis, "{eggtimer:*}:tasks:n:*"), Vec::<String>::new());
}
