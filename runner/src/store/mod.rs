//! The store: the only code that talks to Redis.
//!
//! It owns the data model of DESIGN.md (sharded `due` / `tasks` / `inflight` / `dead` / owner
//! index, done records, the namespace meta) and every state change of a task, each one Lua script
//! on one shard with all of its keys passed in KEYS (see `lua/`).
//!
//! Architecture invariant: no other module builds a key name or sends a Redis command.

mod keys;
mod plugins;
mod record;
mod scripts;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::future::try_join_all;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

pub use keys::Keys;
pub use plugins::{PluginEntry, Rollback};
pub use record::{TaskRecord, TaskState, field_safe};
use scripts::Scripts;

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
                bail!("{url}: a cluster URL needs at least one host:port");
            }
            Ok(RedisTarget::Cluster(nodes))
        } else if url.starts_with("redis://")
            || url.starts_with("rediss://")
            || url.starts_with("unix://")
        {
            Ok(RedisTarget::Single(url.to_owned()))
        } else {
            bail!("{url}: expected redis://host:port or redis+cluster://host:port,host:port")
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
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// A task to schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct NewTask {
    pub id: String,
    pub plugin: String,
    /// Raw JSON text.
    pub payload: String,
    pub run_at: i64,
    pub owner: Option<String>,
    pub max_attempts: u32,
}

/// How `schedule` treats an id that exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleMode {
    /// Replace a task that has not started (the API's idempotent upsert).
    Upsert,
    /// Create only; an existing task of that id in any state is left alone (follow-up tasks).
    IfAbsent,
}

/// What `schedule` did with one task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheduled {
    Ok,
    /// The id is running: nothing changed.
    Running,
    /// IfAbsent and the id exists: nothing changed.
    Exists,
}

/// A task claimed by this runner: it holds the lease for `attempt`.
#[derive(Clone, Debug, PartialEq)]
pub struct Claimed {
    pub id: String,
    pub shard: u32,
    pub attempt: u32,
    pub due: i64,
    pub max_attempts: u32,
    pub plugin: String,
    pub owner: Option<String>,
    pub payload: String,
    /// When the task was (last) scheduled: with id, due and attempt it names this run.
    pub created: i64,
}

/// The result of one claim.
#[derive(Debug)]
pub struct ClaimBatch {
    /// Redis time of the claim (ms).
    pub now: i64,
    /// The shard's earliest due time after the claim, if any.
    pub next_due: Option<i64>,
    /// The earliest lease expiry of the shard's in-flight tasks, if any.
    pub next_lease_expiry: Option<i64>,
    pub tasks: Vec<Claimed>,
}

/// The outcome to record for a claimed task.
#[derive(Clone, Debug, PartialEq)]
pub enum Finish {
    Done,
    /// Due again after `after_ms`, or dead when it was the last attempt.
    Retry {
        after_ms: i64,
        error: String,
    },
    Dead {
        error: String,
    },
    /// The same task runs again at `at`, attempts reset.
    Again {
        at: i64,
    },
    /// Not started: put back as it was (graceful shutdown).
    Release,
}

/// What `finish` did with one outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    Done,
    Retry,
    Dead,
    Again,
    Release,
    /// The attempt no longer held the lease: refused.
    Stale,
}

/// What to do with a shard lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseOp {
    Acquire,
    Renew,
    Release,
}

/// How to move a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    At(i64),
    Shift(i64),
    Now,
}

/// Why a change to one task was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no task with this id")]
    Missing,
    #[error("the task is running")]
    Running,
    #[error("the task is done")]
    Done,
    #[error("the task is dead; retry it through the dead-letter routes")]
    Dead,
    #[error("the task is not dead")]
    NotDead,
}

/// A write to a plugin's key-value store, applied with the run's effects.
#[derive(Clone, Debug, PartialEq)]
pub enum KvWrite {
    Set {
        key: String,
        value: String,
        ttl_ms: Option<u64>,
    },
    Delete {
        key: String,
    },
}

/// The kv writes and events of one handler run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NsEffects {
    pub kv: Vec<KvWrite>,
    /// (topic, data JSON)
    pub events: Vec<(String, String)>,
}

/// Options of a store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub namespace: String,
    pub shards: u32,
    /// How long done records stay readable (ms).
    pub keep_done_ms: u64,
    /// Cap of each event stream (XADD MAXLEN ~).
    pub stream_maxlen: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            namespace: "eggtimer".into(),
            shards: 16,
            keep_done_ms: 600_000,
            stream_maxlen: 1_000_000,
        }
    }
}

/// The handle to the data model; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    target: RedisTarget,
    keys: Keys,
    opts: StoreOptions,
    scripts: Scripts,
}

/// Connects to Redis with timeouts, so that a Redis that is away fails calls quickly.
async fn connect(target: &RedisTarget) -> Result<Conn> {
    match target {
        RedisTarget::Single(url) => {
            let client = redis::Client::open(url.as_str())
                .with_context(|| format!("bad Redis URL {url}"))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(Duration::from_secs(5)))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_millis(500));
            let conn = ConnectionManager::new_with_config(client, config)
                .await
                .with_context(|| format!("connecting to Redis at {url}"))?;
            Ok(Conn::Single(conn))
        }
        RedisTarget::Cluster(nodes) => {
            let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                .connection_timeout(Duration::from_secs(2))
                .response_timeout(Duration::from_secs(5))
                .build()
                .context("bad Redis Cluster node list")?;
            let conn = client
                .get_async_connection()
                .await
                .with_context(|| format!("connecting to Redis Cluster at {}", nodes.join(",")))?;
            Ok(Conn::Cluster(conn))
        }
    }
}

impl Store {
    /// Connects and checks the namespace's shard count (recording it on first use).
    pub async fn open(target: RedisTarget, opts: StoreOptions) -> Result<Store> {
        if opts.shards == 0 {
            bail!("the shard count must be at least 1");
        }
        let conn = connect(&target).await?;
        let store = Store {
            inner: Arc::new(Inner {
                conn,
                target,
                keys: Keys::new(&opts.namespace),
                opts,
                scripts: Scripts::load(),
            }),
        };
        store.check_shards().await?;
        Ok(store)
    }

    async fn check_shards(&self) -> Result<()> {
        let meta = self.keys().meta();
        let want = self.inner.opts.shards;
        let mut c = self.conn();
        let _: i64 = redis::cmd("HSETNX")
            .arg(&meta)
            .arg("shards")
            .arg(want)
            .query_async(&mut c)
            .await?;
        let have: u32 = redis::cmd("HGET")
            .arg(&meta)
            .arg("shards")
            .query_async(&mut c)
            .await?;
        if have != want {
            bail!(
                "namespace {:?} has {have} shards in Redis, but this runner was started with --shards {want}; \
                 start it with --shards {have} (changing the count needs an explicit reshard)",
                self.inner.opts.namespace
            );
        }
        Ok(())
    }

    pub fn conn(&self) -> Conn {
        self.inner.conn.clone()
    }

    pub fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    pub fn target(&self) -> &RedisTarget {
        &self.inner.target
    }

    pub fn shards(&self) -> u32 {
        self.inner.opts.shards
    }

    pub fn options(&self) -> &StoreOptions {
        &self.inner.opts
    }

    /// The shard of a task id: FNV-1a of the id, mod the shard count.
    pub fn shard_of(&self, id: &str) -> u32 {
        shard_of(id, self.shards())
    }

    fn shard_script<'a>(
        &'a self,
        script: &'a redis::Script,
        shard: u32,
    ) -> redis::ScriptInvocation<'a> {
        let mut inv = script.prepare_invoke();
        for k in self.keys().shard(shard).all() {
            inv.key(k);
        }
        inv
    }

    /// Schedules tasks (any number, any shards): one script per shard, sent concurrently.
    /// The verdicts come back in the order of `tasks`.
    pub async fn schedule(&self, tasks: &[NewTask], mode: ScheduleMode) -> Result<Vec<Scheduled>> {
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); self.shards() as usize];
        for (i, t) in tasks.iter().enumerate() {
            by_shard[self.shard_of(&t.id) as usize].push(i);
        }
        let channel = self.keys().wake_channel();
        let calls = by_shard
            .iter()
            .enumerate()
            .filter(|(_, ix)| !ix.is_empty())
            .map(|(shard, ix)| {
                let shard = shard as u32;
                let mut inv = self.shard_script(&self.inner.scripts.schedule, shard);
                for &i in ix {
                    inv.key(self.keys().done(shard, &tasks[i].id));
                }
                inv.arg(&channel).arg(shard).arg(match mode {
                    ScheduleMode::Upsert => "upsert",
                    ScheduleMode::IfAbsent => "absent",
                });
                for &i in ix {
                    let t = &tasks[i];
                    inv.arg(&t.id)
                        .arg(t.run_at.max(0))
                        .arg(t.max_attempts)
                        .arg(&t.plugin)
                        .arg(t.owner.as_deref().unwrap_or(""))
                        .arg(&t.payload)
                        .arg(0);
                }
                let mut conn = self.conn();
                async move {
                    let verdicts: Vec<String> = inv
                        .invoke_async(&mut conn)
                        .await
                        .context("schedule script")?;
                    Ok::<_, anyhow::Error>((ix, verdicts))
                }
            });
        let mut out = vec![Scheduled::Ok; tasks.len()];
        for (ix, verdicts) in try_join_all(calls).await? {
            for (&i, v) in ix.iter().zip(verdicts) {
                out[i] = match v.as_str() {
                    "ok" => Scheduled::Ok,
                    "running" => Scheduled::Running,
                    _ => Scheduled::Exists,
                };
            }
        }
        Ok(out)
    }

    /// Claims up to `limit` due tasks of a shard with a lease of `lease_ms` (after putting tasks
    /// whose lease expired back to due).
    pub async fn claim(&self, shard: u32, limit: usize, lease_ms: u64) -> Result<ClaimBatch> {
        let mut inv = self.shard_script(&self.inner.scripts.claim, shard);
        inv.arg(limit).arg(lease_ms);
        let v: Vec<Value> = inv
            .invoke_async(&mut self.conn())
            .await
            .context("claim script")?;
        let now = int(&v[0]);
        let next = int(&v[1]);
        let lease = int(&v[2]);
        let tasks = v[3..]
            .chunks_exact(2)
            .filter_map(|c| {
                let id = string(&c[0]);
                let r = TaskRecord::decode(&id, &string(&c[1]))?;
                Some(Claimed {
                    id,
                    shard,
                    attempt: r.attempts,
                    due: r.run_at,
                    max_attempts: r.max_attempts,
                    plugin: r.plugin,
                    owner: r.owner,
                    payload: r.payload,
                    created: r.created_at,
                })
            })
            .collect();
        Ok(ClaimBatch {
            now,
            next_due: (next >= 0).then_some(next),
            next_lease_expiry: (lease >= 0).then_some(lease),
            tasks,
        })
    }

    /// Records outcomes of claimed tasks of one shard, fenced by attempt.
    pub async fn finish(
        &self,
        shard: u32,
        items: &[(&str, u32, &Finish)],
    ) -> Result<Vec<Finished>> {
        let mut inv = self.shard_script(&self.inner.scripts.finish, shard);
        for (id, _, _) in items {
            inv.key(self.keys().done(shard, id));
        }
        inv.arg(self.keys().wake_channel())
            .arg(shard)
            .arg(self.inner.opts.keep_done_ms.max(1));
        for (id, attempt, f) in items {
            let (kind, value, error) = match f {
                Finish::Done => ("done", 0, ""),
                Finish::Retry { after_ms, error } => ("retry", *after_ms, error.as_str()),
                Finish::Dead { error } => ("dead", 0, error.as_str()),
                Finish::Again { at } => ("again", *at, ""),
                Finish::Release => ("release", 0, ""),
            };
            inv.arg(*id)
                .arg(*attempt)
                .arg(kind)
                .arg(value)
                .arg(field_safe(error));
        }
        let verdicts: Vec<String> = inv
            .invoke_async(&mut self.conn())
            .await
            .context("finish script")?;
        Ok(verdicts
            .iter()
            .map(|v| match v.as_str() {
                "done" => Finished::Done,
                "retry" => Finished::Retry,
                "dead" => Finished::Dead,
                "again" => Finished::Again,
                "release" => Finished::Release,
                _ => Finished::Stale,
            })
            .collect())
    }

    /// Moves a scheduled task; returns its new due time.
    pub async fn move_task(&self, id: &str, how: Move) -> Result<Result<i64, Refused>> {
        let shard = self.shard_of(id);
        let mut inv = self.shard_script(&self.inner.scripts.move_task, shard);
        let (mode, value) = match how {
            Move::At(t) => ("at", t),
            Move::Shift(d) => ("shift", d),
            Move::Now => ("now", 0),
        };
        inv.key(self.keys().done(shard, id));
        inv.arg(self.keys().wake_channel())
            .arg(shard)
            .arg(id)
            .arg(mode)
            .arg(value);
        let v: Vec<Value> = inv
            .invoke_async(&mut self.conn())
            .await
            .context("move script")?;
        Ok(match string(&v[0]).as_str() {
            "ok" => Ok(int(&v[1])),
            other => Err(refusal(other)),
        })
    }

    /// Cancels a scheduled (or dead) task.
    pub async fn cancel(&self, id: &str) -> Result<Result<(), Refused>> {
        self.delete(id, false).await
    }

    /// Drops a dead task.
    pub async fn drop_dead(&self, id: &str) -> Result<Result<(), Refused>> {
        self.delete(id, true).await
    }

    async fn delete(&self, id: &str, only_dead: bool) -> Result<Result<(), Refused>> {
        let shard = self.shard_of(id);
        let mut inv = self.shard_script(&self.inner.scripts.cancel, shard);
        inv.key(self.keys().done(shard, id));
        inv.arg(id).arg(if only_dead { "1" } else { "0" });
        let v: String = inv
            .invoke_async(&mut self.conn())
            .await
            .context("cancel script")?;
        Ok(match v.as_str() {
            "ok" => Ok(()),
            other => Err(refusal(other)),
        })
    }

    /// Puts a dead task back, due now with its attempts reset.
    pub async fn revive(&self, id: &str) -> Result<Result<i64, Refused>> {
        let shard = self.shard_of(id);
        let mut inv = self.shard_script(&self.inner.scripts.revive, shard);
        inv.arg(self.keys().wake_channel()).arg(shard).arg(id);
        let v: Vec<Value> = inv
            .invoke_async(&mut self.conn())
            .await
            .context("revive script")?;
        Ok(match string(&v[0]).as_str() {
            "ok" => Ok(int(&v[1])),
            other => Err(refusal(other)),
        })
    }

    /// Reads one task in any state (a done task until its retention ends).
    pub async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        let shard = self.shard_of(id);
        let k = self.keys().shard(shard);
        let (live, done): (Option<String>, Option<String>) = redis::pipe()
            .cmd("HGET")
            .arg(&k.tasks)
            .arg(id)
            .cmd("GET")
            .arg(self.keys().done(shard, id))
            .query_async(&mut self.conn())
            .await
            .context("reading a task")?;
        Ok(live.or(done).and_then(|r| TaskRecord::decode(id, &r)))
    }

    /// The owner's scheduled tasks, soonest first.
    pub async fn owner_tasks(&self, owner: &str) -> Result<Vec<TaskRecord>> {
        let calls = (0..self.shards()).map(|shard| {
            let k = self.keys().shard(shard);
            let mut conn = self.conn();
            let (lo, hi) = (format!("[{owner}\0"), format!("({owner}\u{1}"));
            async move {
                let members: Vec<String> = redis::cmd("ZRANGEBYLEX")
                    .arg(&k.byowner)
                    .arg(lo)
                    .arg(hi)
                    .query_async(&mut conn)
                    .await?;
                let ids: Vec<String> = members
                    .iter()
                    .filter_map(|m| m.rsplit('\0').next())
                    .map(str::to_owned)
                    .collect();
                if ids.is_empty() {
                    return Ok::<_, anyhow::Error>(Vec::new());
                }
                let recs: Vec<Option<String>> = redis::cmd("HMGET")
                    .arg(&k.tasks)
                    .arg(&ids)
                    .query_async(&mut conn)
                    .await?;
                Ok(ids
                    .iter()
                    .zip(recs)
                    .filter_map(|(id, r)| r.and_then(|r| TaskRecord::decode(id, &r)))
                    .filter(|t| t.state == TaskState::Scheduled)
                    .collect())
            }
        });
        let mut all: Vec<TaskRecord> = try_join_all(calls)
            .await
            .context("listing an owner's tasks")?
            .concat();
        all.sort_by(|a, b| (a.run_at, &a.id).cmp(&(b.run_at, &b.id)));
        Ok(all)
    }

    /// Shifts all scheduled tasks of an owner (optionally of one plugin); returns how many moved.
    /// Atomic per shard (one script each), not across shards.
    pub async fn shift_owner(
        &self,
        owner: &str,
        shift_ms: i64,
        plugin: Option<&str>,
    ) -> Result<u64> {
        let channel = self.keys().wake_channel();
        let calls = (0..self.shards()).map(|shard| {
            let mut inv = self.shard_script(&self.inner.scripts.shift_owner, shard);
            inv.arg(&channel)
                .arg(shard)
                .arg(owner)
                .arg(shift_ms)
                .arg(plugin.unwrap_or(""));
            let mut conn = self.conn();
            async move { inv.invoke_async::<u64>(&mut conn).await }
        });
        let moved = try_join_all(calls).await.context("owner shift script")?;
        Ok(moved.iter().sum())
    }

    /// Dead tasks, most recently dead first. The cursor is the `(died_at, id)` of the last one
    /// returned; pass it back for the next page.
    pub async fn dead(
        &self,
        limit: usize,
        cursor: Option<(i64, String)>,
    ) -> Result<(Vec<TaskRecord>, Option<(i64, String)>)> {
        let max = cursor
            .as_ref()
            .map(|(t, _)| t.to_string())
            .unwrap_or_else(|| "+inf".into());
        let calls = (0..self.shards()).map(|shard| {
            let k = self.keys().shard(shard);
            let mut conn = self.conn();
            let max = max.clone();
            let cursor = cursor.clone();
            async move {
                // Enough to page past entries that tie with the cursor's time.
                let rows: Vec<(String, i64)> = redis::cmd("ZRANGE")
                    .arg(&k.dead)
                    .arg(&max)
                    .arg("-inf")
                    .arg("BYSCORE")
                    .arg("REV")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit + 1000)
                    .arg("WITHSCORES")
                    .query_async(&mut conn)
                    .await?;
                let rows: Vec<(String, i64)> = rows
                    .into_iter()
                    .filter(|(id, t)| match &cursor {
                        Some((ct, cid)) => (t, id.as_str()) < (ct, cid.as_str()),
                        None => true,
                    })
                    .take(limit)
                    .collect();
                if rows.is_empty() {
                    return Ok::<_, anyhow::Error>(Vec::new());
                }
                let ids: Vec<&String> = rows.iter().map(|(id, _)| id).collect();
                let recs: Vec<Option<String>> = redis::cmd("HMGET")
                    .arg(&k.tasks)
                    .arg(&ids)
                    .query_async(&mut conn)
                    .await?;
                Ok(rows
                    .iter()
                    .zip(recs)
                    .filter_map(|((id, t), r)| {
                        r.and_then(|r| TaskRecord::decode(id, &r))
                            .map(|rec| (*t, rec))
                    })
                    .collect::<Vec<_>>())
            }
        });
        let mut all: Vec<(i64, TaskRecord)> = try_join_all(calls)
            .await
            .context("listing dead tasks")?
            .concat();
        all.sort_by(|a, b| (b.0, &b.1.id).cmp(&(a.0, &a.1.id)));
        all.truncate(limit);
        let next = if all.len() == limit {
            all.last().map(|(t, r)| (*t, r.id.clone()))
        } else {
            None
        };
        Ok((all.into_iter().map(|(_, r)| r).collect(), next))
    }

    /// Tasks scheduled (due), in flight and dead, per shard: for metrics.
    pub async fn shard_counts(&self) -> Result<Vec<(u64, u64, u64)>> {
        let calls = (0..self.shards()).map(|shard| {
            let k = self.keys().shard(shard);
            let mut conn = self.conn();
            async move {
                redis::pipe()
                    .cmd("ZCARD")
                    .arg(&k.due)
                    .cmd("ZCARD")
                    .arg(&k.inflight)
                    .cmd("ZCARD")
                    .arg(&k.dead)
                    .query_async::<(u64, u64, u64)>(&mut conn)
                    .await
            }
        });
        try_join_all(calls).await.context("counting tasks")
    }

    /// Applies one run's kv writes and events, at most once per run. Returns false when they had
    /// been applied before.
    pub async fn apply_ns_effects(&self, run: &Claimed, fx: &NsEffects) -> Result<bool> {
        let (task_id, plugin) = (run.id.as_str(), run.plugin.as_str());
        if fx.kv.is_empty() && fx.events.is_empty() {
            return Ok(true);
        }
        let keys = self.keys();
        let mut inv = self.inner.scripts.effects.prepare_invoke();
        inv.key(keys.effects_marker(
            task_id,
            &format!("{}:{}:{}", run.created, run.due, run.attempt),
        ));
        // A day is plenty: a re-run is a new attempt, so it has a new marker anyway.
        inv.arg(24 * 3600 * 1000).arg(self.inner.opts.stream_maxlen);
        let mut ix = 1;
        for w in &fx.kv {
            ix += 1;
            match w {
                KvWrite::Set { key, value, ttl_ms } => {
                    inv.key(keys.kv(plugin, key))
                        .arg("set")
                        .arg(ix)
                        .arg(value)
                        .arg(ttl_ms.unwrap_or(0));
                }
                KvWrite::Delete { key } => {
                    inv.key(keys.kv(plugin, key)).arg("del").arg(ix);
                }
            }
        }
        for (topic, data) in &fx.events {
            ix += 1;
            inv.key(keys.events(topic))
                .arg("emit")
                .arg(ix)
                .arg(task_id)
                .arg(plugin)
                .arg(data);
        }
        let applied: i64 = inv
            .invoke_async(&mut self.conn())
            .await
            .context("effects script")?;
        Ok(applied == 1)
    }

    /// Reads one entry of a plugin's key-value store.
    pub async fn kv_get(&self, plugin: &str, key: &str) -> Result<Option<String>> {
        let v: Option<String> = redis::cmd("GET")
            .arg(self.keys().kv(plugin, key))
            .query_async(&mut self.conn())
            .await
            .context("kv get")?;
        Ok(v)
    }

    /// Records that a runner is alive (its info, JSON, readable for `ttl_ms`) and returns the ids
    /// of the runners heard from within `window_ms`, sorted. Times are Redis time, so runners'
    /// clocks do not matter.
    pub async fn heartbeat(
        &self,
        runner_id: &str,
        info: &str,
        ttl_ms: u64,
        window_ms: u64,
    ) -> Result<Vec<String>> {
        let k = self.keys();
        self.inner
            .scripts
            .heartbeat
            .key(k.runners())
            .key(k.runner(runner_id))
            .arg(runner_id)
            .arg(info)
            .arg(ttl_ms.max(1))
            .arg(window_ms)
            .invoke_async(&mut self.conn())
            .await
            .context("heartbeat")
    }

    /// Removes a runner's heartbeat (graceful shutdown).
    pub async fn forget_runner(&self, runner_id: &str) -> Result<()> {
        let k = self.keys();
        redis::pipe()
            .cmd("DEL")
            .arg(k.runner(runner_id))
            .ignore()
            .cmd("ZREM")
            .arg(k.runners())
            .arg(runner_id)
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .context("removing a heartbeat")
    }

    /// The info (JSON) of every live runner.
    pub async fn runners(&self) -> Result<Vec<String>> {
        let k = self.keys();
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(k.runners())
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn())
            .await
            .context("listing runners")?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = ids.iter().map(|id| k.runner(id)).collect();
        let infos: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut self.conn())
            .await
            .context("listing runners")?;
        Ok(infos.into_iter().flatten().collect())
    }

    /// Acquires, renews or releases a shard lease for `runner_id`; true when it holds (held) it.
    pub async fn shard_lease(
        &self,
        shard: u32,
        op: LeaseOp,
        runner_id: &str,
        ttl_ms: u64,
    ) -> Result<bool> {
        let op = match op {
            LeaseOp::Acquire => "acquire",
            LeaseOp::Renew => "renew",
            LeaseOp::Release => "release",
        };
        let held: i64 = self
            .inner
            .scripts
            .lease
            .key(self.keys().shard_lease(shard))
            .arg(op)
            .arg(runner_id)
            .arg(ttl_ms.max(1))
            .invoke_async(&mut self.conn())
            .await
            .context("shard lease script")?;
        Ok(held == 1)
    }

    /// Whether Redis answers.
    pub async fn ping(&self) -> Result<()> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn())
            .await
            .context("PING")?;
        Ok(())
    }

    /// A plain client for pub/sub subscriptions (`attempt`: see [`RedisTarget::pubsub_url`]).
    pub fn pubsub_client(&self, attempt: usize) -> Result<redis::Client> {
        Ok(redis::Client::open(self.target().pubsub_url(attempt))?)
    }
}

/// FNV-1a 64 of the id, mod the shard count.
pub fn shard_of(id: &str, shards: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(shards)) as u32
}

fn refusal(s: &str) -> Refused {
    match s {
        "running" => Refused::Running,
        "done" => Refused::Done,
        "dead" => Refused::Dead,
        "not_dead" => Refused::NotDead,
        _ => Refused::Missing,
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        Value::SimpleString(s) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

fn string(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_spread_ids() {
        let mut seen = vec![0; 16];
        for i in 0..16_000 {
            seen[shard_of(&format!("task-{i}"), 16) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800 && n < 1200), "{seen:?}");
    }

    #[test]
    fn parses_redis_targets() {
        assert_eq!(
            RedisTarget::parse("redis://h:1").unwrap(),
            RedisTarget::Single("redis://h:1".into())
        );
        assert_eq!(
            RedisTarget::parse("redis+cluster://a:1,b:2").unwrap(),
            RedisTarget::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        assert!(RedisTarget::parse("http://x").is_err());
    }
}
