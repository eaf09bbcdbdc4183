//! A deploy checked against the work waiting for it: before a version with `check` becomes
//! current (an upload, a promotion, a rollback), its check reads the payload of every scheduled
//! and dead task of the plugin. If any does not fit, the version is kept as a candidate and the
//! request is 409 `incompatible_payloads` (how many, ten examples), unless `?force=true`.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Map, Value, json};

use super::body::ApiResult;
use super::checks::failed;
use super::{ApiError, AppState};
use crate::plugins::Loaded;
use eggtimer_base::plugin_settings::PluginEntry;
use eggtimer_store::TaskRecord;

/// Payloads one check call reads (each call has the plugin's time limit).
const CHECK_CHUNK: usize = 500;

/// Refusals a 409 lists.
const FIRST: usize = 10;

/// What a version's check said of the waiting tasks.
#[derive(Debug, Default)]
pub struct Findings {
    pub checked: u64,
    pub failing: u64,
    /// (task id, the check's message) of the first ones refused.
    pub examples: Vec<(String, String)>,
}

/// Checks every waiting task of `loaded`'s plugin with `loaded` (one shard after another, a
/// chunk at a time: other teams' checks take their turns between the chunks): its records, then
/// its tasks in the far tier.
pub async fn check_waiting(st: &AppState, loaded: Arc<Loaded>) -> ApiResult<Findings> {
    let mut found = Findings::default();
    for shard in 0..st.store.shards() {
        let mut cursor = 0;
        loop {
            let (tasks, next) = st.store.waiting_chunk(shard, &loaded.name, cursor).await?;
            check_chunk(st, &loaded, &tasks, &mut found).await?;
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let mut cursor = 0;
        loop {
            let (tasks, next) = st
                .store
                .far_waiting_chunk(shard, &loaded.name, cursor)
                .await?;
            check_chunk(st, &loaded, &tasks, &mut found).await?;
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    found.examples.sort();
    Ok(found)
}

/// Checks the payloads of `tasks` with `loaded`, counting into `found`.
async fn check_chunk(
    st: &AppState,
    loaded: &Arc<Loaded>,
    tasks: &[TaskRecord],
    found: &mut Findings,
) -> ApiResult<()> {
    let plugins = st.registry.plugins();
    for chunk in tasks.chunks(CHECK_CHUNK) {
        let payloads = chunk.iter().map(|t| t.payload.clone()).collect();
        let verdicts = plugins
            .check_with(Arc::clone(loaded), payloads)
            .await
            .map_err(|e| {
                failed(
                    &format!("task {:?}", chunk[0].id),
                    &loaded.name,
                    e,
                    "it was not made current",
                )
            })?;
        found.checked += chunk.len() as u64;
        for (t, v) in chunk.iter().zip(verdicts) {
            if let Some(m) = v {
                found.failing += 1;
                if found.examples.len() < FIRST {
                    found.examples.push((t.id.clone(), m));
                }
            }
        }
    }
    Ok(())
}

/// The 409 of a version refused by its check of the waiting tasks (kept as a candidate).
pub fn incompatible(entry: &PluginEntry, found: &Findings) -> ApiError {
    let mut details = Map::new();
    details.insert("version".into(), json!(entry.version));
    details.insert("checked".into(), json!(found.checked));
    details.insert("failing".into(), json!(found.failing));
    details.insert(
        "examples".into(),
        Value::Array(
            found
                .examples
                .iter()
                .map(|(id, m)| json!({"id": id, "message": m}))
                .collect(),
        ),
    );
    ApiError::new(
        StatusCode::CONFLICT,
        "incompatible_payloads",
        format!(
            "v{} of {:?} can't read {} of the {} tasks waiting for it (the first: {}); it is kept \
             as a candidate: fix or cancel those tasks and POST /v1/plugins/{}/promote, or \
             deploy it anyway with ?force=true",
            entry.version,
            entry.name,
            found.failing,
            found.checked,
            found
                .examples
                .first()
                .map_or(String::new(), |(id, m)| format!("{id}: {m}")),
            entry.name,
        ),
    )
    .with_details(details)
    .concerning(&entry.name)
}

/// Makes `target` current if its check takes every waiting task (or `force`), and the current
/// version is still `expected`: the promotion and the rollback.
pub async fn make_current(
    st: &AppState,
    target: &PluginEntry,
    expected: Option<u64>,
    force: bool,
) -> ApiResult<PluginEntry> {
    let loaded = st
        .registry
        .version(target)
        .await
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_plugin", e))?;
    if loaded.has_check() && !force {
        let found = check_waiting(st, loaded).await?;
        if found.failing > 0 {
            return Err(incompatible(target, &found));
        }
    }
    use eggtimer_store::Promoted as P;
    match st
        .registry
        .promote(&target.name, target.version, expected)
        .await?
    {
        P::Done(e) => Ok(e),
        P::Missing => Err(ApiError::not_found(format!(
            "plugin {:?} has no version {}",
            target.name, target.version
        ))),
        P::Moved => Err(ApiError::conflict(format!(
            "another version of {:?} became current while v{} was checked; try again",
            target.name, target.version
        ))),
    }
}
