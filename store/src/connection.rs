//! Where Redis is and the connection to it: one self-reconnecting multiplexed connection, one
//! that follows the master its Sentinels name, or a Redis Cluster client.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Arg, Cmd, Pipeline, RedisConnectionInfo, RedisFuture, Value};

/// Where Redis is: one server, the master a set of Sentinels names, or the seed nodes of a
/// Redis Cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum RedisTarget {
    Single(String),
    Sentinel {
        /// The Sentinels, `redis://host:port`.
        sentinels: Vec<String>,
        /// The master's name in the Sentinels' configuration.
        master: String,
        /// The password of the master (and its replicas), if any.
        password: Option<String>,
    },
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// Parses `redis://host:port`, `redis+sentinel://[:password@]host:port[,host:port...]/<master>`
    /// or `redis+cluster://host:port,host:port`.
    pub fn parse(url: &str) -> Result<RedisTarget> {
        if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            let (nodes, master) = rest.rsplit_once('/').unwrap_or((rest, ""));
            let (password, nodes) = match nodes.rsplit_once('@') {
                Some((auth, nodes)) => {
                    let pw = auth.rsplit_once(':').map_or(auth, |(_, p)| p);
                    (Some(pw.to_owned()).filter(|p| !p.is_empty()), nodes)
                }
                None => (None, nodes),
            };
            let sentinels: Vec<String> = nodes
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if sentinels.is_empty() || master.is_empty() {
                bail!(
                    "{}: a Sentinel URL is redis+sentinel://host:port[,host:port...]/<master name>",
                    redact(url)
                );
            }
            Ok(RedisTarget::Sentinel {
                sentinels,
                master: master.to_owned(),
                password,
            })
        } else if let Some(rest) = url.strip_prefix("redis+cluster://") {
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
                "{}: expected redis://host:port, redis+sentinel://host:port,host:port/<master> or \
                 redis+cluster://host:port,host:port",
                redact(url)
            )
        }
    }

    /// A client of every node the target names now (a cluster's seed nodes; the master the
    /// Sentinels name), with its address for messages.
    pub(super) async fn node_clients(&self) -> Result<Vec<(String, redis::Client)>> {
        match self {
            RedisTarget::Sentinel { .. } => {
                let c = self.sentinel_client()?.async_get_client().await?;
                Ok(vec![(c.get_connection_info().addr().to_string(), c)])
            }
            RedisTarget::Single(u) => Ok(vec![(redact(u), redis::Client::open(u.as_str())?)]),
            RedisTarget::Cluster(nodes) => nodes
                .iter()
                .map(|u| Ok((redact(u), redis::Client::open(u.as_str())?)))
                .collect(),
        }
    }

    /// A client of one node for pub/sub (a cluster broadcasts PUBLISH to every node; Sentinel:
    /// the master now); `attempt` rotates through a cluster's nodes, so a subscriber whose node
    /// died moves to another.
    pub(super) async fn pubsub_client(&self, attempt: usize) -> Result<redis::Client> {
        Ok(match self {
            RedisTarget::Single(u) => redis::Client::open(u.as_str())?,
            RedisTarget::Sentinel { .. } => self.sentinel_client()?.async_get_client().await?,
            RedisTarget::Cluster(nodes) => {
                redis::Client::open(nodes[attempt % nodes.len()].as_str())?
            }
        })
    }

    fn sentinel_client(&self) -> Result<SentinelClient> {
        let RedisTarget::Sentinel {
            sentinels,
            master,
            password,
        } = self
        else {
            bail!("not a Sentinel target");
        };
        let mut redis = RedisConnectionInfo::default();
        if let Some(pw) = password {
            redis = redis.set_password(pw);
        }
        let info = SentinelNodeConnectionInfo::default().set_redis_connection_info(redis);
        SentinelClient::build(
            sentinels.iter().map(String::as_str).collect(),
            master.clone(),
            Some(info),
            SentinelServerType::Master,
        )
        .context("bad Sentinel addresses")
    }
}

/// A Redis connection: one multiplexed, self-reconnecting connection, one that follows the
/// Sentinels' master, or a cluster client.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Sentinel(Arc<Following>),
    Cluster(ClusterConnection),
}

/// A connection to the master the Sentinels name: when a call fails as a failover makes calls
/// fail (the old master gone, or demoted: `READONLY`), it asks the Sentinels again and moves to
/// the new master. The failed call fails; its caller tries again, as for any outage.
pub(crate) struct Following {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    /// The master's address and the connection to it.
    current: RwLock<(String, ConnectionManager)>,
    /// When the Sentinels were last asked (at most every 100 ms).
    asked: std::sync::Mutex<Instant>,
}

impl Following {
    async fn connect(mut sentinels: SentinelClient) -> Result<Following> {
        let client = sentinels
            .async_get_client()
            .await
            .context("asking the Sentinels for the master")?;
        let addr = client.get_connection_info().addr().to_string();
        let conn = ConnectionManager::new_with_config(client, manager_config())
            .await
            .with_context(|| format!("connecting to the master at {addr}"))?;
        Ok(Following {
            sentinels: tokio::sync::Mutex::new(sentinels),
            current: RwLock::new((addr, conn)),
            asked: std::sync::Mutex::new(Instant::now()),
        })
    }

    fn conn(&self) -> ConnectionManager {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// Asks the Sentinels which node is the master, and moves there if it moved.
    async fn follow(&self) {
        {
            let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
            if asked.elapsed() < Duration::from_millis(100) {
                return;
            }
            *asked = Instant::now();
        }
        let mut sentinels = self.sentinels.lock().await;
        let client = match sentinels.async_get_client().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("asking the Sentinels for the master failed: {e}");
                return;
            }
        };
        let addr = client.get_connection_info().addr().to_string();
        let was = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone();
        if addr == was {
            return;
        }
        match ConnectionManager::new_with_config(client, manager_config()).await {
            Ok(conn) => {
                tracing::warn!("the Sentinels name a new master: {addr} (was {was}); following it");
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = (addr, conn);
            }
            Err(e) => tracing::warn!("connecting to the new master at {addr} failed: {e}"),
        }
    }
}

/// Whether a failed call may mean the master moved.
fn master_may_have_moved(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::ReadOnly | redis::ServerErrorKind::MasterDown
            )
        )
}

fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

/// One of our scripts: its name (for `eggtimer_redis_seconds`), its function, the function
/// library that defines it, and its text.
pub(super) struct ScriptText {
    pub name: &'static str,
    pub function: String,
    pub library: String,
    pub text: String,
}

/// The scripts by their SHA1 (filled once by `Scripts::load`).
pub(super) static SCRIPTS: OnceLock<HashMap<String, ScriptText>> = OnceLock::new();

/// The script an `EVALSHA` runs, if it is one of ours.
fn script_of(cmd: &Cmd) -> Option<&'static ScriptText> {
    let mut args = cmd.args_iter();
    match (args.next(), args.next()) {
        (Some(Arg::Simple(verb)), Some(Arg::Simple(sha)))
            if verb.eq_ignore_ascii_case(b"EVALSHA") =>
        {
            SCRIPTS.get()?.get(std::str::from_utf8(sha).ok()?)
        }
        _ => None,
    }
}

/// What a command is, for `eggtimer_redis_seconds`: the script's name, or `command`.
fn command_label(cmd: &Cmd) -> &'static str {
    if let Some(s) = script_of(cmd) {
        return s.name;
    }
    match cmd.args_iter().next() {
        Some(Arg::Simple(verb)) if verb.eq_ignore_ascii_case(b"EVALSHA") => "script",
        _ => "command",
    }
}

/// `call` (`FCALL <function>` or `EVAL <text>`) with the keys and arguments of an `EVALSHA`.
fn with_args_of(mut call: Cmd, evalsha: &Cmd) -> Option<Cmd> {
    for a in evalsha.args_iter().skip(2) {
        match a {
            Arg::Simple(v) => call.arg(v),
            _ => return None,
        };
    }
    Some(call)
}

/// The `FCALL` of the function of a script of ours, with the `EVALSHA`'s keys and arguments.
fn fcall_of(script: &ScriptText, evalsha: &Cmd) -> Option<Cmd> {
    let mut fcall = redis::cmd("FCALL");
    fcall.arg(script.function.as_str());
    with_args_of(fcall, evalsha)
}

/// The `EVAL` of a script of ours, with the `EVALSHA`'s keys and arguments: where its library
/// can't be loaded (`FUNCTION LOAD` is refused while Redis is out of memory; a script that may
/// run then must still run).
fn eval_of(script: &ScriptText, evalsha: &Cmd) -> Option<Cmd> {
    let mut eval = redis::cmd("EVAL");
    eval.arg(script.text.as_str());
    with_args_of(eval, evalsha)
}

/// The first key of an `EVALSHA` (`EVALSHA sha numkeys key...`), if it has one.
fn first_key(evalsha: &Cmd) -> Option<&[u8]> {
    match evalsha.args_iter().nth(3) {
        Some(Arg::Simple(k)) if !matches!(evalsha.args_iter().nth(2), Some(Arg::Simple(b"0"))) => {
            Some(k)
        }
        _ => None,
    }
}

/// Whether Redis answered that a function does not exist (never loaded, or lost with a Redis
/// that keeps nothing on disk, or flushed).
fn is_missing_function(error: &str) -> bool {
    error.contains("Function not found")
}

/// Times a round trip into `eggtimer_redis_seconds` (a no-op until a recorder is installed).
async fn timed<T>(label: &'static str, call: RedisFuture<'_, T>) -> redis::RedisResult<T> {
    let t0 = Instant::now();
    let r = call.await;
    metrics::histogram!("eggtimer_redis_seconds", "script" => label)
        .record(t0.elapsed().as_secs_f64());
    r
}

impl Conn {
    fn send<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Sentinel(f) => {
                let f = Arc::clone(f);
                Box::pin(async move {
                    let r = f.conn().req_packed_command(cmd).await;
                    if let Err(e) = &r
                        && master_may_have_moved(e)
                    {
                        f.follow().await;
                    }
                    r
                })
            }
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    /// Loads a script's library into the node its call went to (on a cluster, the master of its
    /// first key's slot: not every master, so one that stalls or has just been promoted holds up
    /// no other's calls). Another caller may have loaded it first: that is success too.
    async fn load_library(&mut self, script: &ScriptText, evalsha: &Cmd) -> redis::RedisResult<()> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg(script.library.as_str());
        let r = match (&mut *self, first_key(evalsha)) {
            (Conn::Cluster(c), Some(key)) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                c.route_command(load, to).await
            }
            _ => self.send(&load).await,
        };
        let loaded_before = |e: &str| e.contains("already exists");
        match r {
            Ok(Value::ServerError(e)) if !loaded_before(&e.to_string()) => Err(e.into()),
            Err(e) if !loaded_before(&e.to_string()) => Err(e),
            _ => Ok(()),
        }
    }

    /// Runs a script of ours as its function (`FCALL`); where Redis lacks the function, loads its
    /// library and calls again, or runs its text (`EVAL`) where the library can't be loaded.
    async fn call_script(
        &mut self,
        label: &'static str,
        script: &'static ScriptText,
        evalsha: &Cmd,
    ) -> redis::RedisResult<Value> {
        let Some(fcall) = fcall_of(script, evalsha) else {
            return timed(label, self.send(evalsha)).await;
        };
        let r = timed(label, self.send(&fcall)).await;
        // (redis-rs hands server errors back as values; the caller's conversion makes them
        // errors)
        let missing = match &r {
            Ok(Value::ServerError(e)) => is_missing_function(&e.to_string()),
            Err(e) => is_missing_function(&e.to_string()),
            Ok(_) => false,
        };
        if !missing {
            return r;
        }
        match self.load_library(script, evalsha).await {
            Ok(()) => timed(label, self.send(&fcall)).await,
            Err(load) => {
                tracing::debug!("loading the {label} script's library failed: {load}");
                match eval_of(script, evalsha) {
                    Some(eval) => timed(label, self.send(&eval)).await,
                    None => r,
                }
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match script_of(cmd) {
                Some(script) => self.call_script(script.name, script, cmd).await,
                None => timed(command_label(cmd), self.send(cmd)).await,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let call = match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(f) => {
                let f = Arc::clone(f);
                Box::pin(async move {
                    let r = f.conn().req_packed_commands(pipeline, offset, count).await;
                    if let Err(e) = &r
                        && master_may_have_moved(e)
                    {
                        f.follow().await;
                    }
                    r
                })
            }
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        };
        Box::pin(timed("pipeline", call))
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Sentinel(f) => f.conn().get_db(),
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
            let conn = ConnectionManager::new_with_config(client, manager_config())
                .await
                .with_context(|| format!("connecting to Redis at {}", redact(url)))?;
            Ok(Conn::Single(conn))
        }
        RedisTarget::Sentinel { .. } => Ok(Conn::Sentinel(Arc::new(
            Following::connect(target.sentinel_client()?).await?,
        ))),
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
                                | redis::ServerErrorKind::ReadOnly
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
pub(super) async fn maxmemory_policy(client: &redis::Client) -> Result<String> {
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
