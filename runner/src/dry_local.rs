//! `eggtimer task dry-run <id> --wasm ./plugin.wasm`: a stored task (payload, attempt, owner, as
//! the API shows it) run here against a local build, with the runner's host: the same contract,
//! limits and answer as the API's dry run, nothing uploaded and nothing applied. Here its kv
//! reads see an empty store, its secrets read as placeholders, and its HTTP requests are
//! recorded, not sent.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use eggtimer_client::{Client, TaskState};
use futures::future::BoxFuture;
use serde_json::Value;

use crate::executor::TaskHost;
use crate::plugins::{PluginOptions, Plugins};
use eggtimer_store::Claimed;

/// A store with nothing in it but placeholders for secrets.
struct Empty;

impl TaskHost for Empty {
    fn kv_get<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async { Ok(None) })
    }

    fn secret<'a>(
        &'a self,
        _: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async move { Ok(Some(format!("dry-run-placeholder-of-{name}"))) })
    }
}

/// Runs task `id` (of `plugin`, where the key sees several) against the component in `wasm`.
pub async fn run(remote: &Client, id: &str, plugin: Option<&str>, wasm: &Path) -> Result<Value> {
    let bytes = std::fs::read(wasm).with_context(|| format!("reading {}", wasm.display()))?;
    let remote = match plugin {
        Some(p) => remote.in_plugin(p),
        None => remote.clone(),
    };
    let t = remote
        .get(id)
        .await?
        .ok_or_else(|| anyhow!("no task {id:?}"))?;
    let attempt = match t.state {
        TaskState::Dead | TaskState::Done => t.attempts.max(1),
        _ => t.attempts + 1,
    };
    let task = Claimed {
        id: eggtimer_store::task_key(&t.plugin, &t.id),
        shard: 0,
        token: 0,
        effects_claim: 0,
        attempt,
        due: t.run_at,
        max_attempts: t.max_attempts,
        plugin: t.plugin.clone(),
        owner: t.owner.clone(),
        payload: serde_json::to_string(&t.payload)?,
        created: t.created_at,
        traceparent: t.traceparent.clone(),
        start_by: None,
        event: t.event.as_ref().map(|e| e.to_string()),
        batch: t.batch.iter().map(|p| p.to_string()).collect(),
        priority: t.priority,
    };
    let plugins = Plugins::new(PluginOptions {
        workers: 1,
        warm_instances: 1,
        ..PluginOptions::default()
    })?;
    let (name, compiler) = (t.plugin.clone(), Arc::clone(&plugins));
    let loaded = tokio::task::spawn_blocking(move || compiler.compile(&name, &name, 0, &bytes))
        .await?
        .map_err(|e| anyhow!("{}: {e}", wasm.display()))?;
    let dry = plugins
        .dry_run(Arc::new(loaded), task, Arc::new(Empty), Vec::new())
        .await?;
    Ok(crate::api::dry_run_reply(
        &t.id, &t.plugin, 0, attempt, &dry,
    ))
}
