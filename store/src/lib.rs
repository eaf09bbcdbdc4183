//! The store: the only code that talks to Redis.
//!
//! It owns the data model (ARCHITECTURE.md's key table: per shard the task records, due
//! buckets, claim batches, dead letters and indexes; the namespace's meta, plugins, kv and
//! events) and every state change of a task, each one Lua script on one shard with all of its
//! keys passed in KEYS (see `lua/`). Its files are cut by concern; ARCHITECTURE.md's codemap says
//! what each holds.
//!
//! Architecture invariant: no other crate builds a key name or sends a Redis command (the runner
//! does not depend on the redis crate); a reply this runner does not know is an error, never a
//! default answer.

mod access;
mod budget;
mod bulk;
mod connection;
mod effects;
mod events;
mod extras;
mod far;
mod find;
mod inspect;
mod keys;
mod layout;
mod plugins;
mod pubsub;
mod quota;
mod record;
mod recurring;
mod revoke;
mod run_room;
mod runners;
mod schedule;
pub use runners::RunnerInfo;
mod scripts;
mod secrets;
mod slots;
mod sources;
mod stats;
mod tasks;
mod types;

use std::sync::Arc;

use anyhow::{Result, bail};

pub use access::AuditEntry;
pub use budget::BudgetExceeded;
pub use bulk::{BULK_CHUNK, DeadAction};
use connection::{Conn, connect};
pub use connection::{RedisTarget, is_full, is_unreachable, redact};
pub use effects::MARKER_GRACE_MS;
pub use events::{Debounced, Event, Met, OUTBOX_GRACE_MS, Published, event_shard};
pub use extras::{DEFAULT_LOOKBACK_MS, Extras, Listener, Then, Window};
pub use far::PROMOTE_CHUNK;
pub use find::{FindCursor, FindQuery};
pub use keys::{Keys, OWNER_PAUSES_CHANGED, ShardKeys};
pub use pubsub::{Heard, Subscription};
pub use quota::{MAX_MAX_PENDING, NotAdmitted, QuotaExceeded};
pub use record::{AttemptLog, LogLine, TaskRecord, TaskState, decode_log, field_safe};
pub use recurring::{ScheduleOp, SchedulePut, ScheduleRow};
pub use revoke::revocation_of;
use scripts::Scripts;
#[doc(hidden)]
pub use scripts::libraries as script_libraries;
pub use secrets::{MAX_SECRET_CHARS, SecretInfo, SecretsKey, valid_secret_name};
pub use slots::{Promoted, SlotWaiter, SlotsOf};
pub use sources::{SOURCE_CLAIM_IDLE_MS, Source, SourceRead};
pub use stats::{DueHistogram, PluginCounts, STATS_BUCKET_MS, StatsBucket};
pub use tasks::OWNER_CHUNK;
pub use types::*;

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
    /// Built once per `Store::open`, shared with the stores `own_connection` opens from it.
    scripts: Arc<Scripts>,
    /// Each plugin's max_pending and pending count, shared the same way.
    quotas: Arc<quota::Quotas>,
    /// Each plugin's team and each team's task bytes, shared the same way.
    budgets: Arc<budget::Budgets>,
}

impl Store {
    /// Connects, checks the namespace's shard count (recording it on first use), that Redis
    /// does not evict keys, and its shards' data layout (refusing data of builds before 0.1.0).
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
                scripts: Arc::new(Scripts::load()),
                quotas: Default::default(),
                budgets: Default::default(),
            }),
        };
        store.check_shards().await?;
        store.check_eviction().await?;
        store.check_layout().await?;
        Ok(store)
    }

    /// Refuses a Redis that may evict keys: any `maxmemory-policy` but `noeviction` drops
    /// tasks (`allkeys-*`) or effect markers, shard leases and concurrency slots (`volatile-*`,
    /// the keys with a TTL) without a word. Every node the target names is asked; a Redis that
    /// does not answer `CONFIG GET` (a managed one may rename it) is let through with a warning.
    async fn check_eviction(&self) -> Result<()> {
        for (addr, client) in self.inner.target.node_clients().await? {
            let policy = match connection::maxmemory_policy(&client).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(
                        "could not read maxmemory-policy from {addr} ({e:#}); eggtimer needs `noeviction`: an evicting Redis drops tasks"
                    );
                    continue;
                }
            };
            if policy != "noeviction" {
                bail!(
                    "Redis at {addr} has maxmemory-policy {policy}: it may evict eggtimer's keys (tasks, leases, effect markers) \
                     without a word; set `maxmemory-policy noeviction` (CONFIG SET maxmemory-policy noeviction, and in redis.conf)"
                );
            }
        }
        Ok(())
    }

    /// The same store on a connection of its own, whose I/O runs on the runtime this is called
    /// on. The HTTP API's store: its requests and replies then don't pass through the engine's
    /// thread (`serve::Runtimes`).
    pub async fn own_connection(&self) -> Result<Store> {
        let i = &self.inner;
        Ok(Store {
            inner: Arc::new(Inner {
                conn: connect(&i.target).await?,
                target: i.target.clone(),
                keys: i.keys.clone(),
                opts: i.opts.clone(),
                scripts: Arc::clone(&i.scripts),
                quotas: Arc::clone(&i.quotas),
                budgets: Arc::clone(&i.budgets),
            }),
        })
    }

    /// Records the shard count on first use (after a FLUSHALL too); refuses another count.
    pub async fn check_shards(&self) -> Result<()> {
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

    pub(crate) fn conn(&self) -> Conn {
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

    /// The runner's clock, following Redis's (see [`eggtimer_base::clock`]).
    pub fn clock(&self) -> &eggtimer_base::clock::Clock {
        &self.inner.opts.clock
    }

    /// The shard of a task (its key or its id): FNV-1a of the id, mod the shard count. The
    /// tasks of every plugin that share an id share a shard, so one read finds them all.
    pub fn shard_of(&self, key: &str) -> u32 {
        shard_of(public_id(key), self.shards())
    }

    /// The indexes of `ids` grouped by shard, for one call per shard (shards without ids left out).
    fn by_shard<'a>(&self, ids: impl Iterator<Item = &'a str>) -> Vec<(u32, Vec<usize>)> {
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); self.shards() as usize];
        for (i, id) in ids.enumerate() {
            groups[self.shard_of(id) as usize].push(i);
        }
        groups
            .into_iter()
            .enumerate()
            .filter(|(_, ix)| !ix.is_empty())
            .map(|(shard, ix)| (shard as u32, ix))
            .collect()
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
}

/// Separates a task's plugin from its id in the key its records are stored under.
pub const KEY_MARK: char = '\x1f';

/// The key a task of `plugin` with the id `id` is stored under: `<plugin>\x1f<id>`. A task id
/// belongs to its plugin: two plugins' tasks of one id are two tasks, and nothing done with one
/// of them reaches the other. (Ids hold no control characters, so the key is unambiguous; a
/// record written by 0.1.0 is stored under its bare id, which has no mark.)
pub fn task_key(plugin: &str, id: &str) -> String {
    let mut key = String::with_capacity(plugin.len() + 1 + id.len());
    key.push_str(plugin);
    key.push(KEY_MARK);
    key.push_str(id);
    key
}

/// The id of the task stored under `key` (a 0.1.0 record's key is its id).
pub fn public_id(key: &str) -> &str {
    match key.split_once(KEY_MARK) {
        Some((_, id)) => id,
        None => key,
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

/// `items` cut into calls of a script of at most `max_items` and about `max_bytes` of them (by
/// `size`), in order: an item larger than `max_bytes` goes alone.
pub(crate) fn cut_calls<T>(
    items: impl IntoIterator<Item = T>,
    max_items: usize,
    max_bytes: usize,
    size: impl Fn(&T) -> usize,
) -> Vec<Vec<T>> {
    let mut calls: Vec<Vec<T>> = Vec::new();
    let mut bytes = 0;
    for item in items {
        let n = size(&item);
        match calls.last_mut() {
            Some(call) if call.len() < max_items && bytes + n <= max_bytes => {
                call.push(item);
                bytes += n;
            }
            _ => {
                calls.push(vec![item]);
                bytes = n;
            }
        }
    }
    calls
}

/// `ix` (indexes into `tasks`, one shard's) cut into calls of at most `max_tasks` tasks and about
/// `max_bytes` of payloads, in order: a task larger than the bound goes alone. A task listening
/// for events counts as one more task per listener (each is an index entry and a message to
/// write). What one script call costs Redis then depends on those bounds, never on how much one
/// request brings.
pub(crate) fn calls_by_size<'a>(
    tasks: &[NewTask],
    ix: &'a [usize],
    max_tasks: usize,
    max_bytes: usize,
) -> Vec<&'a [usize]> {
    let mut out = Vec::new();
    let (mut start, mut bytes, mut units) = (0, 0, 0);
    for (j, &i) in ix.iter().enumerate() {
        let size = tasks[i].payload.len();
        let weight = 1 + tasks[i].on.len();
        if j > start && (units + weight > max_tasks || bytes + size > max_bytes) {
            out.push(&ix[start..j]);
            (start, bytes, units) = (j, 0, 0);
        }
        bytes += size;
        units += weight;
    }
    if start < ix.len() {
        out.push(&ix[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_key_names_its_plugin_and_its_id_keeps_its_shard() {
        let k = task_key("order-cancel", "c-1");
        assert_eq!(k, "order-cancel\x1fc-1");
        assert_eq!(public_id(&k), "c-1");
        assert_eq!(public_id("c-1"), "c-1", "a 0.1.0 record's key is its id");
        assert_eq!(shard_of(public_id(&k), 16), shard_of("c-1", 16));
        assert_ne!(task_key("coupon-remind", "c-1"), k);
    }

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
        assert_eq!(
            RedisTarget::parse("redis+sentinel://:pw@a:1,b:2/tasks").unwrap(),
            RedisTarget::Sentinel {
                sentinels: vec!["redis://a:1".into(), "redis://b:2".into()],
                master: "tasks".into(),
                password: Some("pw".into()),
            }
        );
        assert!(
            RedisTarget::parse("redis+sentinel://a:1").is_err(),
            "no master name"
        );
        assert!(RedisTarget::parse("http://x").is_err());
    }
}
