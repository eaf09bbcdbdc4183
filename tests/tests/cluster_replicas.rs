//! `--min-replicas-acked` on a local Redis Cluster (3 masters, a replica each, started by the
//! test): writes wait for every master's replica, and a replica frozen before a failover loses no
//! acknowledged task.

use std::time::Duration;

use eggtimer::store::StoreOptions;
use eggtimer::{RedisTarget, Store};
use eggtimer_tests::{RedisCluster, RunnerProcess, call, events_key, eventually, plugins_dir};
use serde_json::json;

const T: Duration = Duration::from_secs(30);

/// On Redis Cluster, `--min-replicas-acked 1` waits on every master for its replica (the client
/// sends `WAIT` to each master, on the connection that carried the writes, and answers the
/// fewest): with one replica frozen a write is 503 `not_replicated`; what was acknowledged is on
/// the replica of its shard's master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_min_replicas_acked_waits_for_the_replicas() {
    let cluster = RedisCluster::start(3, 1);
    let dir = plugins_dir();
    let r = RunnerProcess::start(
        &cluster.url(),
        &[
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--min-replicas-acked",
            "1",
            "--replica-ack-timeout",
            "1s",
        ],
    );
    let tasks = format!("{}/v1/tasks", r.url);
    let spec = |id: &str| json!({"plugin": "noop", "id": id, "delay_ms": 3_600_000});
    let (s, b) = call("POST", &tasks, Some(spec("a"))).await;
    assert_eq!(s, 201, "{b}");
    // one master's replica hears nothing: every write is refused, whichever shard it goes to
    let frozen = &cluster.nodes[replica_of(&cluster, cluster.master_of("{eggtimer:0}:due"))];
    frozen.freeze(true);
    let (s, b) = call("POST", &tasks, Some(spec("b"))).await;
    frozen.freeze(false);
    eggtimer_tests::assert_not_replicated(s, &b);
    // once it is back, the same request is acknowledged
    eventually(T, "the write acknowledged again", || async {
        (call("POST", &tasks, Some(spec("b"))).await.0 == 201).then_some(())
    })
    .await;
    for id in ["a", "b"] {
        let shard = eggtimer::store::shard_of(id, 16);
        let replica = replica_of(
            &cluster,
            cluster.master_of(&format!("{{eggtimer:{shard}}}:due")),
        );
        let mut c = cluster.nodes[replica].conn();
        let () = redis::cmd("READONLY").query(&mut c).unwrap();
        let there: bool = redis::cmd("HEXISTS")
            .arg(format!("{{eggtimer:{shard}}}:tasks"))
            .arg(eggtimer::store::task_key("noop", id))
            .query(&mut c)
            .unwrap();
        assert!(there, "{id} is not on the replica of its shard's master");
    }
}

/// One master's replica frozen, then that master killed -9, on a 3-master cluster with a replica
/// each: the replica is stopped (SIGSTOP: it confirms nothing) once a client scheduling reminders
/// over HTTP has 100 acknowledged, the master dies a second later, the replica wakes and the
/// cluster fails over to it. Returns (acknowledged, lost): the reminders answered 201, and those
/// of them that never ran once everything left has run. (A frozen replica's kernel still takes in
/// what the master sends, so nothing is lost here without the flag either; `durability.rs` cuts a
/// replica's link with a proxy, which a cluster replica can't be put behind without its clients.)
async fn frozen_replica_then_failover_on_a_cluster(extra: &[&str]) -> (usize, usize) {
    let mut cluster = RedisCluster::start(3, 1);
    let dir = plugins_dir();
    let mut args = vec!["--plugins-dir", dir.to_str().unwrap(), "--lease", "2s"];
    args.extend_from_slice(extra);
    let r = RunnerProcess::start(&cluster.url(), &args);
    // the victim holds shards but not the namespace's slot (the events the count reads)
    let ns_master = cluster.master_of("{eggtimer}:runners");
    let victim = (0..cluster.nodes.len())
        .find(|&m| m != ns_master && role(&cluster, m) == "master")
        .unwrap();
    let replica = replica_of(&cluster, victim);
    let client = eggtimer_tests::schedule_reminders(&r.url, 60);
    client.wait_acknowledged(100).await;
    cluster.nodes[replica].freeze(true);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    cluster.nodes[victim].kill();
    cluster.nodes[replica].freeze(false);
    cluster.nodes[victim].port = 0; // gone for good
    cluster.wait_ok(Duration::from_secs(30));
    let acknowledged = client.acknowledged().await;
    let store = Store::open(
        RedisTarget::parse(&cluster.url()).unwrap(),
        StoreOptions::default(),
    )
    .await
    .unwrap();
    eggtimer_tests::wait_drained(&store, T).await;
    let ran: std::collections::HashSet<String> = cluster
        .stream_task_ids(&events_key("coupon-expiry", "push"))
        .into_iter()
        .collect();
    let lost = acknowledged.iter().filter(|id| !ran.contains(*id)).count();
    (acknowledged.len(), lost)
}

/// A node's role (`master` or `slave`).
fn role(cluster: &RedisCluster, node: usize) -> String {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut cluster.nodes[node].conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("role:"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The index of the replica of a master.
fn replica_of(cluster: &RedisCluster, master: usize) -> usize {
    let id: String = redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut cluster.nodes[master].conn())
        .unwrap();
    (0..cluster.nodes.len())
        .find(|&n| {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut cluster.nodes[n].conn())
                .unwrap();
            role(cluster, n) == "slave"
                && nodes
                    .lines()
                    .any(|l| l.contains("myself") && l.contains(&id))
        })
        .unwrap()
}

/// With `--min-replicas-acked 1`, writes made while a replica confirms nothing are refused (503),
/// and the failover that follows loses no acknowledged task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_with_min_replicas_acked_a_frozen_replica_and_failover_lose_nothing_acknowledged()
 {
    let (acknowledged, lost) = frozen_replica_then_failover_on_a_cluster(&[
        "--min-replicas-acked",
        "1",
        "--replica-ack-timeout",
        "300ms",
    ])
    .await;
    eprintln!("cluster, with --min-replicas-acked 1: {acknowledged} acknowledged, {lost} lost");
    // 60 requests of 10: those before the freeze, and none while the replica is stopped or after
    // the failover (its master then has no replica)
    assert!(
        (100..600).contains(&acknowledged),
        "{acknowledged} acknowledged"
    );
    assert_eq!(
        lost, 0,
        "{lost} of {acknowledged} acknowledged reminders never ran"
    );
}
