//! The commands on tasks (`eggtimer task ...`), an owner's tasks (`eggtimer owner ...`) and dead
//! letters (`eggtimer dead ...`) as API calls.

use anyhow::{Result, bail};
use eggtimer_client::segment as enc;
use reqwest::Method;
use serde_json::{Value, json};

use super::{Call, View, fields, millis, payload};
use crate::config::{DeadCmd, OwnerCmd, TaskCmd, parse_signed_ms};

/// `--on TOPIC:KEY:THEN` as a listener (a topic holds no `:`; a key may).
fn listener(text: &str) -> Result<Value> {
    let bad = || anyhow::anyhow!("--on {text:?}: write TOPIC:KEY:cancel or TOPIC:KEY:run");
    let (topic, rest) = text.split_once(':').ok_or_else(bad)?;
    let (key, then) = rest.rsplit_once(':').ok_or_else(bad)?;
    if !matches!(then, "cancel" | "run") || topic.is_empty() || key.is_empty() {
        return Err(bad());
    }
    Ok(json!({"topic": topic, "key": key, "then": then}))
}

pub(super) fn task_call(cmd: TaskCmd) -> Result<Call> {
    let path = |id: &str, then: &str, plugin: Option<String>| {
        format!("/v1/tasks/{}{then}{}", enc(id), plugin_query(plugin))
    };
    Ok(match cmd {
        TaskCmd::Add {
            plugin,
            payload: p,
            at,
            r#in,
            id,
            owner,
            max_attempts,
            start_by,
            unique_for,
            on,
            lookback,
            debounce,
            quiet,
            max_wait,
            traceparent,
            priority,
        } => {
            let on = on
                .iter()
                .map(|l| listener(l))
                .collect::<Result<Vec<Value>>>()?;
            let debounce = match debounce {
                None => None,
                Some(key) => Some(json!({
                    "key": key,
                    "quiet_ms": millis("--quiet", quiet.as_deref().unwrap_or_default())?,
                    "max_wait_ms": millis("--max-wait", max_wait.as_deref().unwrap_or("1h"))?,
                })),
            };
            Call::new(Method::POST, "/v1/tasks").json(fields(vec![
                ("plugin", Some(json!(plugin))),
                ("payload", Some(payload(&p)?)),
                ("run_at", at.map(|t| json!(t))),
                ("delay_ms", r#in.map(|d| millis("--in", &d)).transpose()?),
                ("id", id.map(|v| json!(v))),
                ("owner", owner.map(|v| json!(v))),
                ("max_attempts", max_attempts.map(|v| json!(v))),
                ("start_by", start_by.map(|v| json!(v))),
                (
                    "unique_for_ms",
                    unique_for.map(|d| millis("--unique-for", &d)).transpose()?,
                ),
                ("on", (!on.is_empty()).then(|| json!(on))),
                (
                    "lookback_ms",
                    lookback.map(|d| millis("--lookback", &d)).transpose()?,
                ),
                ("debounce", debounce),
                ("traceparent", traceparent.map(|t| json!(t))),
                ("priority", priority.map(|v| json!(v))),
            ]))
        }
        TaskCmd::Find {
            plugin,
            state,
            owner,
            due_after,
            due_before,
            limit,
            cursor,
        } => {
            let q: Vec<String> = [
                ("plugin", plugin),
                ("state", state),
                ("owner", owner),
                ("due_after", due_after.map(|t| t.to_string())),
                ("due_before", due_before.map(|t| t.to_string())),
                ("limit", limit.map(|n| n.to_string())),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some(format!("{k}={}", enc(&v?))))
            .collect();
            Call {
                pages: Some((cursor, limit.unwrap_or(100) as usize)),
                ..Call::get(format!("/v1/tasks?{}", q.join("&"))).view(View::Tasks)
            }
        }
        TaskCmd::Get { id, plugin } => Call::get(path(&id, "", plugin)).view(View::Task),
        TaskCmd::Cancel { id, plugin } => Call::new(Method::DELETE, path(&id, "", plugin)),
        TaskCmd::Run { id, plugin } => Call::new(Method::POST, path(&id, "/run", plugin)),
        TaskCmd::DryRun {
            id,
            plugin,
            version,
            wasm: None,
        } => {
            Call::new(Method::POST, path(&id, "/dry-run", plugin)).json(json!({"version": version}))
        }
        TaskCmd::DryRun { wasm: Some(_), .. } => unreachable!("run locally"),
        TaskCmd::Move { id, plugin, at, by } => {
            let body = match (at, by) {
                (Some(t), None) => json!({"run_at": t}),
                (None, Some(b)) => {
                    json!({"shift_ms": parse_signed_ms(&b).map_err(anyhow::Error::msg)?})
                }
                _ => bail!("give --at T or --by DURATION"),
            };
            Call::new(Method::PATCH, path(&id, "", plugin)).json(body)
        }
    })
}

/// `?plugin=P` when a plugin is given.
fn plugin_query(plugin: Option<String>) -> String {
    plugin
        .map(|p| format!("?plugin={}", enc(&p)))
        .unwrap_or_default()
}

pub(super) fn owner_call(cmd: OwnerCmd) -> Result<Call> {
    let path = |owner: &str, then: &str| format!("/v1/owners/{}{then}", enc(owner));
    Ok(match cmd {
        OwnerCmd::Shift { owner, by, plugin } => {
            let shift = parse_signed_ms(&by).map_err(anyhow::Error::msg)?;
            Call::new(Method::POST, path(&owner, "/shift")).json(fields(vec![
                ("shift_ms", Some(json!(shift))),
                ("plugin", plugin.map(|p| json!(p))),
            ]))
        }
        OwnerCmd::Cancel { owner, plugin } => Call::new(
            Method::DELETE,
            path(&owner, &format!("/tasks{}", plugin_query(plugin))),
        ),
        OwnerCmd::List { owner } => Call::get(path(&owner, "/tasks")).view(View::Tasks),
        OwnerCmd::Stats { owner } => Call::get(path(&owner, "/stats")).view(View::OwnerStats),
        OwnerCmd::Pause { owner, plugin } => Call::new(Method::POST, path(&owner, "/pause"))
            .json(fields(vec![("plugin", plugin.map(|p| json!(p)))])),
        OwnerCmd::Resume { owner, plugin } => Call::new(Method::POST, path(&owner, "/resume"))
            .json(fields(vec![("plugin", plugin.map(|p| json!(p)))])),
    })
}

pub(super) fn dead_call(cmd: DeadCmd) -> Call {
    match cmd {
        DeadCmd::List { limit } => Call::get(format!("/v1/dead?limit={limit}")).view(View::Tasks),
        DeadCmd::Retry { id, plugin } => Call::new(
            Method::POST,
            format!("/v1/dead/{}/retry{}", enc(&id), plugin_query(plugin)),
        ),
        DeadCmd::Drop { id, plugin } => Call::new(
            Method::DELETE,
            format!("/v1/dead/{}{}", enc(&id), plugin_query(plugin)),
        ),
        DeadCmd::RetryAll { plugin } => {
            Call::new(Method::POST, "/v1/dead/retry").json(json!({"plugin": plugin}))
        }
        DeadCmd::DropAll { plugin } => {
            Call::new(Method::DELETE, format!("/v1/dead{}", plugin_query(plugin)))
        }
    }
}
