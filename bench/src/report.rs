//! What each workload reports: one typed record per workload, printed as one JSON line.

use std::collections::BTreeMap;

use serde::Serialize;

/// Lateness (handler start − due time) in ms, over the tasks that ran.
#[derive(Clone, Debug, Serialize)]
pub struct Lateness {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// Whether every task ran exactly once and none early.
#[derive(Clone, Debug, Serialize)]
pub struct Outcomes {
    pub executed: usize,
    pub missing: usize,
    pub duplicates: usize,
    pub early: usize,
}

/// W0: scheduling through HTTP.
#[derive(Debug, Serialize)]
pub struct W0 {
    pub workload: &'static str,
    /// `noop` (its payloads checked) or `noop-plain` (no check).
    pub plugin: &'static str,
    pub n: usize,
    pub batch: usize,
    pub concurrency: usize,
    pub seconds: f64,
    pub tasks_per_s: f64,
    pub stored: u64,
    /// Redis CPU (µs) per task scheduled.
    pub redis_cpu_us_per_task: f64,
}

/// What checking payloads costs W0: `noop`'s W0 (each payload asked of its `check`) against
/// `noop-plain`'s (no check), in one run.
#[derive(Debug, Serialize)]
pub struct CheckCost {
    pub workload: &'static str,
    /// W0 with checks as a share of W0 without (target: at least 0.7).
    pub checked_share: f64,
    /// Wall time per task the checks add (µs): 1/checked − 1/plain.
    pub us_per_checked_task: f64,
}

impl CheckCost {
    pub fn of(checked: &W0, plain: &W0) -> CheckCost {
        CheckCost {
            workload: "W0-check-cost",
            checked_share: (checked.tasks_per_s / plain.tasks_per_s * 1000.0).round() / 1000.0,
            us_per_checked_task: ((1e6 / checked.tasks_per_s - 1e6 / plain.tasks_per_s) * 100.0)
                .round()
                / 100.0,
        }
    }
}

/// W8: a deploy checked against the tasks waiting for its plugin, beside W1 for another plugin.
#[derive(Debug, Serialize)]
pub struct W8 {
    pub workload: &'static str,
    pub waiting: usize,
    /// Payloads the new version's check read (all of them), and refused (three).
    pub checked: u64,
    pub failing: u64,
    /// The upload's wall time: compile, start, and the check of every waiting task (target:
    /// at most 30 s for 1,000,000).
    pub deploy_s: f64,
    pub checked_per_s: f64,
    /// W1 of another plugin while it ran (target: p99 at most 10 ms).
    pub w1_lateness_ms: Lateness,
    pub w1_outcomes: Outcomes,
}

/// W9: events for tasks that listen.
#[derive(Debug, Serialize)]
pub struct W9 {
    pub workload: &'static str,
    pub listening: usize,
    pub events: usize,
    /// Tasks the events cancelled or started, as the publishes answered (all of them), and
    /// those they did not reach.
    pub matched: u64,
    pub missed: u64,
    /// The `run` tasks that ran, and of them those that ran more than once (0).
    pub started: u64,
    pub started_twice: u64,
    /// Listening tasks still scheduled: those no event was sent for.
    pub left_scheduled: u64,
    /// Event → task cancelled: a publish's request time (target p99 at most 10 ms).
    pub cancelled_ms: Lateness,
    /// Event → task started: the handler's start − the event's time (target p99 at most 10 ms).
    pub started_ms: Lateness,
    /// Scheduling the listening tasks (s).
    pub fill_s: f64,
    /// Redis memory per listening task beyond the same task without `on` (target at most 100),
    /// and of it the listener index's (the rest: the `on` in the task's record).
    pub bytes_per_listening_task: f64,
    pub listener_index_bytes_per_task: f64,
    /// W1 of another plugin meanwhile (target: p99 at most 10 ms).
    pub w1_lateness_ms: Lateness,
    pub w1_outcomes: Outcomes,
    /// CPU (cores) Redis and this process used meanwhile, from W1's first due time.
    pub redis_cpu_share: f64,
    pub runner_cpu_share: f64,
}

/// W1 (and W1 on top of W3): tasks due evenly over 10 s.
#[derive(Clone, Debug, Serialize)]
pub struct W1 {
    pub workload: &'static str,
    pub n: usize,
    pub spread_s: u32,
    pub lateness_ms: Lateness,
    pub processed_per_s: f64,
    #[serde(flatten)]
    pub outcomes: Outcomes,
    /// From the first due time to the end: Redis's CPU seconds per second (1.0: its one thread
    /// never idle), and this process's (the runner, its plugin calls, the recorder).
    pub redis_cpu_share: f64,
    pub runner_cpu_share: f64,
    /// Script calls (EVALSHA: claims, finishes, …) per task in that time: a claim or finish
    /// costs Redis about as much for one task as for dozens, so this says how well they batch.
    pub scripts_per_task: f64,
    /// Forks of Redis (AOF rewrites) from W1's scheduling to its end, all nodes.
    pub forks: f64,
    /// From the first due time to the end, per kind of Redis event that held a node's one
    /// thread 2 ms or longer, the longest (ms; Redis's latency monitor: `command` a script,
    /// `aof-write` a write to the AOF, `fork`, …). Empty: nothing stalled Redis 2 ms. What
    /// explains a late max, or shows it was not Redis.
    pub redis_stalls_ms: BTreeMap<String, f64>,
}

/// W6: a slow plugin's backlog and another plugin's quick tasks due behind it.
#[derive(Debug, Serialize)]
pub struct W6 {
    pub workload: &'static str,
    pub slow_n: usize,
    pub slow_ms: u64,
    pub quick_n: usize,
    /// How late the quick tasks started.
    pub quick_lateness_ms: Lateness,
    /// The slow plugin's runs started per second (first start to last start of every task).
    pub slow_per_s: f64,
    #[serde(flatten)]
    pub outcomes: Outcomes,
}

/// W11: the highest rate of tasks due evenly that runs on time, and each rate tried.
#[derive(Debug, Serialize)]
pub struct W11 {
    pub workload: &'static str,
    pub spread_s: u32,
    /// The highest rate (tasks/s) whose tasks all ran once, none early, p99 ≤ 10 ms (0: none).
    pub max_steady_per_s: usize,
    pub steps: Vec<W11Step>,
}

/// One rate of W11.
#[derive(Debug, Serialize)]
pub struct W11Step {
    pub per_s: usize,
    pub ok: bool,
    pub lateness_ms: Lateness,
    pub missing: usize,
    pub duplicates: usize,
    pub early: usize,
    /// Redis's CPU seconds per second from the first due time to the end (1.0: never idle).
    pub redis_cpu_share: f64,
    pub runner_cpu_share: f64,
    pub scripts_per_task: f64,
}

/// W13: one owner's burst, another owner's tasks of the plugin falling due behind it.
#[derive(Debug, Serialize)]
pub struct W13 {
    pub workload: &'static str,
    pub big_n: usize,
    pub small_n: usize,
    /// How late the other owner's tasks started.
    pub small_lateness_ms: Lateness,
    /// The burst's runs started per second (its first start to its last).
    pub big_per_s: f64,
    #[serde(flatten)]
    pub outcomes: Outcomes,
}

/// W2: every task due at the same instant.
#[derive(Debug, Serialize)]
pub struct W2 {
    pub workload: &'static str,
    pub n: usize,
    pub drain_s: f64,
    pub tasks_per_s: f64,
    pub lateness_ms: Lateness,
    #[serde(flatten)]
    pub outcomes: Outcomes,
    /// Redis CPU (µs) per task while scheduling them (the schedule script).
    pub redis_cpu_us_per_task_schedule: f64,
    /// Redis CPU (µs) per task while draining them (claim, renew, finish together: Redis does
    /// not report CPU per script).
    pub redis_cpu_us_per_task_claim_and_finish: f64,
    /// CPU (µs) per task of the benchmark process while draining: the runner, its plugin calls
    /// and the recorder.
    pub runner_cpu_us_per_task: f64,
    /// Each step alone: the same tasks scheduled, claimed, then finished by the store.
    pub split_without_runner: Split,
    /// Per Redis node (one, or each master of a cluster): its share of the drain.
    pub nodes: Vec<NodeCpu>,
}

/// Redis CPU (µs) per task of each step of a task's life, measured one step at a time.
#[derive(Debug, Serialize)]
pub struct Split {
    pub redis_cpu_us_per_task_schedule: f64,
    pub redis_cpu_us_per_task_claim: f64,
    pub redis_cpu_us_per_task_finish: f64,
}

/// One Redis node's part of W2's drain.
#[derive(Debug, Serialize)]
pub struct NodeCpu {
    pub shards: usize,
    /// W2's tasks in those shards.
    pub tasks: usize,
    pub redis_cpu_s_drain: f64,
    /// Its CPU over the tasks it held.
    pub redis_cpu_us_per_task_claim_and_finish: f64,
}

/// W3: many tasks pending far in the future, and W1 on top of them.
#[derive(Debug, Serialize)]
pub struct W3 {
    pub workload: &'static str,
    pub pending: usize,
    pub fill_s: f64,
    pub bytes_per_pending_task: f64,
    pub bytes_beyond_payload: f64,
    /// Bytes per task of each of shard 0's keys (MEMORY USAGE).
    pub split_on_shard_0: BTreeMap<String, f64>,
    /// AOF rewrites Redis started while the fill wrote its tasks, and how long W1 then waited
    /// for the last one to end (its child process serializes the whole dataset on one of the
    /// two cores: W1 on top measures the pending tasks, not a rewrite beside it).
    pub aof_rewrites_during_fill: f64,
    pub waited_for_aof_rewrite_s: f64,
    pub w1_on_top: W1,
    pub p99_ratio_vs_w1_alone: Option<f64>,
}

/// W12: far tasks a week ahead, in the far tier, and W1 beside them.
#[derive(Debug, Serialize)]
pub struct W12 {
    pub workload: &'static str,
    pub far: usize,
    pub fill_s: f64,
    /// Then the slots it appended to compacted (a runner's promoter does it each second).
    pub compact_s: f64,
    pub scheduled_per_s: f64,
    pub bytes_per_far_task: f64,
    pub bytes_beyond_payload: f64,
    /// Waited for Redis's AOF rewrite after the fill, before what follows.
    pub aof_waited_s: f64,
    /// A cancel by id, one after another (µs each), of far tasks and of live ones.
    pub far_cancel_us_per_task: f64,
    pub live_cancel_us_per_task: f64,
    /// Far tasks moved to due now one after another while a runner runs, and their lateness.
    pub moved_now: usize,
    pub moved_now_lateness_ms: Lateness,
    /// An owner's tasks (a week ahead, live) shifted by a minute, and how long that took.
    pub owner_shifted: usize,
    pub owner_shift_ms: f64,
    /// Shard 0's far tasks moved into the live tier one promotion call after another.
    pub promoted_on_shard_0: usize,
    pub promoted_per_s: f64,
    pub w1_beside: W1,
    /// W0 (`noop-plain`, through the API) with the far tier: its tasks, a day ahead, all far.
    pub w0_far: W0,
    pub p99_ratio_vs_w1_alone: Option<f64>,
}

/// W4: the cost of one plugin call, per plugin.
#[derive(Debug, Serialize)]
pub struct W4 {
    pub workload: &'static str,
    pub per_task: BTreeMap<String, PluginCost>,
    pub note: &'static str,
}

#[derive(Debug, Serialize)]
pub struct PluginCost {
    pub warm_us_per_task: f64,
    pub fresh_instance_us_per_task: f64,
}

/// W5: W1 over two runner processes, one killed with SIGKILL mid-stream.
#[derive(Debug, Serialize)]
pub struct W5 {
    pub workload: &'static str,
    pub n: usize,
    pub runners: usize,
    pub killed_at_s: f64,
    pub lateness_ms: Lateness,
    pub processed_per_s: f64,
    #[serde(flatten)]
    pub outcomes: Outcomes,
    pub note: &'static str,
}

/// The value at quantile `p` of sorted values, to 0.01.
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    round(sorted[i])
}

pub fn lateness(sorted: &[f64]) -> Lateness {
    Lateness {
        p50: pct(sorted, 0.5),
        p95: pct(sorted, 0.95),
        p99: pct(sorted, 0.99),
        max: pct(sorted, 1.0),
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    round(v[v.len() / 2])
}

/// CPU seconds spent on `tasks` tasks, as µs per task.
pub fn per_task(cpu_s: f64, tasks: usize) -> f64 {
    round(cpu_s * 1e6 / tasks.max(1) as f64)
}

pub fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// W10: the least Redis work a claim and a finish can be, and W2's as a ratio to it.
#[derive(Clone, Debug, Serialize)]
pub struct W10 {
    pub workload: &'static str,
    pub n: usize,
    /// Redis CPU (µs) per task of the minimal claim and finish.
    pub redis_cpu_us_per_task_claim_and_finish: f64,
    /// W2's, when it ran before in this run.
    pub w2_redis_cpu_us_per_task_claim_and_finish: Option<f64>,
    /// W2's over the limit's.
    pub w2_ratio: Option<f64>,
    /// One warm call of `noop` (µs), without Redis: the runner's floor per task.
    pub noop_warm_call_us: f64,
    /// W2's CPU of the benchmark process per task (the runner, its plugin calls, the recorder).
    pub w2_runner_cpu_us_per_task: Option<f64>,
    /// W2's runner CPU per task over the warm call.
    pub w2_runner_ratio: Option<f64>,
}

/// W7: W0 and W2 with a replica and `--min-replicas-acked 1`, and their ratios to W0 and W2
/// without it (measured in the same run).
#[derive(Clone, Debug, Serialize)]
pub struct W7 {
    pub workload: &'static str,
    pub n: usize,
    pub w0_tasks_per_s: f64,
    pub w2_tasks_per_s: f64,
    pub w0_ratio: Option<f64>,
    pub w2_ratio: Option<f64>,
}
