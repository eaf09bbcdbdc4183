//! Where Redis is and the connection to it: one self-reconnecting multiplexed connection, or a
//! Redis Cluster client.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Arg, Cmd, Pipeline, RedisFuture, Value};

/// Where Redis is: one server, or the seed nodes of a Redis Cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum RedisTarget {
    Single(String),
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// Parses `redis://host:port` or `redis+cluster://host:port,host:port`.
    pub fn parse(url: &str) -> Result<RedisTarget> {
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = rest
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if nodes.is_empty() {
                bail!(
                    "{}: a cluster URL needs at least one host:port",
                    redact(url)
                );
            }
            Ok(RedisTarget::Cluster(nodes))
        } else if url.starts_with("redis://")
            || url.starts_with("rediss://")
            || url.starts_with("unix://")
        {
            Ok(RedisTarget::Single(url.to_owned()))
        } else {
            bail!(
                "{}: expected redis://host:port or redis+cluster://host:port,host:port",
                redact(url)
            )
        }
    }

    /// The URL of every node the target names (a cluster's seed nodes).
    pub fn node_urls(&self) -> &[String] {
        match self {
            RedisTarget::Single(u) => std::slice::from_ref(u),
            RedisTarget::Cluster(nodes) => nodes,
        }
    }

    /// A URL of one node for pub/sub (a cluster broadcasts PUBLISH to every node); `attempt`
    /// rotates through a cluster's nodes, so a subscriber whose node died moves to another.
    pub fn pubsub_url(&self, attempt: usize) -> &str {
        match self {
            RedisTarget::Single(u) => u,
            RedisTarget::Cluster(nodes) => &nodes[attempt % nodes.len()],
        }
    }
}

/// A Redis connection: one multiplexed, self-reconnecting connection, or a cluster client.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Names of the scripts by their SHA1 (filled once by `Scripts::load`), for the round-trip metric.
pub(super) static SCRIPT_NAMES: OnceLock<HashMap<String, &'static str>> = OnceLock::new();

/// What a command is, for `eggtimer_redis_seconds`: the script's name, or `command`.
fn command_label(cmd: &Cmd) -> &'static str {
    let mut args = cmd.args_iter();
    match (args.next(), args.next()) {
        (Some(Arg::Simple(verb)), Some(Arg::Simple(sha)))
            if verb.eq_ignore_ascii_case(b"EVALSHA") =>
        {
            std::str::from_utf8(sha)
                .ok()
                .and_then(|sha| SCRIPT_NAMES.get()?.get(sha).copied())
                .unwrap_or("script")
        }
        _ => "command",
    }
}

/// Times a round trip into `eggtimer_redis_seconds` (a no-op until a recorder is installed).
async fn timed<T>(label: &'static str, call: RedisFuture<'_, T>) -> redis::RedisResult<T> {
    let t0 = Instant::now();
    let r = call.await;
    metrics::histogram!("eggtimer_redis_seconds", "script" => label)
        .record(t0.elapsed().as_secs_f64());
    r
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let call = match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        };
        Box::pin(timed(command_label(cmd), call))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let call = match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        };
        Box::pin(timed("pipeline", call))
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Connects to Redis with timeouts, so that a Redis that is away fails calls quickly.
pub(super) async fn connect(target: &RedisTarget) -> Result<Conn> {
    match target {
        RedisTarget::Single(url) => {
            let client = redis::Client::open(url.as_str())
                .with_context(|| format!("bad Redis URL {}", redact(url)))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(Duration::from_secs(5)))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_millis(500));
            let conn = ConnectionManager::new_with_config(client, config)
                .await
                .with_context(|| format!("connecting to Redis at {}", redact(url)))?;
            Ok(Conn::Single(conn))
        }
        RedisTarget::Cluster(nodes) => {
            let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                .connection_timeout(Duration::from_secs(2))
                .response_timeout(Duration::from_secs(5))
                .build()
                .context("bad Redis Cluster node list")?;
            let conn = client.get_async_connection().await.with_context(|| {
                format!(
                    "connecting to Redis Cluster at {}",
                    redact(&nodes.join(","))
                )
            })?;
            Ok(Conn::Cluster(conn))
        }
    }
}

/// Whether a store failure means Redis could not be reached (as opposed to Redis answering
/// something this runner did not expect, or a script failing).
pub fn is_unreachable(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<redis::RedisError>())
        .any(|r| {
            r.is_io_error()
                || r.is_connection_dropped()
                || r.is_connection_refusal()
                || r.is_timeout()
                || r.is_cluster_error()
                || matches!(
                    r.kind(),
                    redis::ErrorKind::ClusterConnectionNotFound
                        | redis::ErrorKind::Server(
                            redis::ServerErrorKind::BusyLoading
                                | redis::ServerErrorKind::TryAgain
                                | redis::ServerErrorKind::ClusterDown
                                | redis::ServerErrorKind::MasterDown
                        )
                )
        })
}

/// Whether a store failure is Redis refusing a write because it is out of memory (`maxmemory`
/// reached under `noeviction`): nothing was written, and the same call succeeds once memory is
/// freed.
pub fn is_full(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<redis::RedisError>())
        .any(|r| r.code() == Some("OOM"))
}

/// A node's `maxmemory-policy` (`CONFIG GET`), on a connection of its own.
pub(super) async fn maxmemory_policy(url: &str) -> Result<String> {
    let client = redis::Client::open(url)?;
    let mut c = tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .context("connecting timed out")??;
    let reply: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(&mut c)
        .await?;
    reply
        .get(1)
        .cloned()
        .context("CONFIG GET maxmemory-policy answered no value")
}

/// A Redis URL (or list) without its passwords, for logs and messages.
pub fn redact(url: &str) -> String {
    url.split(',')
        .map(|u| match (u.find("://"), u.rfind('@')) {
            (Some(a), Some(b)) if b > a => format!("{}***{}", &u[..a + 3], &u[b..]),
            _ => u.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}
