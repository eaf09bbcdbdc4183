//! The types the store's callers pass in and get back.

/// A task to schedule.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NewTask {
    pub id: String,
    pub plugin: String,
    /// Raw JSON text.
    pub payload: String,
    pub run_at: i64,
    pub owner: Option<String>,
    pub max_attempts: u32,
    /// After the task finished (done or dead), scheduling its id again within this long is
    /// refused as a duplicate (0: no dedup window).
    pub unique_for_ms: u64,
    /// A W3C trace context, stored with the task: its run joins that trace.
    pub traceparent: Option<String>,
    /// Not started by this time (ms), the task is dead with `expired` instead of running.
    pub start_by: Option<i64>,
    /// The events it listens for, and how long before it was scheduled an event still matches.
    pub on: Vec<super::extras::Listener>,
    pub lookback_ms: u64,
    /// Debounced: one task per id, each payload kept (see `lua/debounce.lua`).
    pub debounce: Option<Debounce>,
    /// 0 to 9: among its plugin's due tasks, the higher starts first (see `lua/lib/priority.lua`).
    pub priority: u8,
}

/// A debounced task's window (`lua/debounce.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Debounce {
    pub quiet_ms: u64,
    pub max_wait_ms: u64,
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
    /// The id finished within its dedup window (`unique_for_ms`): nothing changed.
    Duplicate,
    /// Upsert, and another task of the same batch and shard is running or a duplicate: nothing
    /// of that shard's part of the batch was written.
    NotWritten,
}

/// A task claimed by this runner: it holds the claim `token` (the fence of finish, renew and
/// effects) and its lease while the claim is current.
#[derive(Clone, Debug, PartialEq)]
pub struct Claimed {
    /// The key the task is stored under (`task_key`: its plugin and id); [`Claimed::task_id`] is
    /// its id.
    pub id: String,
    pub shard: u32,
    /// The claim token: unique per claim of this task (the shard's claim counter).
    pub token: u64,
    /// The claim whose marker this run's effects are committed under: `token`, or, when the
    /// claims before this one lost their lease with no outcome recorded (their runner died),
    /// the first of them, so effects that one committed are not committed again.
    pub effects_claim: u64,
    pub attempt: u32,
    pub due: i64,
    pub max_attempts: u32,
    pub plugin: String,
    pub owner: Option<String>,
    pub payload: String,
    /// When this occurrence of the task was scheduled (set again by upsert, run-again and
    /// replay): with the id it names the occurrence, from which follow-up ids are derived.
    pub created: i64,
    /// The W3C trace context it was scheduled with.
    pub traceparent: Option<String>,
    /// The latest time it may start (ms), if it has one.
    pub start_by: Option<i64>,
    /// The event that made it run (JSON text `{id, topic, key, at, data}`), if one did.
    pub event: Option<String>,
    /// A debounced task's payloads (JSON texts), oldest first; empty for other tasks.
    pub batch: Vec<String>,
    /// 0 to 9 (see [`NewTask::priority`]): its follow-ups are scheduled with it.
    pub priority: u8,
}

impl Claimed {
    /// The task's id (its `id` field is the key it is stored under, which names its plugin).
    pub fn task_id(&self) -> &str {
        super::public_id(&self.id)
    }
}

/// The result of one claim.
#[derive(Debug)]
pub struct ClaimBatch {
    /// Redis time of the claim (ms).
    pub now: i64,
    /// The µs of Redis's time past `now` (0–999).
    pub now_us: u16,
    /// The shard's earliest due time after the claim, if any.
    pub next_due: Option<i64>,
    /// The earliest lease expiry of the shard's in-flight tasks, if any.
    pub next_lease_expiry: Option<i64>,
    /// Due tasks this claim set aside for their plugin's fair share (see [`Share`]).
    pub set_aside: u64,
    /// Due tasks it did not take wait in the shard (set aside for their plugin's share)...
    pub waiting: bool,
    /// ... of a plugin under its part among them (a claim with headroom may take them).
    pub waiting_under_part: bool,
    /// Whether a plugin under its part may have tasks due in the shard (false only when the
    /// share said one plugin crowds the runner and only such plugins' tasks may be due here).
    pub others_here: bool,
    /// When `others_here` is false: the earliest time a plugin under its part may have a task
    /// due in the shard (its tasks there all fall due later), if one has tasks there.
    pub others_due: Option<i64>,
    pub tasks: Vec<Claimed>,
}

/// What a claim is told of the claiming runner's fair share: how many tasks it holds of each
/// plugin. Each of the claim's places goes to the plugin holding the fewest for its weight (its
/// earliest due task). With `extra` > 0 (one plugin holds much of the runner) the claim walks up to that many
/// due tasks beyond its size to find other plugins' tasks behind that plugin's backlog, setting
/// aside what it walked past (still scheduled, no attempt used; every runner's next claim looks
/// at them first). The last `headroom` places of the claim go only to plugins not crowding the
/// runner: holding at most `part`, or under half of what the plugin holding the most holds.
#[derive(Clone, Debug, Default)]
pub struct Share {
    /// Plugin -> how many of its tasks the runner holds (claimed, outcome not yet recorded),
    /// and its weight: places go to the fewest held per weight.
    pub held: Vec<(String, usize, u32)>,
    pub headroom: usize,
    pub part: usize,
    pub extra: usize,
    /// Apart from the share: tasks due up to this many ms from Redis's now are claimed too (claim
    /// ahead; the runner starts each at its due time). 0: only what is due now.
    pub ahead_ms: u64,
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
    /// Not started because its plugin is at its concurrency limit: due again in `after_ms`, the
    /// attempt given back.
    Defer {
        after_ms: i64,
    },
}

/// What `finish` did with one outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    Done,
    Retry,
    Dead,
    Again,
    Release,
    Defer,
    /// The claim was no longer current (reaped, claimed again, replaced): refused.
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
    #[error("the task belongs to another plugin")]
    OtherPlugin,
    #[error("the new due time would be outside 0 to 253402300799999 (year 9999)")]
    OutOfRange,
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

/// A kv entry as a run read it: the commit checks it is unchanged.
#[derive(Clone, Debug, PartialEq)]
pub struct KvRead {
    pub key: String,
    /// sha1 (hex) of the value read; None when it was absent.
    pub sha1: Option<String>,
}

/// The kv reads, kv writes and events of one handler run, committed together on the `{ns}` slot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NsEffects {
    /// The first read of each key (the commit is refused if any of them changed).
    pub reads: Vec<KvRead>,
    pub kv: Vec<KvWrite>,
    /// (topic, data JSON)
    pub events: Vec<(String, String)>,
    /// The trace context each event carries (a `traceparent` field of the stream entry).
    pub traceparent: Option<String>,
}

/// What committing a run's kv writes and events did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Committed {
    Applied,
    /// This claim's effects were applied before (a retried commit).
    AppliedBefore,
    /// A kv entry the run read has changed: nothing was written; run the handler again.
    Conflict,
    /// Its events would take its plugin past `max` topics: nothing was written.
    TooManyTopics {
        max: u64,
    },
    /// Its kv writes would take its plugin past `max_keys` keys or `max_bytes` bytes: nothing
    /// was written. `team`: the team's `--team-kv-bytes` when what the team's other plugins
    /// leave of it set `max_bytes`.
    KvFull {
        max_keys: u64,
        max_bytes: u64,
        team: Option<u64>,
    },
    /// Its events would not fit its plugin's emitted streams' `max_bytes`, even with the oldest
    /// entries of the streams it writes dropped: nothing was written. `team`: the team's
    /// `--team-emitted-bytes` when what the team's other plugins leave of it set `max_bytes`.
    EmittedFull {
        max_bytes: u64,
        team: Option<u64>,
    },
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
    /// Most topics one plugin writes events to.
    pub max_topics: u64,
    /// Most kv keys, and bytes of kv keys and values, one plugin keeps (counted as this build
    /// writes them).
    pub kv_max_keys: u64,
    pub kv_max_bytes: u64,
    /// Versions of a plugin kept (its history); older ones and their bytes are dropped.
    pub keep_versions: u32,
    /// Replicas that must confirm the writes the API acknowledges (`WAIT`), and how long they
    /// are waited for (ms).
    pub min_replicas_acked: u32,
    pub replica_ack_timeout_ms: u64,
    /// The key plugins' secrets are sealed with (None: secrets can't be set or read).
    pub secrets_key: Option<super::secrets::SecretsKey>,
    /// How long an event is kept for tasks scheduled after it (the longest `lookback_ms`).
    pub event_retention_ms: u64,
    /// Most bytes of tasks (payloads, listeners, debounced payloads) the plugins of one team
    /// (the key that uploaded them) make Redis hold.
    pub team_task_bytes: u64,
    /// Most bytes one plugin's emitted streams hold together (their entries' fields and
    /// values); the streams a run writes drop their oldest entries to make room.
    pub emitted_max_bytes: u64,
    /// Most bytes of kv, and of emitted streams, the plugins of one team keep together.
    pub team_kv_bytes: u64,
    pub team_emitted_bytes: u64,
    /// How long (ms) a task is due and not started before it counts as the highest priority.
    pub priority_aging_ms: u64,
    /// Tasks due this long from now or later (ms) are kept in the far tier (0: no far tier);
    /// see `lua/lib/far.lua`.
    pub far_horizon_ms: u64,
    /// The runner's clock (shared by every store opened with these options).
    pub clock: eggtimer_base::clock::Clock,
}

/// `--team-task-bytes` unless set: 64 MiB.
pub const DEFAULT_TEAM_TASK_BYTES: u64 = 64 << 20;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            namespace: "eggtimer".into(),
            shards: 16,
            keep_done_ms: 600_000,
            stream_maxlen: 1_000_000,
            max_topics: 100,
            kv_max_keys: 100_000,
            kv_max_bytes: 64 << 20,
            keep_versions: 10,
            min_replicas_acked: 0,
            replica_ack_timeout_ms: 1000,
            secrets_key: None,
            event_retention_ms: 60_000,
            team_task_bytes: DEFAULT_TEAM_TASK_BYTES,
            emitted_max_bytes: 64 << 20,
            team_kv_bytes: 64 << 20,
            team_emitted_bytes: 64 << 20,
            priority_aging_ms: 60_000,
            far_horizon_ms: 0,
            clock: eggtimer_base::clock::Clock::default(),
        }
    }
}

/// Decodes a script's status word; anything else is an error naming the script and the word.
pub(super) trait Verdict: Sized {
    fn from_word(word: &str) -> Option<Self>;

    fn parse(script: &str, word: &str) -> anyhow::Result<Self> {
        Self::from_word(word).ok_or_else(|| {
            anyhow::anyhow!(
                "the {script} script answered {word:?}, which this runner does not know"
            )
        })
    }
}

impl Scheduled {
    /// The schedule script's letter for a verdict (its answer is one letter per task).
    pub(super) fn from_letter(c: u8) -> Option<Self> {
        Some(match c {
            b'o' => Scheduled::Ok,
            b'r' => Scheduled::Running,
            b'e' => Scheduled::Exists,
            b'd' => Scheduled::Duplicate,
            b'n' => Scheduled::NotWritten,
            _ => return None,
        })
    }
}

impl Finished {
    /// The finish script's letter for an outcome (its answer is one letter per task).
    pub(super) fn from_letter(c: u8) -> Option<Self> {
        Some(match c {
            b'd' => Finished::Done,
            b'r' => Finished::Retry,
            b'x' => Finished::Dead,
            b'a' => Finished::Again,
            b'l' => Finished::Release,
            b'f' => Finished::Defer,
            b's' => Finished::Stale,
            _ => return None,
        })
    }
}

/// `ok`, or why a change to one task was refused.
impl Verdict for Result<(), Refused> {
    fn from_word(w: &str) -> Option<Self> {
        Some(match w {
            "ok" => Ok(()),
            "missing" => Err(Refused::Missing),
            "running" => Err(Refused::Running),
            "done" => Err(Refused::Done),
            "dead" => Err(Refused::Dead),
            "not_dead" => Err(Refused::NotDead),
            "other_plugin" => Err(Refused::OtherPlugin),
            "out_of_range" => Err(Refused::OutOfRange),
            _ => return None,
        })
    }
}

/// What a shard holds (for metrics and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardCounts {
    /// Tasks scheduled (in `due`, due or not).
    pub scheduled: u64,
    pub inflight: u64,
    pub dead: u64,
    /// Scheduled tasks due now or earlier (not yet claimed).
    pub due_now: u64,
}
