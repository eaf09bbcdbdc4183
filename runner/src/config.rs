//! Configuration: the only reader of command-line flags and `EGGTIMER_*` environment variables.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod commands;
mod task_commands;
pub use commands::{EventCmd, KeyCmd, PluginCmd, RemoteArgs, SecretCmd, SourceCmd};
pub use task_commands::{DeadCmd, OwnerCmd, ScheduleCmd, TaskCmd};

/// eggtimer: a durable, millisecond-precise delayed-task runner with WebAssembly plugins.
#[derive(Parser, Debug)]
#[command(
    name = "eggtimer",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Flags of `serve` (the default command).
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the runner: admin API, pollers, executor (the default).
    Serve(Box<ServeArgs>),
    /// Compile a plugin from stdin to stdout: what the runner starts to compile a plugin in a
    /// child process bounded in time and memory.
    #[command(hide = true)]
    CompilePlugin,
    /// Manage plugins on a running eggtimer over its HTTP API.
    Plugin {
        #[command(flatten)]
        remote: RemoteArgs,
        #[command(subcommand)]
        cmd: PluginCmd,
    },
    /// Manage tasks on a running eggtimer over its HTTP API.
    Task {
        #[command(flatten)]
        remote: RemoteArgs,
        #[command(subcommand)]
        cmd: TaskCmd,
    },
    /// Act on all tasks of an owner.
    Owner {
        #[command(flatten)]
        remote: RemoteArgs,
        #[command(subcommand)]
        cmd: OwnerCmd,
    },
    /// Recurring schedules.
    Schedule {
        #[command(flatten)]
        remote: RemoteArgs,
        #[command(subcommand)]
        cmd: ScheduleCmd,
    },
    /// Events: publish one, or read a topic's latest.
    Event {
        #[command(flatten)]
        remote: RemoteArgs,
        #[command(subcommand)]
        cmd: EventCmd,
    },
    /// Sources: Redis Streams read into events.
    Source {
        #[command(flatten)]
        remote: RemoteArgs,
        #[command(subcommand)]
        cmd: SourceCmd,
    },
    /// The dead-letter set.
    Dead {
        #[command(flatten)]
        remote: RemoteArgs,
        #[command(subcommand)]
        cmd: DeadCmd,
    },
    /// The live runners of the namespace, with the shards each polls.
    Runners {
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// API keys for teams (admin only): each with a role and the plugins it may act on.
    Key {
        #[command(flatten)]
        remote: RemoteArgs,
        #[command(subcommand)]
        cmd: KeyCmd,
    },
    /// The audit: who changed what, and what was refused, newest first.
    Audit {
        #[command(flatten)]
        remote: RemoteArgs,
        /// Only this key's entries (its name or id).
        #[arg(long)]
        key: Option<String>,
        /// Only entries concerning this plugin.
        #[arg(long)]
        plugin: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

/// Flags of `eggtimer serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address of the HTTP API.
    #[arg(long, env = "EGGTIMER_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Redis URL: redis://host:port, redis+sentinel://[:password@]host:port[,host:port...]/<master>
    /// (Sentinels, followed through failovers), or redis+cluster://host:port,host:port. None:
    /// start a private redis-server with append-only persistence under --data-dir.
    #[arg(long, env = "EGGTIMER_REDIS", hide_env_values = true)]
    pub redis: Option<String>,
    /// Data directory of the private redis-server.
    #[arg(long, env = "EGGTIMER_DATA_DIR", default_value = "./eggtimer-data")]
    pub data_dir: PathBuf,
    /// fsync policy of the private redis-server's append-only file (always | everysec).
    #[arg(long, env = "EGGTIMER_REDIS_FSYNC", default_value = "everysec")]
    pub redis_fsync: String,
    /// Namespace: runners with the same namespace share tasks and plugins.
    #[arg(long, env = "EGGTIMER_NAMESPACE", default_value = "eggtimer")]
    pub namespace: String,
    /// Number of shards (fixed per namespace once chosen).
    #[arg(long, env = "EGGTIMER_SHARDS", default_value_t = 16)]
    pub shards: u32,
    /// Load every *.wasm in this directory at start (file stem = plugin name).
    #[arg(long, env = "EGGTIMER_PLUGINS_DIR")]
    pub plugins_dir: Option<PathBuf>,
    /// The admin key: a bearer token that opens every /v1 route (and makes keys for teams).
    /// Without it the API is open, to requests for its own address or localhost only.
    #[arg(long, env = "EGGTIMER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How long the audit of the API's changes and refusals is kept.
    #[arg(long, env = "EGGTIMER_AUDIT_RETENTION", default_value = "90d", value_parser = parse_duration)]
    pub audit_retention: Duration,
    /// The most entries each of the audit's streams (changes, refusals) keeps, whatever their
    /// age (a flood of refused requests can't fill Redis, nor push a change out).
    #[arg(long, env = "EGGTIMER_AUDIT_MAX_LEN", default_value_t = 1_000_000)]
    pub audit_max_len: u64,
    /// A bearer token /metrics asks for (none: the admin's --token when there is one, else
    /// /metrics is open).
    #[arg(long, env = "EGGTIMER_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// How long done tasks stay readable.
    #[arg(long, env = "EGGTIMER_KEEP_DONE", default_value = "10m", value_parser = parse_duration)]
    pub keep_done: Duration,
    /// Replicas that must have every write the API acknowledges before it answers (Redis
    /// `WAIT`); when fewer confirm within --replica-ack-timeout the answer is 503 `not_replicated`.
    /// 0: answer once the master has it. (Not on Redis Cluster yet.)
    #[arg(long, env = "EGGTIMER_MIN_REPLICAS_ACKED", default_value_t = 0)]
    pub min_replicas_acked: u32,
    /// How long the API waits for --min-replicas-acked replicas.
    #[arg(long, env = "EGGTIMER_REPLICA_ACK_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub replica_ack_timeout: Duration,
    /// How long dead tasks are kept; older ones are dropped.
    #[arg(long, env = "EGGTIMER_KEEP_DEAD", default_value = "30d", value_parser = parse_duration)]
    pub keep_dead: Duration,
    /// Versions of each plugin kept (rollback reaches them); older ones and their bytes are
    /// dropped when a new one is uploaded.
    #[arg(long, env = "EGGTIMER_KEEP_VERSIONS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub keep_versions: u32,
    /// Most entries an event stream (one plugin's of one topic) keeps (older ones are trimmed as
    /// new ones arrive, `XADD MAXLEN ~`).
    #[arg(long, env = "EGGTIMER_EVENTS_MAX_LEN", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub events_max_len: u64,
    /// Most topics one plugin writes events to (a run that would write a new one past it fails
    /// its attempt, nothing of its effects written).
    #[arg(long, env = "EGGTIMER_MAX_TOPICS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_topics: u64,
    /// Most kv keys one plugin keeps (a run whose writes would add one past it fails its attempt,
    /// nothing of its effects written; keys whose TTL has passed don't count).
    #[arg(long, env = "EGGTIMER_KV_MAX_KEYS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub kv_max_keys: u64,
    /// Most bytes of kv keys and values one plugin keeps (the same way).
    #[arg(long, env = "EGGTIMER_KV_MAX_BYTES", default_value_t = 64 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub kv_max_bytes: u64,
    /// A failpoint to abort at (tests only: see `failpoint.rs`).
    #[arg(long, env = "EGGTIMER_FAILPOINT", hide = true)]
    pub failpoint: Option<String>,
    /// How long an event is kept for the tasks scheduled after it: the longest `lookback_ms` a
    /// task may ask for.
    #[arg(long, env = "EGGTIMER_EVENT_RETENTION", default_value = "60s", value_parser = parse_duration)]
    pub event_retention: Duration,
    /// Most bytes of events one key (the admin token too) may publish within the event retention:
    /// what Redis keeps of them for tasks' lookback. Past it a publish is 429 `event_budget`.
    #[arg(long, env = "EGGTIMER_EVENTS_MAX_BYTES", default_value_t = 16 * 1024 * 1024, value_parser = parse_memory)]
    pub events_max_bytes: usize,
    /// Most bytes of tasks the plugins of one team (the key that uploaded them; a plugin loaded
    /// from the plugins directory is a team of its own) make Redis hold: payloads, listeners and
    /// debounced payloads of scheduled, running, dead and kept done tasks. Past it scheduling is
    /// 429 `task_budget`.
    #[arg(long, env = "EGGTIMER_TEAM_TASK_BYTES", default_value_t = 64 * 1024 * 1024, value_parser = parse_budget)]
    pub team_task_bytes: usize,
    /// Most bytes one plugin's emitted streams hold together (entries' fields and values): a
    /// stream a run writes drops its oldest entries to make room, as it does past
    /// `--events-max-len` entries.
    #[arg(long, env = "EGGTIMER_EMITTED_MAX_BYTES", default_value_t = 64 * 1024 * 1024, value_parser = parse_budget)]
    pub emitted_max_bytes: usize,
    /// Most bytes of kv keys and values the plugins of one team (the key that uploaded them)
    /// keep together: a run whose writes would pass it fails its attempt, nothing of its effects
    /// written, as past `--kv-max-bytes`.
    #[arg(long, env = "EGGTIMER_TEAM_KV_BYTES", default_value_t = 64 * 1024 * 1024, value_parser = parse_budget)]
    pub team_kv_bytes: usize,
    /// Most bytes the emitted streams of one team's plugins hold together: a stream a run
    /// writes drops its oldest entries to make room, as past `--emitted-max-bytes`.
    #[arg(long, env = "EGGTIMER_TEAM_EMITTED_BYTES", default_value_t = 64 * 1024 * 1024, value_parser = parse_budget)]
    pub team_emitted_bytes: usize,
    /// Largest task payload (bytes).
    #[arg(long, env = "EGGTIMER_MAX_PAYLOAD_BYTES", default_value_t = 64 * 1024)]
    pub max_payload_bytes: usize,
    /// Largest plugin binary (bytes); 64 MiB fits a Python plugin (componentize-py, ~19 MB)
    /// with room to spare.
    #[arg(long, env = "EGGTIMER_MAX_PLUGIN_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_plugin_bytes: usize,
    /// Lease of a claimed task, renewed every third of it while the runner holds the task: a
    /// task whose runner died runs again about this long after it stopped renewing.
    #[arg(long, env = "EGGTIMER_LEASE", default_value = "5s", value_parser = parse_duration)]
    pub lease: Duration,
    /// Lease of a shard: a runner that dies has its shards taken over after this.
    #[arg(long, env = "EGGTIMER_SHARD_LEASE", default_value = "5s", value_parser = parse_duration)]
    pub shard_lease: Duration,
    /// Longest a poller sleeps without asking Redis (covers a lost wake-up).
    #[arg(long, env = "EGGTIMER_FALLBACK_POLL", default_value = "2s", value_parser = parse_duration)]
    pub fallback_poll: Duration,
    /// Plugin calls at once (a call waiting in a WASI sleep holds one, not a thread).
    #[arg(long, env = "EGGTIMER_WORKERS", default_value_t = 32)]
    pub workers: usize,
    /// Threads of the engine: Redis I/O, the shard pollers, lease renewal and recording outcomes
    /// (plugin calls run on one thread per core, the HTTP API on its own threads). One is
    /// fastest with Redis on the same machine (BENCHMARKS.md); more may pay
    /// with many Redis Cluster masters on a large machine.
    #[arg(long, env = "EGGTIMER_ENGINE_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub engine_threads: u16,
    /// Most tasks claimed beyond the free workers. The prefetch adapts below this to what the
    /// workers will start within ~20 ms at the recent run time: deep for fast handlers, none for
    /// slow ones.
    #[arg(long, env = "EGGTIMER_PREFETCH", default_value_t = 1024)]
    pub prefetch: usize,
    /// Most tasks one claim takes.
    #[arg(long, env = "EGGTIMER_CLAIM_BATCH", default_value_t = 256)]
    pub claim_batch: usize,
    /// Under a steady stream, a claim also takes the tasks falling due within up to this long
    /// (enough for about 48 a claim, measured per shard) and each starts at its due time; a
    /// cancel or move of one before it starts takes it back from its runner (a revocation; 409
    /// once it started). 0s: claim only what is due. At most 1s.
    #[arg(long, env = "EGGTIMER_CLAIM_AHEAD", default_value = "60ms", value_parser = parse_claim_ahead)]
    pub claim_ahead: Duration,
    /// A task due for this long (ms) and not started counts as the highest priority (9), so a
    /// stream of higher-priority tasks never starves it.
    #[arg(long, env = "EGGTIMER_PRIORITY_AGING_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..=31_536_000_000))]
    pub priority_aging_ms: u64,
    /// Tasks due this far ahead or later are kept packed in the far tier (about a third of the
    /// memory of a waiting task) and move into the live tier half this long before they fall due.
    /// 0s: no far tier (far tasks written before move back, within a minute). At least 10s; an
    /// hour or more is what it is for. Give every runner of a namespace the same horizon, once
    /// all run this version.
    #[arg(long, env = "EGGTIMER_FAR_HORIZON", default_value = "0s", value_parser = parse_far_horizon)]
    pub far_horizon: Duration,
    /// First retry delay of a failed task (doubles per attempt, with jitter).
    #[arg(long, env = "EGGTIMER_RETRY_BASE", default_value = "1s", value_parser = parse_duration)]
    pub retry_base: Duration,
    /// Longest retry delay.
    #[arg(long, env = "EGGTIMER_RETRY_CAP", default_value = "1h", value_parser = parse_duration)]
    pub retry_cap: Duration,
    /// Time limit of one plugin call.
    #[arg(long, env = "EGGTIMER_PLUGIN_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub plugin_timeout: Duration,
    /// The most a plugin's own `time_limit_ms` may be, unless an admin sets it.
    #[arg(long, env = "EGGTIMER_MAX_PLUGIN_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub max_plugin_timeout: Duration,
    /// Time limit of one call of a plugin's payload `check` (and `payload-schema`), apart from
    /// its runs': a check holds one of the runner's four check slots while it runs.
    #[arg(long, env = "EGGTIMER_CHECK_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub check_timeout: Duration,
    /// The most a plugin's own `check_time_limit_ms` may be, unless an admin sets it.
    #[arg(long, env = "EGGTIMER_MAX_CHECK_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub max_check_timeout: Duration,
    /// Memory cap of one plugin instance, all its memories together (bytes); a plugin's own
    /// `memory_bytes` replaces it for that plugin.
    #[arg(long, env = "EGGTIMER_PLUGIN_MEMORY", default_value_t = 64 * 1024 * 1024, value_parser = parse_memory)]
    pub plugin_memory: usize,
    /// The most a plugin's own `memory_bytes` may be, unless an admin sets it (bytes).
    #[arg(long, env = "EGGTIMER_MAX_PLUGIN_MEMORY", default_value_t = 512 * 1024 * 1024, value_parser = parse_memory)]
    pub max_plugin_memory: usize,
    /// Budget of one run: bytes of kv writes, events, log lines and follow-up payloads together.
    #[arg(long, env = "EGGTIMER_MAX_EFFECT_BYTES", default_value_t = 1024 * 1024)]
    pub max_effect_bytes: usize,
    /// Budget of one run: follow-up tasks.
    #[arg(long, env = "EGGTIMER_MAX_FOLLOW_UPS", default_value_t = 100)]
    pub max_follow_ups: usize,
    /// Budget of one run: cancels.
    #[arg(long, env = "EGGTIMER_MAX_CANCELS", default_value_t = 100)]
    pub max_cancels: usize,
    /// Budget of one run: outbound HTTP requests.
    #[arg(long, env = "EGGTIMER_MAX_HTTP_REQUESTS", default_value_t = 20)]
    pub max_http_requests: usize,
    /// Extra CA certificates (PEM) plugins' HTTPS requests trust besides the Web PKI roots.
    #[arg(long, env = "EGGTIMER_HTTP_CA_FILE")]
    pub http_ca_file: Option<PathBuf>,
    /// The key plugins' secrets are sealed with: a file of 64 hex digits, mode 0600 (default,
    /// with the private redis-server: <data-dir>/secrets.key, made when missing).
    #[arg(long, env = "EGGTIMER_SECRETS_KEY_FILE")]
    pub secrets_key_file: Option<PathBuf>,
    /// Idle plugin instances kept for reuse, over all plugins (least recently used evicted).
    #[arg(long, env = "EGGTIMER_WARM_INSTANCES", default_value_t = 64)]
    pub warm_instances: usize,
    /// Directory of the compiled-plugin cache (default: <data-dir>/plugin-cache).
    #[arg(long, env = "EGGTIMER_PLUGIN_CACHE")]
    pub plugin_cache: Option<PathBuf>,
    /// How long a compiled plugin in the cache that no runner loads is kept (files of another
    /// eggtimer or wasmtime build go at once); the cache is cleaned at start and hourly.
    #[arg(long, env = "EGGTIMER_PLUGIN_CACHE_KEEP", default_value = "7days", value_parser = parse_duration)]
    pub plugin_cache_keep: Duration,
    /// How long compiling one plugin (an upload, or a version not in the compiled-code cache) may
    /// take; past it the compile is stopped and the upload refused. Compiles run one at a time,
    /// each in a child process.
    #[arg(long, env = "EGGTIMER_PLUGIN_COMPILE_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub plugin_compile_timeout: Duration,
    /// Memory compiling one plugin may use (bytes); past it the compile is stopped and the upload
    /// refused.
    #[arg(long, env = "EGGTIMER_PLUGIN_COMPILE_MEMORY", default_value_t = 4 << 30, value_parser = parse_memory)]
    pub plugin_compile_memory: usize,
    /// How long a graceful shutdown waits for running tasks.
    #[arg(long, env = "EGGTIMER_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Open HTTP connections at once (more wait to be accepted).
    #[arg(long, env = "EGGTIMER_HTTP_MAX_CONNECTIONS", default_value_t = 1024)]
    pub http_max_connections: usize,
    /// Time a client has to send a request's headers.
    #[arg(long, env = "EGGTIMER_HTTP_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub http_header_timeout: Duration,
    /// Time a client has to send a request's body.
    #[arg(long, env = "EGGTIMER_HTTP_BODY_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub http_body_timeout: Duration,
    /// Time a whole request may take (408 after it).
    #[arg(long, env = "EGGTIMER_HTTP_REQUEST_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub http_request_timeout: Duration,
    /// Time a connection (HTTP/1 or HTTP/2) may stay open with no byte read or written (at least
    /// the request timeout and 2 s more).
    #[arg(long, env = "EGGTIMER_HTTP_IDLE_TIMEOUT", default_value = "90s", value_parser = parse_duration)]
    pub http_idle_timeout: Duration,
    /// Tests only: skew this runner's own clock by this many ms.
    #[arg(
        long,
        env = "EGGTIMER_TEST_CLOCK_SKEW_MS",
        hide = true,
        default_value_t = 0,
        allow_hyphen_values = true
    )]
    pub test_clock_skew_ms: i64,
    /// Log filter (tracing EnvFilter syntax), e.g. info or eggtimer=debug.
    #[arg(long, env = "EGGTIMER_LOG", default_value = "info")]
    pub log: String,
    /// Export task spans over OTLP/HTTP (protobuf) to this collector, e.g. http://127.0.0.1:4318
    /// (`/v1/traces` is added unless the URL ends with it). Batching follows the OTEL_BSP_*
    /// environment variables.
    #[arg(long, env = "EGGTIMER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// Parses `250ms`, `30s`, `10m`, `2h` (humantime).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 250ms, 30s, 10m or 2h: {e}"))
}

/// Parses `--claim-ahead`: a duration of at most a second.
fn parse_claim_ahead(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > Duration::from_secs(1) {
        return Err(format!(
            "{s:?} is too far ahead: a task claimed ahead counts as running until it starts, so at most 1s"
        ));
    }
    Ok(d)
}

/// Parses `--far-horizon`: 0s (off), or at least 10 seconds (far tasks move into the live tier
/// half a horizon ahead, checked once a second), at most a year.
fn parse_far_horizon(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !d.is_zero() && d < Duration::from_secs(10) {
        return Err(format!(
            "{s:?} is too near: far tasks move into the live tier half a horizon ahead, checked once a second, so at least 10s (or 0s: no far tier)"
        ));
    }
    if d > Duration::from_secs(366 * 86_400) {
        return Err(format!(
            "{s:?} is more than a year: no task would ever go far"
        ));
    }
    Ok(d)
}

/// Parses a rate limit `N/DURATION` (`10/1s`, `600/1m`) → (N, ms).
pub fn parse_rate(s: &str) -> Result<(u32, u64), String> {
    let bad = || format!("{s:?} is not a rate like 10/1s (at most 10 starts in any second)");
    let (n, per) = s.split_once('/').ok_or_else(bad)?;
    let n: u32 = n.trim().parse().map_err(|_| bad())?;
    let per = parse_duration(per.trim())?.as_millis() as u64;
    if n == 0 || per == 0 {
        return Err(bad());
    }
    Ok((n, per))
}

/// Parses a plugin memory cap in bytes: 1 MiB to 4 GiB (a 32-bit wasm memory's whole space).
pub fn parse_memory(s: &str) -> Result<usize, String> {
    let max = crate::plugins::MAX_MEMORY_BYTES;
    match s.parse::<usize>() {
        Ok(n) if ((1 << 20)..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of bytes from 1048576 (1 MiB) to {max} (4 GiB)"
        )),
    }
}

/// Parses a budget of Redis memory: bytes, from 1 MiB to 1 TiB.
pub fn parse_budget(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if ((1 << 20)..=(1 << 40)).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of bytes from 1048576 (1 MiB) to 1099511627776 (1 TiB)"
        )),
    }
}

/// Parses a signed duration: `-2h`, `+30m`, `90s` → ms.
pub fn parse_signed_ms(s: &str) -> Result<i64, String> {
    let (neg, rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let d = parse_duration(rest)?.as_millis();
    let d = i64::try_from(d)
        .ok()
        .filter(|d| *d <= eggtimer_base::limits::MAX_DURATION_MS)
        .ok_or_else(|| format!("{s:?} is longer than 10 years"))?;
    Ok(if neg { -d } else { d })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_durations_are_bounded() {
        assert!(
            parse_signed_ms("3650000d")
                .unwrap_err()
                .contains("longer than 10 years")
        );
        assert!(parse_signed_ms("-9999999999999999ms").is_err());
    }

    #[test]
    fn signed_durations() {
        assert_eq!(parse_signed_ms("-2h").unwrap(), -7_200_000);
        assert_eq!(parse_signed_ms("+30m").unwrap(), 1_800_000);
        assert_eq!(parse_signed_ms("500ms").unwrap(), 500);
        assert!(parse_signed_ms("soon").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_parse() {
        let cli = Cli::try_parse_from(["eggtimer"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.shards, 16);
        assert_eq!(cli.serve.keep_done, Duration::from_secs(600));
        assert_eq!(cli.serve.engine_threads, 1);
    }

    #[test]
    fn engine_threads_are_bounded() {
        let cli = Cli::try_parse_from(["eggtimer", "--engine-threads", "4"]).unwrap();
        assert_eq!(cli.serve.engine_threads, 4);
        for bad in ["0", "257", "-1"] {
            let err = Cli::try_parse_from(["eggtimer", &format!("--engine-threads={bad}")])
                .unwrap_err()
                .to_string();
            assert!(err.contains("--engine-threads"), "{bad}: {err}");
        }
    }
}
