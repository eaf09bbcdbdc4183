//! The OpenAPI document (`GET /v1/openapi.json`) and the schemas of replies. The operations come
//! from each handler's `#[utoipa::path]`, and the router registers every route from that same
//! annotation (`utoipa_axum::routes!`), so the document can't drift from the routes. A request
//! body's schema is the type the handler reads it into (`task_spec::TaskSpec`,
//! `settings::PluginPatch`, …), and a batch's beside it (`task_spec::ScheduleBody`); here are
//! the shapes no one handler owns (the error body, a move's two forms, patterns the schemas of
//! several share). This module imports no handler, so every handler may import it.

use serde::Serialize;
use serde_json::Value;
use utoipa::openapi::{RefOr, ResponseBuilder, ResponsesBuilder};
use utoipa::{IntoResponses, ToSchema};

use super::fields::RateLimitBody;
use eggtimer_base::limits::{MAX_DURATION_MS, MAX_TIME_MS};

/// The error body of every 4xx and 5xx.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// snake_case, e.g. `bad_request`, `not_found`, `conflict`, `redis_unavailable`,
    /// `redis_full`.
    pub code: String,
    /// What is wrong, for a person.
    pub message: String,
}

/// The errors any route may answer (each with [`ErrorBody`]).
pub struct Errors;

impl IntoResponses for Errors {
    fn responses() -> std::collections::BTreeMap<String, RefOr<utoipa::openapi::Response>> {
        let mut b = ResponsesBuilder::new();
        for (code, what) in [
            ("400", "malformed input; the message names the field"),
            ("401", "missing, unknown or revoked bearer token or key"),
            (
                "403",
                "the key's role or plugins do not allow it (the message names the plugin), a Host that is not this runner's without --token, or a cross-site browser request (`forbidden`)",
            ),
            ("404", "no such task, plugin or route"),
            ("405", "the route does not take this method"),
            ("408", "the request took too long"),
            ("409", "conflict, e.g. the task is running"),
            ("413", "body or payload too large"),
            ("415", "wrong content type"),
            ("422", "well-formed but impossible, e.g. an unknown plugin"),
            (
                "429",
                "the tasks would pass their plugin's max_pending (`quota_exceeded`), an owner's max_pending_per_owner (`owner_quota_exceeded`) or their team's bytes of tasks (`task_budget`, `--team-task-bytes`): nothing was scheduled; or the events would pass their key's budget within the event retention (`event_budget`): nothing was published",
            ),
            ("500", "an internal error (details in the runner's log)"),
            (
                "503",
                "Redis unreachable; readyz: also Redis out of memory; with --min-replicas-acked, a write its replicas did not confirm in time (`not_replicated`)",
            ),
            (
                "507",
                "Redis out of memory (`redis_full`): nothing was written",
            ),
        ] {
            b = b.response(
                code,
                ResponseBuilder::new().description(what).content(
                    "application/json",
                    utoipa::openapi::ContentBuilder::new()
                        .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                            "ErrorBody",
                        ))))
                        .build(),
                ),
            );
        }
        b.build().into()
    }
}

/// A scheduled task's id and due time.
#[derive(Serialize, serde::Deserialize, ToSchema)]
pub struct ScheduledTask {
    pub id: String,
    pub run_at: i64,
    /// The event of its `on` that had already arrived within its lookback: the task was
    /// cancelled at once (`then: cancel`; reading it answers 404 from now on) or runs now with
    /// that event (`then: run`). Absent when no event was there yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub met: Option<MetEvent>,
}

/// An event a task met when it was scheduled, and what it did to the task.
#[derive(Serialize, serde::Deserialize, ToSchema)]
pub struct MetEvent {
    pub topic: String,
    pub key: String,
    pub then: eggtimer_store::Then,
}

/// What a dry run did (nothing of it applied).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct DryRunReply {
    pub id: String,
    pub plugin: String,
    /// The version that ran.
    pub version: u64,
    /// One of `{"done": true}`, `{"retry_after_ms"}`, `{"fail"}` (dead-lettered), `{"run_again_at"}`,
    /// `{"error"}` (a failed attempt: the handler's error, a trap, the time limit).
    #[schema(value_type = Object)]
    pub outcome: Value,
    pub took_ms: f64,
    /// What it logged and printed.
    pub log: Vec<eggtimer_store::LogLine>,
    /// What it would have done: `{"follow_ups": [{"id", "plugin", "payload", "run_at", "owner"}],
    /// "cancels": [id], "kv": [{"set", "value", "ttl_ms"} | {"delete"}], "events": [{"topic",
    /// "data"}], "http": [{"method", "url", "headers", "body"}]}` (requests recorded, not sent).
    #[schema(value_type = Object)]
    pub effects: Value,
}

/// A debounced task's id (its debounce key) and what the schedule did with it.
#[derive(Serialize, ToSchema)]
pub struct DebouncedTask {
    pub id: String,
    pub debounced: DebounceVerdict,
}

/// `new`: a new window, the task due in `quiet_ms`; `merged`: joined the waiting task, which moved;
/// `queued`: the task runs, so the payload waits for its next window.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DebounceVerdict {
    New,
    Merged,
    Queued,
}

/// The answer to a schedule: one, or an array in the order of the specs; a debounced schedule's
/// answers are `DebouncedTask`s.
#[derive(ToSchema, Serialize)]
#[serde(untagged)]
pub enum ScheduleReply {
    One(ScheduledTask),
    Many(Vec<ScheduledTask>),
    OneDebounced(DebouncedTask),
    ManyDebounced(Vec<DebouncedTask>),
}

/// Move a task: to a time, or by a signed shift.
#[derive(ToSchema, serde::Deserialize)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum MoveBody {
    At(MoveAt),
    By(MoveBy),
}

#[derive(ToSchema, serde::Deserialize)]
#[allow(dead_code)]
#[serde(deny_unknown_fields)]
pub struct MoveAt {
    #[schema(minimum = 0, maximum = 253402300799999_i64)]
    pub run_at: i64,
}

#[derive(ToSchema, serde::Deserialize)]
#[allow(dead_code)]
#[serde(deny_unknown_fields)]
pub struct MoveBy {
    #[schema(minimum = -315360000000_i64, maximum = 315360000000_i64)]
    pub shift_ms: i64,
}

#[derive(Serialize, ToSchema)]
pub struct Shifted {
    pub shifted: u64,
}

/// A page of dead tasks, most recently dead first.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct DeadPage {
    pub tasks: Vec<eggtimer_store::TaskRecord>,
    /// Pass back as `cursor` for the next page; null at the end.
    pub next_cursor: Option<String>,
}

/// A plugin binary: a WebAssembly component (raw bytes).
pub struct WasmBinary;

impl utoipa::PartialSchema for WasmBinary {
    fn schema() -> RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .format(Some(utoipa::openapi::schema::SchemaFormat::KnownFormat(
                utoipa::openapi::schema::KnownFormat::Binary,
            )))
            .into()
    }
}

impl ToSchema for WasmBinary {}

/// An uploaded plugin version.
#[derive(Serialize, ToSchema)]
pub struct Uploaded {
    pub name: String,
    pub version: u64,
    pub digest: String,
    /// Stored, not current (uploaded with `?promote=false`): `POST
    /// /v1/plugins/{name}/promote` makes it current.
    pub candidate: bool,
}

/// A plugin's current version with its settings, and its history, newest first.
#[derive(Serialize, ToSchema)]
pub struct PluginDetail {
    #[serde(flatten)]
    pub info: PluginInfo,
    /// Whether the current version checks payloads (exports `check`): tasks whose payload it
    /// refuses are not scheduled (422 `invalid_payload`). Null: not loaded on this runner yet.
    pub check: Option<bool>,
    /// The payloads it takes as a JSON Schema, where its SDK says (null: it does not, or it is
    /// not loaded on this runner yet).
    #[schema(value_type = Option<Object>)]
    pub payload_schema: Option<serde_json::Value>,
    /// Versions newest first, candidates included.
    pub history: Vec<eggtimer_base::plugin_settings::PluginEntry>,
}

/// A plugin's current version and its settings.
#[derive(Serialize, ToSchema)]
pub struct PluginInfo {
    pub name: String,
    pub version: u64,
    pub digest: String,
    pub size: u64,
    pub uploaded_at: i64,
    /// The id of the key that uploaded it (`admin` for the runner's token; absent for a plugin
    /// the runner seeded from its directory, or one uploaded before 0.2.0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uploaded_by: Option<String>,
    /// The version that was current before it: what `POST /v1/plugins/{name}/rollback` makes
    /// current again (absent for a first version, or one made current by 0.2.0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<u64>,
    pub paused: bool,
    pub max_concurrency: Option<u32>,
    /// At most this many runs of one owner's tasks at once across all runners (null: no limit).
    pub max_concurrency_per_owner: Option<u32>,
    /// At most `max` starts in any `per_ms` ms across all runners (null: no limit).
    #[schema(value_type = Option<RateLimitBody>)]
    pub rate_limit: Option<eggtimer_base::plugin_settings::RateLimit>,
    /// At most `max` starts of one owner's tasks in any `per_ms` ms across all runners (null: no
    /// limit).
    #[schema(value_type = Option<RateLimitBody>)]
    pub owner_rate_limit: Option<eggtimer_base::plugin_settings::RateLimit>,
    /// The plugin's share of workers when plugins compete, against the others' (default 1).
    pub weight: u32,
    /// Plugins whose tasks it may schedule and cancel besides its own (default none).
    #[schema(value_type = Vec<PluginPattern>)]
    pub may_schedule: Vec<String>,
    /// Its own time limit per run (ms); null: the runner's `--plugin-timeout`.
    pub time_limit_ms: Option<u64>,
    /// Its own memory cap per instance, all its memories together (bytes); null: the runner's
    /// `--plugin-memory`.
    pub memory_bytes: Option<u64>,
    /// Its own time limit per call of its payload `check` (ms); null: the runner's
    /// `--check-timeout`.
    pub check_time_limit_ms: Option<u64>,
    /// At most this many of its tasks scheduled, running or dead (default 1,000,000).
    pub max_pending: u64,
    /// At most this many of one owner's tasks of it scheduled, running or dead (null: no limit
    /// but `max_pending`).
    pub max_pending_per_owner: Option<u64>,
    /// Origins it may send HTTP requests to (default none).
    pub allowed_hosts: Vec<String>,
    /// Strings it reads with `config(name)`.
    pub config: std::collections::BTreeMap<String, String>,
    /// An admin's ceilings on its limits (`{}`: none); the limits above are the values that
    /// apply, each held under its ceiling.
    pub ceilings: eggtimer_base::plugin_settings::Ceilings,
}

/// A plugin pattern: a plugin name, a prefix ending in `*` (`order-*`), or `*` for every plugin.
#[derive(ToSchema, serde::Deserialize)]
#[schema(
    value_type = String,
    pattern = "^(\\*|[a-z0-9][a-z0-9-]{0,62}\\*|[a-z0-9][a-z0-9-]{0,63})$"
)]
#[allow(dead_code)]
pub struct PluginPattern(String);

/// A stream pattern: a Redis Stream's name, a prefix of one ending in `*`, or `*` (1 to 200
/// bytes without control characters).
#[derive(ToSchema)]
#[schema(value_type = String, min_length = 1, max_length = 200, pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$")]
#[allow(dead_code)]
pub struct StreamPattern(String);

/// A topic pattern: a topic, a prefix of one ending in `*`, or `*` for every topic.
#[derive(ToSchema)]
#[schema(value_type = String, pattern = "^(\\*|[a-z0-9._-]{1,64}\\*?)$")]
#[allow(dead_code)]
pub struct TopicPattern(String);

/// A plugin's config: up to 64 names (1 to 128 bytes, no control characters) to strings of up
/// to 4 KiB.
#[allow(dead_code)]
pub struct ConfigMap;

impl utoipa::PartialSchema for ConfigMap {
    fn schema() -> RefOr<utoipa::openapi::schema::Schema> {
        use super::fields::{MAX_CONFIG_NAME, MAX_CONFIG_NAMES, MAX_CONFIG_VALUE};
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        let name = ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(MAX_CONFIG_NAME))
            .pattern(Some("^[^\\u0000-\\u001f\\u007f-\\u009f]+$"));
        let value = ObjectBuilder::new()
            .schema_type(Type::String)
            .max_length(Some(MAX_CONFIG_VALUE));
        ObjectBuilder::new()
            .property_names(Some(name))
            .additional_properties(Some(value))
            .max_properties(Some(MAX_CONFIG_NAMES))
            .description(Some(
                "Strings a plugin reads with `config(name)`: names (1 to 128 bytes, no control \
                 characters) to values (up to 4 KiB), at most 64; null or {}: none. Replaces the \
                 whole map.",
            ))
            .into()
    }
}

impl ToSchema for ConfigMap {}

/// A cron expression, as the schema's pattern admits it (`recurring::cron_pattern`).
#[allow(dead_code)]
pub struct CronExpr;

impl utoipa::PartialSchema for CronExpr {
    fn schema() -> RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(crate::recurring::cron_pattern()))
            .description(Some(
                "5 fields: minute hour day-of-month month day-of-week. Each field: `*`, a number \
                 in its range, a range `a-b` (a range whose start is past its end wraps around: \
                 hours `22-2` are 22, 23, 0, 1, 2), a step (`*/15`, `0-30/10`), a month or day \
                 name, `?` in the day fields, or a list of those. `L`, `W` and `#` (last day, \
                 nearest weekday, nth weekday) and ranges of names are taken too.",
            ))
            .into()
    }
}

impl ToSchema for CronExpr {}

/// An origin a plugin may call: `http(s)://host[:port]`, the host a name (its labels 1 to 63 of
/// `A-Z a-z 0-9 _ -`, the first maybe `*`) or an IPv6 address in brackets (an IPv4 address is a
/// name of digits). The server takes every origin this pattern admits (a test generates them from
/// it), and a few more forms of IPv6 (with an IPv4 address inside) that it does not describe.
#[derive(ToSchema, serde::Deserialize)]
#[schema(
    value_type = String,
    pattern = "^[Hh][Tt][Tt][Pp][Ss]?://((\\*\\.)?[A-Za-z0-9_-]{1,63}(\\.[A-Za-z0-9_-]{1,63})*|\\[(([0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}|([0-9A-Fa-f]{1,4}:){1,7}:|([0-9A-Fa-f]{1,4}:){1,6}:[0-9A-Fa-f]{1,4}|([0-9A-Fa-f]{1,4}:){1,5}(:[0-9A-Fa-f]{1,4}){1,2}|([0-9A-Fa-f]{1,4}:){1,4}(:[0-9A-Fa-f]{1,4}){1,3}|([0-9A-Fa-f]{1,4}:){1,3}(:[0-9A-Fa-f]{1,4}){1,4}|([0-9A-Fa-f]{1,4}:){1,2}(:[0-9A-Fa-f]{1,4}){1,5}|[0-9A-Fa-f]{1,4}:(:[0-9A-Fa-f]{1,4}){1,6}|:((:[0-9A-Fa-f]{1,4}){1,7}|:))\\])(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?$",
    max_length = 268
)]
#[allow(dead_code)]
pub struct AllowedOrigin(String);

/// A page of found tasks.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct TaskPage {
    pub tasks: Vec<eggtimer_store::TaskRecord>,
    /// Pass back as `cursor` for the next page; null at the end (a page may be short before it).
    pub next_cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Cancelled {
    pub cancelled: u64,
}

#[derive(Serialize, ToSchema)]
pub struct Retried {
    pub retried: u64,
}

#[derive(Serialize, ToSchema)]
pub struct Dropped {
    pub dropped: u64,
}

/// A schedule's id and when it fires next (null: never, or paused).
#[derive(Serialize, ToSchema)]
pub struct SchedulePutReply {
    pub id: String,
    pub next_run_at: Option<i64>,
}

/// A recurring schedule; `upcoming` (its next 5 fire times) only for one schedule.
#[derive(Serialize, ToSchema)]
pub struct ScheduleInfo {
    pub id: String,
    pub plugin: String,
    pub payload: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<i64>,
    pub tz: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_at: Option<i64>,
    pub max_attempts: u32,
    pub overlap: crate::recurring::Overlap,
    /// Its firings' priority (absent: 0).
    #[serde(skip_serializing_if = "is_zero_priority")]
    #[schema(minimum = 0, maximum = 9)]
    pub priority: u8,
    pub paused: bool,
    pub next_run_at: Option<i64>,
    /// The task id of its latest firing.
    pub last_task_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upcoming: Option<Vec<i64>>,
}

/// `{"ok": true}`.
#[derive(Serialize, ToSchema)]
pub struct Ok {
    pub ok: bool,
}

// the bounds in the schemas are the limits module's
const _: () = assert!(MAX_TIME_MS == 253402300799999 && MAX_DURATION_MS == 315360000000);
const _: () = assert!(eggtimer_base::limits::MAX_ATTEMPTS == 1000);
const _: () = assert!(super::fields::MAX_WEIGHT == 1000);
const _: () =
    assert!(super::fields::MAX_RATE == 1000000 && super::fields::MAX_RATE_WINDOW_MS == 86400000);
const _: () = assert!(super::fields::MAX_TIME_LIMIT_MS == 3600000);
const _: () = assert!(
    eggtimer_store::MAX_MAX_PENDING == 1000000000
        && eggtimer_base::plugin_settings::DEFAULT_MAX_PENDING == 1000000
);
const _: () = assert!(
    super::fields::MIN_MEMORY_BYTES == 1048576
        && crate::plugins::MAX_MEMORY_BYTES == 4294967296_usize
);

fn is_zero_priority(p: &u8) -> bool {
    *p == 0
}
