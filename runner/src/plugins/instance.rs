//! Warm instances and calls.
//!
//! A call takes an idle instance of the plugin version from the pool (or instantiates one), runs
//! `handle` asynchronously and puts the instance back. The pool keeps at most
//! `PluginOptions::warm_instances` idle instances over all plugins and evicts the least recently
//! used, so many plugins never exhaust the allocator: the pooling allocator has room for every
//! worker's running instance plus the idle ones.
//!
//! Time limit: a call is wall-clock bounded whatever the guest does. Running guest code is
//! interrupted at an epoch tick past the deadline; a guest waiting in a WASI call (sleep, poll)
//! is waiting on a host future, which is dropped when the call's tokio timeout fires. Either way
//! the instance is dropped, never reused.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};
use wasmtime::component::{ResourceTable, TypedFunc};
use wasmtime::{Store, UpdateDeadline};
use wasmtime_wasi::WasiCtx;

use super::bindings::Plugin;
use super::bindings::eggtimer::plugin::types as wit;
use super::host::{CallCtx, DryHttp, FrozenClock, HttpCtx, State, explain_trap};
use super::http::Outbound;
use super::limiter::Limiter;
use super::output::GuestOutput;
use super::{Loaded, PluginOptions};
use crate::executor::{Outcome, Run, TaskHost};
use eggtimer_base::clock::Clock;
use eggtimer_base::policy::Policy;
use eggtimer_store::Claimed;

/// A plugin's `check: func(payload: string) -> result<_, string>`.
type CheckFn = TypedFunc<(String,), (Result<(), String>,)>;

/// Captured guest output kept per instance before it is recycled.
const OUTPUT_CAP: usize = 1 << 20;
/// Calls on one instance before it is recycled (bounds what a plugin can leak between tasks).
const MAX_REUSE: u32 = 10_000;

/// An instance kept for reuse: by the plugin it was made for and that plugin's version, never
/// handed to another plugin with the same bytes (its guest memory and globals are that
/// plugin's).
pub(super) struct Warm {
    name: String,
    digest: String,
    store: Store<State>,
    plugin: Plugin,
    /// The plugin's `check`, if it exports one.
    check: Option<CheckFn>,
    /// Its `payload-schema`, if it exports one.
    schema: Option<TypedFunc<(), (Option<String>,)>>,
    stdout: GuestOutput,
    stderr: GuestOutput,
    calls: u32,
}

impl Warm {
    /// Whether the instance may serve another call: not after [`MAX_REUSE`] calls, nor once its
    /// captured output is half full.
    fn reusable(&self) -> bool {
        self.calls < MAX_REUSE
            && self.stdout.written() <= OUTPUT_CAP / 2
            && self.stderr.written() <= OUTPUT_CAP / 2
    }
}

/// Idle instances, least recently used first.
pub(super) struct Pool {
    idle: Mutex<VecDeque<Warm>>,
    cap: usize,
}

impl Pool {
    pub fn new(cap: usize) -> Pool {
        Pool {
            idle: Mutex::new(VecDeque::new()),
            cap,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Warm>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    fn take(&self, name: &str, digest: &str) -> Option<Warm> {
        let mut idle = self.lock();
        let i = idle
            .iter()
            .rposition(|w| w.digest == digest && w.name == name)?;
        idle.remove(i)
    }

    fn put(&self, w: Warm) {
        if self.cap == 0 {
            return;
        }
        let evicted = {
            let mut idle = self.lock();
            let evicted = if idle.len() >= self.cap {
                idle.pop_front()
            } else {
                None
            };
            idle.push_back(w);
            evicted
        };
        drop(evicted); // its memory goes back to the allocator outside the lock
    }

    /// Drops the idle instances of plugin versions (name, digest) other than `keep` (after a
    /// swap or delete).
    pub fn forget_except(&self, keep: &[(String, String)]) {
        let dropped: Vec<Warm> = {
            let mut idle = self.lock();
            let (stay, go): (VecDeque<Warm>, VecDeque<Warm>) = idle
                .drain(..)
                .partition(|w| keep.iter().any(|(n, d)| *n == w.name && *d == w.digest));
            *idle = stay;
            go.into_iter().collect()
        };
        drop(dropped);
    }
}

/// What every call shares: the engine, the warm pool, the host's options, the HTTP client.
pub(super) struct CallEnv<'a> {
    pub engine: &'a wasmtime::Engine,
    pub pool: &'a Pool,
    pub opts: &'a PluginOptions,
    pub outbound: &'a Arc<Outbound>,
}

/// Runs one task on `loaded` (the current version of its plugin, or any for a dry run, whose
/// HTTP requests `dry` records instead of sending).
#[allow(clippy::too_many_arguments)]
pub(super) async fn call(
    env: CallEnv<'_>,
    loaded: &Loaded,
    task: &Claimed,
    host: Arc<dyn TaskHost>,
    checks: Arc<super::Plugins>,
    policy: Arc<Policy>,
    dry: Option<Arc<Mutex<DryHttp>>>,
) -> Run {
    let timeout = policy.time_limit;
    let mut warm = match warm_instance(&env, loaded, timeout, policy.memory).await {
        Ok(w) => w,
        Err(e) => return Run::failed(e),
    };
    let deadline = Instant::now() + timeout;
    begin(&mut warm, &env, task, host, checks, &policy, deadline, dry);
    let result = tokio::time::timeout_at(
        deadline.into(),
        warm.plugin.call_handle(&mut warm.store, &task_input(task)),
    )
    .await;
    let mut call = std::mem::take(&mut warm.store.data_mut().call);
    let stderr_tail = drain_output(&mut warm, task, &mut call.log);
    warm.calls += 1;
    let run = match result {
        // The guest was waiting in a host call (a WASI sleep or poll) at its deadline: the call
        // was dropped mid-way, so the instance can't be used again.
        Err(_) => {
            let mut msg = format!(
                "the plugin ran longer than its time limit of {timeout:?} (it was waiting in a host or WASI call)"
            );
            if !stderr_tail.is_empty() {
                msg.push_str(&format!(" (stderr: {stderr_tail})"));
            }
            return Run::failed(msg).logged(call.log);
        }
        // A trap (or over budget): the instance can't be re-entered, drop it.
        Ok(Err(e)) => {
            return Run::failed(explain_trap(&e, timeout, &stderr_tail)).logged(call.log);
        }
        Ok(Ok(Ok(outcome))) => Run {
            outcome: Ok(outcome_of(outcome)),
            effects: call.effects,
            log: call.log,
        },
        // The handler returned an error: a failed attempt; effects are dropped.
        Ok(Ok(Err(e))) => {
            Run::failed(format!("the handler returned an error: {e}")).logged(call.log)
        }
    };
    if warm.reusable() {
        env.pool.put(warm);
    }
    run
}

/// The most of a check's message kept (a plugin may return megabytes).
const CHECK_MESSAGE_CAP: usize = 1024;

/// What `check` of `loaded` says of each payload: `None` fits, `Some(message)` does not (a
/// plugin without `check` takes every payload). The calls share one deadline, the plugin's check
/// time limit (not its runs'): one request's payloads are checked within it together. `Err`: the check itself failed
/// (a trap, the time limit), and why. A check sees no task and does nothing: its host calls that
/// read or write answer with an error, and what it asked to schedule, emit or write is dropped.
pub(super) async fn check(
    env: CallEnv<'_>,
    loaded: &Loaded,
    payloads: &[String],
    policy: &Policy,
) -> Result<Vec<Option<String>>, String> {
    let timeout = policy.check_time_limit;
    if loaded.check.is_none() {
        return Ok(vec![None; payloads.len()]);
    }
    let mut warm = warm_instance(&env, loaded, timeout, policy.memory).await?;
    let Some(f) = warm.check else {
        return Ok(vec![None; payloads.len()]);
    };
    let deadline = begin_question(&mut warm, &env, loaded, policy);
    let mut verdicts = Vec::with_capacity(payloads.len());
    for p in payloads {
        let called =
            tokio::time::timeout_at(deadline.into(), f.call_async(&mut warm.store, (p.clone(),)))
                .await;
        warm.calls += 1;
        match called {
            Err(_) => {
                return Err(format!(
                    "the plugin's check ran longer than its check time limit of {timeout:?} \
                     (check_time_limit_ms, --check-timeout)"
                ));
            }
            Ok(Err(e)) => {
                let tail = String::from_utf8_lossy(&warm.stderr.take()).into_owned();
                return Err(format!(
                    "the plugin's check failed: {}",
                    explain_trap(&e, timeout, tail.trim())
                ));
            }
            Ok(Ok((Ok(()),))) => verdicts.push(None),
            Ok(Ok((Err(mut m),))) => {
                if m.len() > CHECK_MESSAGE_CAP {
                    let mut end = CHECK_MESSAGE_CAP;
                    while !m.is_char_boundary(end) {
                        end -= 1;
                    }
                    m.truncate(end);
                    m.push_str("...");
                }
                verdicts.push(Some(m));
            }
        }
    }
    end_question(warm, &env);
    Ok(verdicts)
}

/// What `payload-schema` of `loaded` answers (JSON text, unchecked), under the plugin's time
/// limit and memory cap, with no task and no effects.
pub(super) async fn payload_schema(
    env: CallEnv<'_>,
    loaded: &Loaded,
    policy: &Policy,
) -> Result<Option<String>, String> {
    let timeout = policy.check_time_limit;
    let mut warm = warm_instance(&env, loaded, timeout, policy.memory).await?;
    let Some(f) = warm.schema else {
        return Ok(None);
    };
    let deadline = begin_question(&mut warm, &env, loaded, policy);
    let called = tokio::time::timeout_at(deadline.into(), f.call_async(&mut warm.store, ())).await;
    warm.calls += 1;
    let answer = match called {
        Ok(Ok((text,))) => text,
        Ok(Err(e)) => return Err(explain_trap(&e, timeout, "")),
        Err(_) => return Err(format!("payload-schema ran past {timeout:?}")),
    };
    end_question(warm, &env);
    Ok(answer)
}

/// Readies `warm` for a question (a check, the schema): no task, no host, the plugin's config
/// and budget, its check time limit from now; returns the deadline.
fn begin_question(warm: &mut Warm, env: &CallEnv<'_>, loaded: &Loaded, policy: &Policy) -> Instant {
    let deadline = Instant::now() + policy.check_time_limit;
    let data = warm.store.data_mut();
    data.started_at
        .store(data.clock.now_ms(), Ordering::Relaxed);
    data.deadline = deadline;
    data.call = CallCtx {
        plugin: loaded.name.clone(),
        budget: env.opts.budget.clone(),
        config: Arc::clone(&policy.config),
        ..CallCtx::default()
    };
    warm.store.set_epoch_deadline(1);
    deadline
}

/// After a question: what it printed or asked for is nobody's (dropped); the instance goes
/// back to the pool.
fn end_question(mut warm: Warm, env: &CallEnv<'_>) {
    warm.store.data_mut().call = CallCtx::default();
    warm.stdout.take();
    warm.stderr.take();
    if warm.reusable() {
        env.pool.put(warm);
    }
}

/// Readies `warm` for one call of `task`: what its host functions may do and see, and until when.
#[allow(clippy::too_many_arguments)]
fn begin(
    warm: &mut Warm,
    env: &CallEnv<'_>,
    task: &Claimed,
    host: Arc<dyn TaskHost>,
    checks: Arc<super::Plugins>,
    policy: &Policy,
    deadline: Instant,
    dry: Option<Arc<Mutex<DryHttp>>>,
) {
    let may_schedule = policy.may_schedule.clone();
    let data = warm.store.data_mut();
    data.started_at
        .store(data.clock.now_ms(), Ordering::Relaxed);
    data.deadline = deadline;
    data.call = CallCtx {
        task_id: task.task_id().to_owned(),
        occurrence: task.created,
        plugin: task.plugin.clone(),
        priority: task.priority,
        event: task.event.clone(),
        batch: task.batch.clone(),
        effects: crate::executor::Effects {
            cancel_also: may_schedule.clone(),
            ..Default::default()
        },
        may_schedule,
        host: Some(host),
        checks: Some(checks),
        budget: env.opts.budget.clone(),
        max_payload_bytes: env.opts.max_payload_bytes,
        default_max_attempts: env.opts.default_max_attempts,
        http: Some(Arc::new(HttpCtx {
            outbound: Arc::clone(env.outbound),
            allowed_hosts: Arc::clone(&policy.allowed_hosts),
            traceparent: task.traceparent.clone(),
            deadline,
            task_id: task.task_id().to_owned(),
            occurrence: task.created,
            plugin: task.plugin.clone(),
            sent: Default::default(),
            dry,
        })),
        config: Arc::clone(&policy.config),
        ..CallCtx::default()
    };
    warm.store.set_epoch_deadline(1);
}

/// The task as the plugin's `handle` receives it.
fn task_input(task: &Claimed) -> wit::Task {
    wit::Task {
        id: task.task_id().to_owned(),
        plugin: task.plugin.clone(),
        attempt: task.attempt,
        max_attempts: task.max_attempts,
        due: task.due,
        owner: task.owner.clone(),
        payload: task.payload.clone(),
    }
}

/// Instantiates `loaded` (its start code runs, bounded as a call is) and puts the instance in the
/// pool for the next call.
pub(super) async fn start_once(
    engine: &wasmtime::Engine,
    pool: &Pool,
    loaded: &Loaded,
    timeout: Duration,
    memory: usize,
    clock: &Clock,
) -> Result<(), String> {
    let instantiating = instantiate(engine, loaded, timeout, memory, clock);
    match tokio::time::timeout(timeout, instantiating).await {
        Ok(w) => {
            pool.put(w?);
            Ok(())
        }
        Err(_) => Err(format!(
            "instantiating the plugin took longer than its time limit of {timeout:?}"
        )),
    }
}

/// A warm instance of `loaded` from the pool, or a new one (instantiating runs the component's
/// start code: bounded like a call). A warm instance takes the plugin's memory cap of now; one
/// that already holds more is dropped.
async fn warm_instance(
    env: &CallEnv<'_>,
    loaded: &Loaded,
    timeout: Duration,
    memory: usize,
) -> Result<Warm, String> {
    while let Some(mut w) = env.pool.take(&loaded.name, &loaded.digest) {
        if w.store.data_mut().limits.set_cap(memory) {
            return Ok(w);
        }
    }
    let instantiating = instantiate(env.engine, loaded, timeout, memory, &env.opts.clock);
    match tokio::time::timeout(timeout, instantiating).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "instantiating the plugin took longer than its time limit of {timeout:?}"
        )),
    }
}

fn outcome_of(outcome: wit::Outcome) -> Outcome {
    match outcome {
        wit::Outcome::Done => Outcome::Done,
        wit::Outcome::RetryAfter(ms) => Outcome::RetryAfter(ms),
        wit::Outcome::Fail(reason) => Outcome::Fail(reason),
        wit::Outcome::RunAgainAt(t) => Outcome::RunAgainAt(t),
    }
}

async fn instantiate(
    engine: &wasmtime::Engine,
    loaded: &Loaded,
    timeout: Duration,
    memory: usize,
    clock: &Clock,
) -> Result<Warm, String> {
    let stdout = GuestOutput::new(OUTPUT_CAP);
    let stderr = GuestOutput::new(OUTPUT_CAP);
    let started_at = Arc::new(AtomicI64::new(clock.now_ms()));
    // No preopened directories, no environment, no network, no stdin: a plugin reaches nothing.
    let wasi = WasiCtx::builder()
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .wall_clock(FrozenClock(Arc::clone(&started_at)))
        .build();
    let state = State {
        wasi,
        table: ResourceTable::new(),
        limits: Limiter::new(memory),
        call: CallCtx::default(),
        http: super::wasi_http::WasiHttp::default(),
        started_at,
        clock: clock.clone(),
        deadline: Instant::now() + timeout,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limits);
    // At every tick: past the deadline the guest is interrupted; before it, it yields to the
    // runtime, so a busy guest shares its thread with other calls.
    store.epoch_deadline_callback(|ctx| {
        if Instant::now() >= ctx.data().deadline {
            Ok(UpdateDeadline::Interrupt)
        } else {
            Ok(UpdateDeadline::Yield(1))
        }
    });
    store.set_epoch_deadline(1);
    let instance = loaded
        .pre
        .instance_pre()
        .instantiate_async(&mut store)
        .await
        .map_err(|e| {
            use super::limiter::{CORE_INSTANCES, MEMORIES, TABLES};
            let e = format!("{e:#}");
            if e.contains("count too high") || e.contains("exceeds") {
                format!(
                    "instantiating the plugin failed: {e} (a plugin instance may have at most \
                     {CORE_INSTANCES} core instances, {MEMORIES} memories and {TABLES} tables)"
                )
            } else {
                format!("instantiating the plugin failed: {e}")
            }
        })?;
    let plugin = Plugin::new(&mut store, &instance)
        .map_err(|e| format!("the plugin does not export the eggtimer handler: {e:#}"))?;
    let check = match &loaded.check {
        None => None,
        Some(i) => Some(instance.get_typed_func(&mut store, i).map_err(|e| {
            format!(
                "the plugin's check export is not `check: func(payload: string) -> result<_, string>`: {e:#}"
            )
        })?),
    };
    let schema = match &loaded.schema {
        None => None,
        Some(i) => Some(instance.get_typed_func(&mut store, i).map_err(|e| {
            format!(
                "the plugin's payload-schema export is not `payload-schema: func() -> option<string>`: {e:#}"
            )
        })?),
    };
    Ok(Warm {
        name: loaded.name.clone(),
        digest: loaded.digest.clone(),
        store,
        plugin,
        check,
        schema,
        stdout,
        stderr,
        calls: 0,
    })
}

/// Logs what the guest printed since the last call; returns the last of its stderr.
fn drain_output(warm: &mut Warm, task: &Claimed, log: &mut eggtimer_store::AttemptLog) -> String {
    let (out, err) = (warm.stdout.take(), warm.stderr.take());
    if out.is_empty() && err.is_empty() {
        return String::new();
    }
    let new_out = String::from_utf8_lossy(&out);
    let new_err = String::from_utf8_lossy(&err);
    let now = warm.store.data().clock.now_ms();
    for line in new_out.lines().filter(|l| !l.trim().is_empty()) {
        info!(task = %task.id, plugin = %task.plugin, "plugin stdout: {line}");
        log.push("stdout", now, line);
    }
    for line in new_err.lines().filter(|l| !l.trim().is_empty()) {
        warn!(task = %task.id, plugin = %task.plugin, "plugin stderr: {line}");
        log.push("stderr", now, line);
    }
    let tail: Vec<&str> = new_err.lines().rev().take(3).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
}
