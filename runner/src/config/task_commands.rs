//! The commands on tasks and their schedules (`eggtimer schedule|task|owner|dead ...`); the
//! plugin, key, event and source commands are in `commands.rs`.

use std::path::PathBuf;

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum ScheduleCmd {
    /// Create or replace a recurring schedule (--cron or --every).
    Put {
        id: String,
        plugin: String,
        /// 5-field cron: minute hour day-of-month month day-of-week.
        #[arg(long, conflicts_with = "every", required_unless_present = "every")]
        cron: Option<String>,
        /// A fixed interval, e.g. 30s, 5m.
        #[arg(long)]
        every: Option<String>,
        /// IANA time zone of --cron (default UTC).
        #[arg(long)]
        tz: Option<String>,
        /// The payload of each firing (JSON).
        #[arg(long, default_value = "null")]
        payload: String,
        #[arg(long)]
        owner: Option<String>,
        /// skip (default: no firing while the previous one is due or running) or allow.
        #[arg(long)]
        overlap: Option<String>,
        #[arg(long)]
        max_attempts: Option<u32>,
        /// Each firing's priority, 0 (default) to 9.
        #[arg(long)]
        priority: Option<u8>,
    },
    /// List the schedules.
    List,
    /// Show a schedule and its next fire times.
    Get { id: String },
    /// Pause a schedule.
    Pause { id: String },
    /// Resume a schedule.
    Resume { id: String },
    /// Delete a schedule (firings already created stay).
    Delete { id: String },
}

#[derive(Subcommand, Debug)]
pub enum TaskCmd {
    /// Schedule a task.
    Add {
        plugin: String,
        /// The payload (JSON).
        #[arg(long, default_value = "null")]
        payload: String,
        /// When: ms since the epoch.
        #[arg(long, conflicts_with = "in")]
        at: Option<i64>,
        /// When: a delay from now, e.g. 30m, 2h, 500ms.
        #[arg(long = "in")]
        r#in: Option<String>,
        #[arg(long)]
        id: Option<String>,
        #[arg(long)]
        owner: Option<String>,
        #[arg(long)]
        max_attempts: Option<u32>,
        /// Not started by then (ms since the epoch), it is dead as expired instead of running.
        #[arg(long)]
        start_by: Option<i64>,
        /// After it finished, another task of the same id is not scheduled for this long (a
        /// schedule within it answers 409), e.g. 10m.
        #[arg(long)]
        unique_for: Option<String>,
        /// An event it listens for, `TOPIC:KEY:cancel` or `TOPIC:KEY:run` (repeat it, up to 8):
        /// the event cancels it, or runs it now.
        #[arg(long = "on", value_name = "TOPIC:KEY:THEN")]
        on: Vec<String>,
        /// How long before it was scheduled an event still reaches it (default 60s).
        #[arg(long, requires = "on")]
        lookback: Option<String>,
        /// Debounce on this key (the task's id): each add within --quiet moves it on and keeps
        /// the payload, so it runs once with all of them.
        #[arg(long, requires = "quiet", conflicts_with_all = ["id", "at", "in"])]
        debounce: Option<String>,
        /// With --debounce: the quiet period, e.g. 2s.
        #[arg(long, requires = "debounce")]
        quiet: Option<String>,
        /// With --debounce: the longest a window stays open after its first payload (default:
        /// 1h).
        #[arg(long, requires = "debounce")]
        max_wait: Option<String>,
        /// A W3C trace context the run joins (00-<trace>-<span>-<flags>).
        #[arg(long)]
        traceparent: Option<String>,
        /// 0 (default) to 9: among its plugin's due tasks, the higher starts first.
        #[arg(long, conflicts_with = "debounce")]
        priority: Option<u8>,
    },
    /// Show a task (and the log lines of its last attempts).
    Get {
        id: String,
        /// The task's plugin, where plugins your key may see each have a task of this id.
        #[arg(long)]
        plugin: Option<String>,
    },
    /// Find tasks by plugin, state, owner and due range (one page; --cursor for the next).
    Find {
        #[arg(long)]
        plugin: Option<String>,
        /// scheduled | running | dead | done
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        owner: Option<String>,
        /// Due at or after (ms since the epoch).
        #[arg(long)]
        due_after: Option<i64>,
        /// Due at or before (ms since the epoch).
        #[arg(long)]
        due_before: Option<i64>,
        #[arg(long)]
        limit: Option<u32>,
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Cancel a task.
    Cancel {
        id: String,
        /// The task's plugin, where plugins your key may see each have a task of this id.
        #[arg(long)]
        plugin: Option<String>,
    },
    /// Run a task now.
    Run {
        id: String,
        /// The task's plugin, where plugins your key may see each have a task of this id.
        #[arg(long)]
        plugin: Option<String>,
    },
    /// Run a task through its plugin with nothing applied: what it would decide, log and do.
    DryRun {
        id: String,
        /// The task's plugin, where plugins your key may see each have a task of this id.
        #[arg(long)]
        plugin: Option<String>,
        /// A stored version (a candidate included) in place of the current one.
        #[arg(long, conflicts_with = "wasm")]
        version: Option<u64>,
        /// A local build: the task as stored runs here, against this file (its kv reads see an
        /// empty store; nothing is uploaded).
        #[arg(long)]
        wasm: Option<PathBuf>,
    },
    /// Move a task: to a time (--at) or by a signed duration (--by -2h).
    Move {
        id: String,
        /// The task's plugin, where plugins your key may see each have a task of this id.
        #[arg(long)]
        plugin: Option<String>,
        #[arg(long, conflicts_with = "by")]
        at: Option<i64>,
        #[arg(long, allow_hyphen_values = true)]
        by: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum OwnerCmd {
    /// Move all scheduled tasks of an owner by a signed duration (--by -2h).
    Shift {
        owner: String,
        #[arg(long, allow_hyphen_values = true)]
        by: String,
        #[arg(long)]
        plugin: Option<String>,
    },
    /// List an owner's scheduled tasks.
    List { owner: String },
    /// An owner's scheduled, running and dead tasks per plugin, and its pauses.
    Stats { owner: String },
    /// Cancel all of an owner's scheduled tasks (of one plugin).
    Cancel {
        owner: String,
        #[arg(long)]
        plugin: Option<String>,
    },
    /// Pause an owner's tasks (of one plugin): they wait, scheduled, until resumed.
    Pause {
        owner: String,
        #[arg(long)]
        plugin: Option<String>,
    },
    /// Resume an owner's tasks (of one plugin; without --plugin, every pause of the owner).
    Resume {
        owner: String,
        #[arg(long)]
        plugin: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum DeadCmd {
    /// List dead tasks.
    List {
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Put a dead task back (due now).
    Retry {
        id: String,
        /// The task's plugin, where plugins your key may see each have a task of this id.
        #[arg(long)]
        plugin: Option<String>,
    },
    /// Drop a dead task.
    Drop {
        id: String,
        /// The task's plugin, where plugins your key may see each have a task of this id.
        #[arg(long)]
        plugin: Option<String>,
    },
    /// Put every dead task (of one plugin) back.
    RetryAll {
        #[arg(long)]
        plugin: Option<String>,
    },
    /// Drop every dead task (of one plugin).
    DropAll {
        #[arg(long)]
        plugin: Option<String>,
    },
}
