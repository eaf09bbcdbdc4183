//! Every Redis key and channel name eggtimer uses, in one place.
//!
//! Architecture invariant: all keys of one shard share the hash tag `{ns:s}`, so a shard script
//! touches one Redis Cluster slot; namespace-wide keys (meta, plugin registry, kv, event streams)
//! share the tag `{ns}`.

/// The message on the plugins channel that says an owner's pauses changed (no plugin is named
/// so: plugin names are `[a-z0-9-]`).
pub const OWNER_PAUSES_CHANGED: &str = ":owner-pauses";

/// The names of one namespace's keys.
#[derive(Clone, Debug)]
pub struct Keys {
    ns: String,
}

/// The keys every shard script takes first, in the order `lua/lib/shard.lua` expects (it
/// describes each). The Redis key names are part of the data layout: renaming one needs a
/// migration between releases.
pub struct ShardKeys {
    /// HASH id -> the task's record.
    pub tasks: String,
    pub dead: String,
    pub byowner: String,
    /// HASH of shard settings and counters (`claim`: the claim counter; `paused`; `layout`;
    /// `bucket`).
    pub meta: String,
    pub parked: String,
    /// ZSET of each plugin's dead tasks.
    pub byplugin: String,
    pub unique: String,
    pub rerun: String,
    /// ZSET claim token -> lease end, one entry per running claim batch (Redis key `leases`).
    pub claim_leases: String,
    /// HASH token -> the batch's ids, token:n -> how many still run, running -> their sum.
    pub batches: String,
    /// ZSET `<time>\t<id>\t...` -> finish time: the tasks each finish script recorded done.
    pub finished: String,
    /// HASH plugin -> how many of its tasks are scheduled (in a due bucket or `parked`).
    pub scheduled: String,
    /// ZSET bucket name -> bound: the index of the due buckets, each the ZSET `<duex>:<name>` of
    /// id -> due (see `due_bucket`).
    pub duex: String,
    /// ZSET `plugin\tdue\tid` (score 0): due tasks a claim set aside for their plugin's fair
    /// share (each also in `parked`).
    pub waiting: String,
    /// HASH id -> the log lines of the task's last three attempts (see `lua/lib/logs.lua`).
    pub logs: String,
    /// ZSET message -> time: what this shard owes another (listen, deliver, unlisten; see
    /// `lua/lib/extras.lua`).
    pub outbox: String,
    /// HASH `topic\x1fkey` -> the tasks listening for that event (in the event's shard), up
    /// to eight; more are in a hash of their own, `<listeners>:<topic\x1fkey>`, and an event's
    /// listeners taken aside to be handed it in several calls in `<listeners>:d:<event id>`
    /// (see `lua/lib/extras.lua`).
    pub listeners: String,
    /// HASH `topic\x1fkey` -> `time\x1e<event JSON>`: the latest event, kept for the lookback.
    pub events: String,
    /// ZSET `topic\x1fkey` -> its latest event's time.
    pub event_times: String,
}

impl ShardKeys {
    /// ZSET P message -> time: the events still being handed to listeners taken aside.
    pub fn drains(&self) -> String {
        format!("{}:drains", self.listeners)
    }

    /// A due bucket's key (its name from `duex`).
    pub fn due_bucket(&self, name: &str) -> String {
        format!("{}:{name}", self.duex)
    }

    /// LIST: the payloads of the debounced task stored under `key` (its window; see
    /// `lua/lib/extras.lua`). The next window's list is `<tasks>:n:<key>`.
    pub fn window(&self, key: &str) -> String {
        format!("{}:w:{key}", self.tasks)
    }

    /// The far tier's slots (ZSET `plugin \x1f slot` -> the slot's start), see `lua/lib/far.lua`.
    pub fn far_slots(&self) -> String {
        format!("{}:fs", self.tasks)
    }

    /// One far slot's tasks (STRING), by its member of `far_slots`.
    pub fn far_slot(&self, member: &str) -> String {
        format!("{}:f:{member}", self.tasks)
    }

    pub fn all(&self) -> [&str; 19] {
        [
            &self.tasks,
            &self.dead,
            &self.byowner,
            &self.meta,
            &self.parked,
            &self.byplugin,
            &self.unique,
            &self.rerun,
            &self.claim_leases,
            &self.batches,
            &self.finished,
            &self.scheduled,
            &self.duex,
            &self.waiting,
            &self.logs,
            &self.outbox,
            &self.listeners,
            &self.events,
            &self.event_times,
        ]
    }
}

impl Keys {
    pub fn new(ns: &str) -> Self {
        Keys { ns: ns.to_owned() }
    }

    pub fn ns(&self) -> &str {
        &self.ns
    }

    pub fn shard(&self, shard: u32) -> ShardKeys {
        let tag = format!("{{{}:{}}}", self.ns, shard);
        ShardKeys {
            tasks: format!("{tag}:tasks"),
            dead: format!("{tag}:dead"),
            byowner: format!("{tag}:byowner"),
            meta: format!("{tag}:meta"),
            parked: format!("{tag}:parked"),
            byplugin: format!("{tag}:byplugin"),
            unique: format!("{tag}:unique"),
            rerun: format!("{tag}:rerun"),
            claim_leases: format!("{tag}:leases"),
            batches: format!("{tag}:batches"),
            finished: format!("{tag}:finished"),
            scheduled: format!("{tag}:scheduled"),
            duex: format!("{tag}:duex"),
            waiting: format!("{tag}:waiting"),
            logs: format!("{tag}:logs"),
            outbox: format!("{tag}:outbox"),
            listeners: format!("{tag}:listeners"),
            events: format!("{tag}:events"),
            event_times: format!("{tag}:event-times"),
        }
    }

    /// The recurring schedules whose id falls in this shard (HASH: see `lua/recurring.lua`).
    pub fn schedules(&self, shard: u32) -> String {
        format!("{{{}:{}}}:schedules", self.ns, shard)
    }

    /// ZSET schedule id -> its next fire time, for the schedules of this shard that will fire.
    pub fn schedule_next(&self, shard: u32) -> String {
        format!("{{{}:{}}}:sched", self.ns, shard)
    }

    /// The lock a shift of `owner`'s tasks holds in a shard (see `lua/shift_owner.lua`).
    pub fn owner_shift_lock(&self, shard: u32, owner: &str) -> String {
        format!("{{{}:{}}}:shift:{}", self.ns, shard, owner)
    }

    /// ZSET firing task id -> created at: firings not yet recorded by their schedule.
    pub fn fired(&self, shard: u32) -> String {
        format!("{{{}:{}}}:fired", self.ns, shard)
    }

    /// Namespace settings (the shard count).
    pub fn meta(&self) -> String {
        format!("{{{}}}:meta", self.ns)
    }

    /// Pub/sub channel that wakes shard pollers: messages are `<shard>:<due ms>`.
    pub fn wake_channel(&self) -> String {
        format!("{{{}}}:wake", self.ns)
    }

    /// Pub/sub channel announcing plugin versions: messages are plugin names (and
    /// [`OWNER_PAUSES_CHANGED`] when an owner's pauses changed).
    pub fn plugins_channel(&self) -> String {
        format!("{{{}}}:plugins", self.ns)
    }

    /// HASH owner -> `\0plugin\0…\0` (`*`: all of its plugins): the owners whose tasks are
    /// paused, as each shard's meta holds them (`op:<owner>`), for the runners to read at once.
    pub fn owner_pauses(&self) -> String {
        format!("{{{}}}:owner-pauses", self.ns)
    }

    /// HASH plugin name -> current version (JSON).
    pub fn plugins(&self) -> String {
        format!("{{{}}}:plugins", self.ns)
    }

    /// LIST of a plugin's versions (JSON), newest first.
    pub fn plugin_history(&self, name: &str) -> String {
        format!("{}{name}", self.plugin_history_prefix())
    }

    /// What every plugin's history key starts with (the scripts that drop blobs read them all).
    pub fn plugin_history_prefix(&self) -> String {
        format!("{{{}}}:plugin:history:", self.ns)
    }

    /// HASH source name -> its definition (JSON): the Redis Streams read into events.
    pub fn sources(&self) -> String {
        format!("{{{}}}:sources", self.ns)
    }

    /// The consumer group eggtimer reads a source's stream with.
    pub fn source_group(&self, name: &str) -> String {
        format!("eggtimer:{}:{name}", self.ns)
    }

    /// HASH plugin name -> last version number given.
    pub fn plugin_seq(&self) -> String {
        format!("{{{}}}:plugin:seq", self.ns)
    }

    /// A plugin binary by content digest.
    pub fn plugin_blob(&self, digest: &str) -> String {
        format!("{}{digest}", self.plugin_blob_prefix())
    }

    /// An upload's bytes while they are sent in pieces, before the store script takes them as
    /// the blob of `digest` (STRING with a time to live; `nonce` tells two uploads apart).
    pub fn plugin_staging(&self, digest: &str, nonce: u64) -> String {
        format!("{{{}}}:plugin:staging:{digest}:{nonce:016x}", self.ns)
    }

    /// What every blob key starts with.
    pub fn plugin_blob_prefix(&self) -> String {
        format!("{{{}}}:plugin:blob:", self.ns)
    }

    /// HASH plugin name -> its settings (JSON: paused, max_concurrency), kept apart from its
    /// versions so an upload or a rollback keeps them.
    pub fn plugin_settings(&self) -> String {
        format!("{{{}}}:plugin:settings", self.ns)
    }

    /// HASH plugin name -> how many pauses and resumes were asked for (`lua/plugin_setting.lua`).
    pub fn plugin_pause_epoch(&self) -> String {
        format!("{{{}}}:plugin:pause-epoch", self.ns)
    }

    /// ZSET of a plugin's concurrency slots (holder -> lease expiry).
    pub fn plugin_slots(&self, name: &str) -> String {
        format!("{{{}}}:plugin:slots:{}", self.ns, name)
    }

    /// ZSET of a plugin's starts under its rate limit (run -> start time), the last window's.
    pub fn plugin_rate(&self, name: &str) -> String {
        format!("{{{}}}:plugin:rate:{}", self.ns, name)
    }

    /// ZSET `<n>:<unique>` -> ms: what runners admitted of a plugin with a max_pending of its
    /// own in the last seconds (`admit.lua`).
    pub fn plugin_admits(&self, name: &str) -> String {
        format!("{{{}}}:plugin:admits:{}", self.ns, name)
    }

    /// The ledger of one owner's tasks of a plugin under its `max_pending_per_owner`, as
    /// `plugin_admits` (a plugin name holds no `:`: the owner is all after it).
    pub fn owner_admits(&self, plugin: &str, owner: &str) -> String {
        format!("{{{}}}:owner:admits:{plugin}:{owner}", self.ns)
    }

    /// ZSET of the starts of one owner's tasks of a plugin under its `owner_rate_limit` (run ->
    /// start time), the last window's. (A plugin name holds no `:`: the owner is all after it.)
    pub fn owner_rate(&self, plugin: &str, owner: &str) -> String {
        format!("{{{}}}:owner:rate:{plugin}:{owner}", self.ns)
    }

    /// ZSET of the runs of one owner's tasks of a plugin waiting for a start under its
    /// `owner_rate_limit` (run -> reserved start).
    pub fn owner_rate_queue(&self, plugin: &str, owner: &str) -> String {
        format!("{{{}}}:owner:rate-queue:{plugin}:{owner}", self.ns)
    }

    /// ZSET of a plugin's runs waiting for a start under its rate limit (run -> reserved start).
    pub fn plugin_rate_queue(&self, name: &str) -> String {
        format!("{{{}}}:plugin:rate-queue:{}", self.ns, name)
    }

    /// SET of deleted plugins whose pattern-named keys are still to be deleted.
    pub fn plugin_purge(&self) -> String {
        format!("{{{}}}:plugin:purge", self.ns)
    }

    /// The prefixes of a plugin's keys that only a pattern names: its kv, its event streams, its
    /// per-owner slots and slot waiters (deleted with the plugin by `plugin_purge.lua`).
    pub fn plugin_key_prefixes(&self, name: &str) -> [String; 4] {
        [
            format!("{{{}}}:kv:{}:", self.ns, name),
            format!("{{{}}}:events:{}:", self.ns, name),
            format!("{{{}}}:plugin:owner-slots:{}:", self.ns, name),
            format!("{{{}}}:plugin:owner-slot-waits:{}:", self.ns, name),
        ]
    }

    /// HASH secret name -> the sealed value of one plugin's secret (`secrets.rs`).
    pub fn plugin_secrets(&self, name: &str) -> String {
        format!("{{{}}}:plugin:secrets:{}", self.ns, name)
    }

    /// The concurrency slots of one owner's runs of a plugin (a plugin name holds no `:`).
    pub fn owner_slots(&self, plugin: &str, owner: &str) -> String {
        format!("{{{}}}:plugin:owner-slots:{}:{}", self.ns, plugin, owner)
    }

    /// ZSET `id\tcreated\tattempts` -> due: runs waiting for one of a plugin's concurrency slots.
    pub fn plugin_slot_waits(&self, plugin: &str) -> String {
        format!("{{{}}}:plugin:slot-waits:{}", self.ns, plugin)
    }

    /// ZSET `id\tcreated\tattempts` -> due: runs waiting for one of an owner's slots.
    pub fn owner_slot_waits(&self, plugin: &str, owner: &str) -> String {
        format!(
            "{{{}}}:plugin:owner-slot-waits:{}:{}",
            self.ns, plugin, owner
        )
    }

    /// Marks one handler run's effects as applied (`claim` names the claim of the task).
    pub fn effects_marker(&self, task_id: &str, claim: &str) -> String {
        format!("{{{}}}:fx:{}:{}", self.ns, task_id, claim)
    }

    /// One entry of a plugin's key-value store.
    pub fn kv(&self, plugin: &str, key: &str) -> String {
        format!("{{{}}}:kv:{}:{}", self.ns, plugin, key)
    }

    /// The dashboard's history: what every runner did in the 5 s starting at `bucket_ms`.
    pub fn stats(&self, bucket_ms: i64) -> String {
        format!("{{{}}}:stats:{bucket_ms}", self.ns)
    }

    /// HASH key id -> the API key's record (JSON, with its secret's SHA-256; never the secret).
    pub fn api_keys(&self) -> String {
        format!("{{{}}}:apikeys", self.ns)
    }

    /// HASH SHA-256 of a key's secret -> the key's id.
    pub fn api_key_hashes(&self) -> String {
        format!("{{{}}}:apikey:hashes", self.ns)
    }

    /// HASH key id -> when it was last used (ms).
    pub fn api_key_used(&self) -> String {
        format!("{{{}}}:apikey:used", self.ns)
    }

    /// STRING: the key the API seals its page cursors with (64 hex digits, made once).
    pub fn cursor_key(&self) -> String {
        format!("{{{}}}:cursor-key", self.ns)
    }

    /// STREAM of the API's changes (API.md: `{<ns>}:audit`).
    pub fn audit(&self) -> String {
        format!("{{{}}}:audit", self.ns)
    }

    /// STREAM of the API's requests that failed (every 4xx and 5xx: refusals, unknown ids,
    /// invalid bodies), kept apart so that they can't push changes out of the audit.
    pub fn audit_refused(&self) -> String {
        format!("{{{}}}:audit:refused", self.ns)
    }

    /// HASH key id (`admin`, `-` for no known key) -> how many of its requests were refused
    /// (`lua/audit.lua`): counted past the refusal stream's trim.
    pub fn audit_refused_counts(&self) -> String {
        format!("{{{}}}:audit:refused-by-key", self.ns)
    }

    /// HASH bucket start (ms) -> bytes of events the API key `key_id` published in it, within
    /// the event retention (`lua/event_budget.lua`).
    pub fn event_budget(&self, key_id: &str) -> String {
        format!("{{{}}}:events-budget:{key_id}", self.ns)
    }

    /// The event stream of one plugin's topic: a plugin writes and trims only its own streams
    /// (a plugin name holds no `:`, a topic neither, so no two pairs share a key).
    pub fn events(&self, plugin: &str, topic: &str) -> String {
        format!("{{{}}}:events:{}:{}", self.ns, plugin, topic)
    }

    /// A plugin's kv index (`lua/effects.lua`): HASH kv key -> bytes of key and value, ZSET kv
    /// key -> when its TTL ends (ms), and the bytes of all of them.
    pub fn plugin_kv_index(&self, name: &str) -> [String; 3] {
        [
            format!("{{{}}}:plugin:kv-sizes:{}", self.ns, name),
            format!("{{{}}}:plugin:kv-expiry:{}", self.ns, name),
            format!("{{{}}}:plugin:kv-bytes:{}", self.ns, name),
        ]
    }

    /// SET of the topics a plugin has written events to (bounded by `--max-topics`).
    pub fn plugin_topics(&self, name: &str) -> String {
        format!("{{{}}}:plugin:topics:{}", self.ns, name)
    }

    /// HASH stream key -> the bytes of its entries: what each of a plugin's emitted streams holds
    /// (`effects.lua` keeps it and trims the streams by it).
    pub fn plugin_emitted(&self, name: &str) -> String {
        format!("{{{}}}:plugin:emitted:{}", self.ns, name)
    }

    /// The stream of a topic as 0.1.0 wrote it, shared by every plugin (read, never written).
    pub fn events_0_1(&self, topic: &str) -> String {
        format!("{{{}}}:events:{}", self.ns, topic)
    }

    /// A runner's heartbeat (HASH with a TTL).
    pub fn runner(&self, runner_id: &str) -> String {
        format!("{{{}}}:runner:{}", self.ns, runner_id)
    }

    /// ZSET runner id -> last heartbeat (ms).
    pub fn runners(&self) -> String {
        format!("{{{}}}:runners", self.ns)
    }

    /// The lease of a shard (which runner polls it).
    pub fn shard_lease(&self, shard: u32) -> String {
        format!("{{{}:{}}}:lease", self.ns, shard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_keys_share_one_hash_tag() {
        let k = Keys::new("eggtimer");
        let s = k.shard(3);
        for key in s.all() {
            assert!(key.starts_with("{eggtimer:3}:"), "{key}");
        }
        assert!(s.due_bucket("7").starts_with("{eggtimer:3}:"));
        assert!(k.schedules(3).starts_with("{eggtimer:3}:"));
        assert!(k.schedule_next(3).starts_with("{eggtimer:3}:"));
        assert!(k.fired(3).starts_with("{eggtimer:3}:"));
        assert_eq!(
            k.events("order-cancel", "order"),
            "{eggtimer}:events:order-cancel:order"
        );
        assert_eq!(k.events_0_1("order"), "{eggtimer}:events:order");
    }
}
