//! The client commands' arguments (`eggtimer plugin|key|event|source ...`) and where they send
//! their requests (`RemoteArgs`); the commands on tasks are in `task_commands.rs`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::{parse_duration, parse_memory, parse_rate};

#[derive(Subcommand, Debug)]
pub enum KeyCmd {
    /// Make a key; its secret is printed once (Redis keeps only a hash of it).
    Create {
        /// Who holds it: a team, a service.
        name: String,
        /// reader | operator | developer | admin.
        #[arg(long)]
        role: String,
        /// Plugin patterns, comma-separated: names, prefixes ending in `*`, or `*` for all.
        #[arg(long, value_delimiter = ',', required = true)]
        plugins: Vec<String>,
        /// Most plugins its patterns may hold (it uploads no new plugin past it).
        #[arg(long)]
        max_plugins: Option<u32>,
        /// Most tasks its plugins may hold together (each new plugin gets its share as the
        /// ceiling of its own max_pending).
        #[arg(long)]
        max_pending: Option<u64>,
        /// Most bytes of tasks its plugins may make Redis hold together (default: the runner's
        /// --team-task-bytes).
        #[arg(long)]
        task_bytes: Option<u64>,
        /// Most bytes of events it may publish within the event retention (default: the
        /// runner's --events-max-bytes).
        #[arg(long)]
        event_bytes: Option<u64>,
        /// Most bytes of kv keys and values its plugins' runs may keep together (default: the
        /// runner's --team-kv-bytes).
        #[arg(long)]
        kv_bytes: Option<u64>,
        /// Most bytes of entries its plugins' emitted event streams may hold together (default:
        /// the runner's --team-emitted-bytes).
        #[arg(long)]
        emitted_bytes: Option<u64>,
        /// Topic patterns it may publish events to, comma-separated.
        #[arg(long, value_delimiter = ',')]
        publish: Vec<String>,
        /// Topic patterns its tasks may listen on, comma-separated.
        #[arg(long, value_delimiter = ',')]
        listen: Vec<String>,
        /// Redis Streams of the team's own it may read through a source, comma-separated:
        /// names, prefixes ending in `*`, or `*`.
        #[arg(long, value_delimiter = ',')]
        streams: Vec<String>,
    },
    /// List the keys (without secrets), with when each was last used.
    List,
    /// Change a key: what is given replaces the key's own, the rest stays (its secret too).
    /// Every runner takes the change within a second.
    Update {
        id: String,
        /// Who holds it.
        #[arg(long)]
        name: Option<String>,
        /// reader | operator | developer | admin.
        #[arg(long)]
        role: Option<String>,
        /// Plugin patterns, comma-separated (they replace the key's).
        #[arg(long, value_delimiter = ',')]
        plugins: Option<Vec<String>>,
        /// Most plugins its patterns may hold, or `none`.
        #[arg(long, value_name = "N|none")]
        max_plugins: Option<String>,
        /// Most tasks its plugins may hold together, or `none` (it shares out among the plugins
        /// the key uploads from now on).
        #[arg(long, value_name = "N|none")]
        max_pending: Option<String>,
        /// Most bytes of tasks its plugins may make Redis hold together, or `none` (the
        /// runner's --team-task-bytes).
        #[arg(long, value_name = "N|none")]
        task_bytes: Option<String>,
        /// Most bytes of events it may publish within the event retention, or `none` (the
        /// runner's --events-max-bytes).
        #[arg(long, value_name = "N|none")]
        event_bytes: Option<String>,
        /// Most bytes of kv keys and values its plugins' runs may keep together, or `none` (the
        /// runner's --team-kv-bytes).
        #[arg(long, value_name = "N|none")]
        kv_bytes: Option<String>,
        /// Most bytes of entries its plugins' emitted event streams may hold together, or
        /// `none` (the runner's --team-emitted-bytes).
        #[arg(long, value_name = "N|none")]
        emitted_bytes: Option<String>,
        /// Topic patterns it may publish to, comma-separated (`''`: none).
        #[arg(long, value_delimiter = ',')]
        publish: Option<Vec<String>>,
        /// Topic patterns its tasks may listen on, comma-separated (`''`: none).
        #[arg(long, value_delimiter = ',')]
        listen: Option<Vec<String>>,
        /// Redis Stream patterns it may read through a source, comma-separated (`''`: none).
        #[arg(long, value_delimiter = ',')]
        streams: Option<Vec<String>>,
    },
    /// Revoke a key: every runner refuses it within a second.
    Revoke { id: String },
}

#[derive(Subcommand, Debug)]
pub enum EventCmd {
    /// Publish an event: the tasks listening on TOPIC with KEY are cancelled or run now.
    Send {
        topic: String,
        key: String,
        /// The event's data (JSON).
        #[arg(long, default_value = "null")]
        data: String,
    },
    /// The latest events plugins emitted on a topic, newest first.
    List {
        topic: String,
        /// Only this plugin's.
        #[arg(long)]
        plugin: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
}

#[derive(Subcommand, Debug)]
pub enum SourceCmd {
    /// Read a Redis Stream into events: each new entry is an event of TOPIC (the source's name
    /// unless --topic says), keyed by the value of its field --key-field, its fields the data.
    /// With --plugin instead of --stream: the events that plugin emits (to --emitted, default
    /// TOPIC), keyed by the member --key-field of what it emitted.
    Add {
        name: String,
        #[arg(long, required_unless_present = "plugin", conflicts_with = "plugin")]
        stream: Option<String>,
        #[arg(long)]
        plugin: Option<String>,
        #[arg(long, requires = "plugin")]
        emitted: Option<String>,
        #[arg(long)]
        key_field: String,
        #[arg(long)]
        topic: Option<String>,
    },
    /// The sources.
    List,
    /// Stop reading a source (its stream stays).
    Remove { name: String },
}

/// Where the runner's API is.
#[derive(Args, Debug, Clone)]
pub struct RemoteArgs {
    /// Base URL of the runner's HTTP API.
    #[arg(
        long,
        global = true,
        env = "EGGTIMER_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,
    /// Bearer token. A token on the command line shows in `ps`: prefer `EGGTIMER_TOKEN` or
    /// `--token-file`.
    #[arg(long, global = true, env = "EGGTIMER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the bearer token (its first line), read when no token is given.
    #[arg(long, global = true, env = "EGGTIMER_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Print the API's JSON reply instead of a table (lists and single tasks print tables).
    #[arg(long, global = true)]
    pub json: bool,
}

impl RemoteArgs {
    /// The bearer token: `--token` / `EGGTIMER_TOKEN`, else the first line of `--token-file`.
    pub fn bearer(&self) -> anyhow::Result<Option<String>> {
        if self.token.is_some() {
            return Ok(self.token.clone());
        }
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading the token file {}: {e}", path.display()))?;
        match text.lines().next().map(str::trim).filter(|t| !t.is_empty()) {
            Some(t) => Ok(Some(t.to_owned())),
            None => anyhow::bail!("the token file {} is empty", path.display()),
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum PluginCmd {
    /// Upload a plugin (a .wasm component). A version that checks payloads becomes current only
    /// if it can read every task waiting for the plugin: otherwise it is kept as a candidate and
    /// the tasks it refuses are listed.
    Push {
        name: String,
        file: PathBuf,
        /// Keep it as a candidate, not current (`plugin promote` makes it current).
        #[arg(long)]
        candidate: bool,
        /// Make it current even if its check refuses waiting tasks (audited).
        #[arg(long)]
        force: bool,
    },
    /// Make a stored version (a candidate) current, through the same check as a push.
    Promote {
        name: String,
        version: u64,
        /// Even if its check refuses waiting tasks (audited).
        #[arg(long)]
        force: bool,
    },
    /// List plugins with their current versions.
    List,
    /// Show a plugin and its history.
    Get { name: String },
    /// Make current again the version that was current before this one (two rollbacks come
    /// back); the answer's `previous` names the version left.
    Rollback { name: String },
    /// The versions kept, newest first: which is current, which a rollback would make current,
    /// which are candidates.
    History { name: String },
    /// Delete a plugin (refused while it has scheduled or dead tasks, unless --cancel-tasks).
    Delete {
        name: String,
        /// Cancel its scheduled and dead tasks with it.
        #[arg(long)]
        cancel_tasks: bool,
    },
    /// Pause a plugin: no runner starts its tasks until it is resumed.
    Pause { name: String },
    /// Resume a paused plugin: its overdue tasks run at once.
    Resume { name: String },
    /// Let a plugin schedule and cancel tasks of other plugins (patterns, comma-separated;
    /// none: its own tasks only).
    MaySchedule {
        name: String,
        #[arg(value_delimiter = ',')]
        patterns: Vec<String>,
    },
    /// Set a plugin's weight in the fair share between plugins (1 to 1000; every plugin's is 1
    /// unless set): its share of workers when plugins compete, against the others' weights.
    Weight { name: String, weight: u32 },
    /// Set one owner's weight among a plugin's owners when they take turns (1 to 1000; 1 unless
    /// set): its share of a claim's places against the other owners', or --default for 1.
    OwnerWeight {
        name: String,
        owner: String,
        #[arg(conflicts_with = "default", required_unless_present = "default")]
        weight: Option<u32>,
        #[arg(long)]
        default: bool,
    },
    /// Set a plugin's own time limit per run (`30s`, `5m`), or --default for the runner's
    /// `--plugin-timeout`.
    TimeLimit {
        name: String,
        #[arg(value_parser = parse_duration, conflicts_with = "default", required_unless_present = "default")]
        limit: Option<Duration>,
        #[arg(long)]
        default: bool,
    },
    /// Set a plugin's own time limit per call of its payload check (`3s`), apart from its runs',
    /// or --default for the runner's `--check-timeout`.
    CheckTimeLimit {
        name: String,
        #[arg(value_parser = parse_duration, conflicts_with = "default", required_unless_present = "default")]
        limit: Option<Duration>,
        #[arg(long)]
        default: bool,
    },
    /// Set a plugin's own memory cap per instance in bytes, or --default for the runner's
    /// `--plugin-memory`.
    Memory {
        name: String,
        #[arg(value_parser = parse_memory, conflicts_with = "default", required_unless_present = "default")]
        bytes: Option<usize>,
        #[arg(long)]
        default: bool,
    },
    /// Set how many of a plugin's tasks may be scheduled at once (past it scheduling is
    /// refused), or --default for 1,000,000.
    MaxPending {
        name: String,
        #[arg(conflicts_with = "default", required_unless_present = "default")]
        max: Option<u64>,
        #[arg(long)]
        default: bool,
    },
    /// Set how many of one owner's tasks of a plugin may be scheduled, running or dead at once
    /// (past it scheduling that owner's tasks is refused), or --none for no limit.
    OwnerMaxPending {
        name: String,
        #[arg(conflicts_with = "none", required_unless_present = "none")]
        max: Option<u64>,
        #[arg(long)]
        none: bool,
    },
    /// Limit a plugin's starts across all runners: `10/1s` (at most 10 starts in any second), or
    /// --none for no limit. Runs over it wait, using no attempt.
    RateLimit {
        name: String,
        #[arg(value_parser = parse_rate, conflicts_with = "none", required_unless_present = "none")]
        rate: Option<(u32, u64)>,
        #[arg(long)]
        none: bool,
    },
    /// Limit the starts of each owner's tasks of a plugin across all runners: `2/1s` (at most 2
    /// starts of one owner's tasks in any second), or --none for no limit.
    OwnerRateLimit {
        name: String,
        #[arg(value_parser = parse_rate, conflicts_with = "none", required_unless_present = "none")]
        rate: Option<(u32, u64)>,
        #[arg(long)]
        none: bool,
    },
    /// Limit the runs of one owner's tasks of a plugin at once across all runners (--max N, or
    /// --none for no limit).
    OwnerLimit {
        name: String,
        #[arg(long, conflicts_with = "none", required_unless_present = "none")]
        max: Option<u32>,
        #[arg(long)]
        none: bool,
    },
    /// Limit a plugin's runs at once across all runners (--max N, or --none for no limit).
    Limit {
        name: String,
        #[arg(long, conflicts_with = "none", required_unless_present = "none")]
        max: Option<u32>,
        #[arg(long)]
        none: bool,
    },
    /// Let a plugin send HTTP requests to these origins (`https://api.example.com`,
    /// `https://*.example.com`, `http://127.0.0.1:9000`): the list replaces the one before
    /// (`--set`, the default; none: no network at all), or with `--add` / `--remove` changes
    /// it. It says what changed.
    AllowHosts {
        name: String,
        origins: Vec<String>,
        /// Replace the plugin's list with these origins (what a plain call does).
        #[arg(long, conflicts_with_all = ["add", "remove"])]
        set: bool,
        /// Add these origins to the plugin's list.
        #[arg(long, conflicts_with = "remove", requires = "origins")]
        add: bool,
        /// Take these origins out of the plugin's list.
        #[arg(long, requires = "origins")]
        remove: bool,
    },
    /// Set a plugin's config, read with `config(name)`: NAME=VALUE ... (replaces all of it;
    /// none: clears it).
    Config {
        name: String,
        #[arg(value_parser = parse_pair)]
        entries: Vec<(String, String)>,
    },
    /// A plugin's secrets, read with `secret(name)`: set, delete, list (names only).
    #[command(subcommand)]
    Secret(SecretCmd),
}

#[derive(Subcommand, Debug)]
pub enum SecretCmd {
    /// Set a secret; its value is read from standard input (one line) unless --value is given.
    Set {
        name: String,
        key: String,
        #[arg(long)]
        value: Option<String>,
    },
    /// Delete a secret.
    Delete { name: String, key: String },
    /// List the names of a plugin's secrets (values are never shown).
    List { name: String },
}

/// `NAME=VALUE`.
fn parse_pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))
}
