//! Calls that run a plugin's code for a question rather than for a task's run: its `check` of
//! payloads, its `payload-schema`, and dry runs. Each takes one of [`CHECK_SLOTS`] slots (the
//! instance allocator has room for them beside the workers' and the warm instances) and runs on
//! the calls' runtime, under the plugin's policy, with its effects returned, never applied.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::host::{Asked, DryHttp};
use super::{Loaded, Plugins, http, instance};
use crate::executor::{Run, TaskHost};
use eggtimer_store::Claimed;

/// Checks, schemas and dry runs at once on one runner.
pub(super) const CHECK_SLOTS: usize = 4;

/// Of those, the most one team (the key that uploaded the plugins) may hold, whatever number of
/// plugins it has: a team whose checks sleep or loop to their time limit, asked by many requests
/// at once, keeps the other half of the slots free for other teams.
const SLOTS_PER_TEAM: usize = CHECK_SLOTS / 2;

/// How long one waits for a slot before it gives up (it still has its time limit after).
const CHECK_QUEUE: Duration = Duration::from_secs(5);

/// The largest JSON Schema a plugin may describe its payload with.
const MAX_SCHEMA_BYTES: usize = 64 << 10;

/// Why a plugin could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Every slot stayed taken (try again).
    #[error(
        "the payload check waited {CHECK_QUEUE:?} for one of this runner's {CHECK_SLOTS} check slots; try again"
    )]
    Busy,
    /// The plugin's code trapped or ran past its time limit.
    #[error("{0}")]
    Failed(String),
}

pub use crate::tasks::Verdicts;

impl From<CheckError> for crate::tasks::Unchecked {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::Busy => crate::tasks::Unchecked::Busy(e.to_string()),
            CheckError::Failed(m) => crate::tasks::Unchecked::Failed(m),
        }
    }
}

/// What a dry run did: the run as it would have been (its effects not applied), the HTTP
/// requests it asked to send (none sent), and how long it took.
pub struct DryRun {
    pub run: Run,
    pub http: Vec<Asked>,
    pub took: Duration,
}

impl Plugins {
    /// What every call shares: the engine, the warm pool, the host's options, the HTTP client.
    pub(super) fn env(&self) -> instance::CallEnv<'_> {
        instance::CallEnv {
            engine: &self.engine.engine,
            pool: &self.pool,
            opts: &self.opts,
            outbound: &self.outbound,
        }
    }

    /// Runs `ask` for a plugin of `team` in a slot (one of the team's [`SLOTS_PER_TEAM`] first,
    /// then one of the runner's), on the calls' runtime: guest code never runs on the caller's
    /// threads.
    async fn in_slot<T, F, Fut>(self: &Arc<Self>, team: &str, ask: F) -> Result<T, CheckError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Plugins>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, CheckError>> + Send + 'static,
    {
        let this = Arc::clone(self);
        let own = Arc::clone(
            self.checking_per_team
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(team.to_owned())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(SLOTS_PER_TEAM))),
        );
        let asking = async move {
            let waited = tokio::time::timeout(CHECK_QUEUE, async {
                let own = own.acquire_owned().await;
                let any = this.checking.acquire().await;
                (own, any)
            });
            let _turn = waited.await.map_err(|_| CheckError::Busy)?;
            ask(Arc::clone(&this)).await
        };
        match &self.rt.0 {
            Some(rt) => rt.spawn(asking).await.unwrap_or_else(|e| {
                Err(CheckError::Failed(format!("the plugin's call failed: {e}")))
            }),
            None => asking.await,
        }
    }

    /// What the current version of `plugin` on this runner says of each payload. A plugin
    /// without `check`, or not loaded here, takes every payload.
    pub async fn check(
        self: &Arc<Self>,
        plugin: &str,
        payloads: Vec<String>,
    ) -> Result<Verdicts, CheckError> {
        match self.get(plugin) {
            Some(loaded) if loaded.has_check() => self.check_with(loaded, payloads).await,
            _ => Ok(vec![None; payloads.len()]),
        }
    }

    /// As [`Plugins::check`], with `loaded` (any version, current or not).
    pub async fn check_with(
        self: &Arc<Self>,
        loaded: Arc<Loaded>,
        payloads: Vec<String>,
    ) -> Result<Verdicts, CheckError> {
        if !loaded.has_check() {
            return Ok(vec![None; payloads.len()]);
        }
        let team = loaded.team.clone();
        self.in_slot(&team, move |this| async move {
            let policy = this.policy(&loaded.name);
            instance::check(this.env(), &loaded, &payloads, &policy)
                .await
                .map_err(CheckError::Failed)
        })
        .await
    }

    /// The JSON Schema of the payloads the current version of `plugin` on this runner takes,
    /// where it says (its `payload-schema`), asked once per version. None: not loaded here, no
    /// such export, no answer, or one that is not JSON or larger than 64 KiB; a version that
    /// could not be asked (every slot taken, a trap) is asked again next time.
    pub async fn payload_schema(self: &Arc<Self>, plugin: &str) -> Option<serde_json::Value> {
        let loaded = self.get(plugin)?;
        loaded.schema?;
        if let Some(v) = loaded.schema_text.get() {
            return v.clone();
        }
        let l = Arc::clone(&loaded);
        let text = self
            .in_slot(&loaded.team, move |this| async move {
                let policy = this.policy(&l.name);
                instance::payload_schema(this.env(), &l, &policy)
                    .await
                    .map_err(CheckError::Failed)
            })
            .await
            .ok()?;
        let schema = text
            .filter(|t| t.len() <= MAX_SCHEMA_BYTES)
            .and_then(|t| serde_json::from_str(&t).ok());
        loaded.schema_text.get_or_init(|| schema).clone()
    }

    /// Runs `task` on `loaded` (any version of its plugin) as a run would, under the plugin's
    /// policy, and applies nothing: its effects are returned; its HTTP requests are recorded and
    /// answered from `canned`, in order, not sent.
    pub async fn dry_run(
        self: &Arc<Self>,
        loaded: Arc<Loaded>,
        task: Claimed,
        host: Arc<dyn TaskHost>,
        canned: Vec<http::Response>,
    ) -> Result<DryRun, CheckError> {
        let team = loaded.team.clone();
        self.in_slot(&team, move |this| async move {
            let dry = Arc::new(std::sync::Mutex::new(DryHttp {
                canned: canned.into(),
                asked: Vec::new(),
            }));
            let policy = this.policy(&loaded.name);
            let started = Instant::now();
            let checks = Arc::clone(&this);
            let run = instance::call(
                this.env(),
                &loaded,
                &task,
                host,
                checks,
                policy,
                Some(Arc::clone(&dry)),
            )
            .await;
            let took = started.elapsed();
            let http = std::mem::take(&mut dry.lock().unwrap_or_else(|e| e.into_inner()).asked);
            Ok(DryRun { run, http, took })
        })
        .await
    }
}
