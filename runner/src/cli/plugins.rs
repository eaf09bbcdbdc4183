//! The plugin commands (`eggtimer plugin ...`, its secrets, its allowed hosts) as API calls.

use anyhow::{Context, Result, bail};
use eggtimer_client::{Client, segment as enc};
use reqwest::Method;
use serde_json::{Value, json};

use super::{Body, Call, View};
use crate::config::{PluginCmd, SecretCmd};

pub(super) fn plugin_call(cmd: PluginCmd) -> Result<Call> {
    let path = |name: &str, then: &str| format!("/v1/plugins/{}{then}", enc(name));
    Ok(match cmd {
        PluginCmd::Push {
            name,
            file,
            candidate,
            force,
        } => {
            let q = deploy_query(candidate, force);
            Call {
                body: Body::Wasm(file),
                ..Call::new(Method::PUT, path(&name, &q))
            }
        }
        PluginCmd::Promote {
            name,
            version,
            force,
        } => Call::new(
            Method::POST,
            path(&name, &format!("/promote{}", deploy_query(false, force))),
        )
        .json(json!({"version": version})),
        PluginCmd::List => Call::get("/v1/plugins").view(View::Plugins),
        PluginCmd::Get { name } => Call::get(path(&name, "")),
        PluginCmd::History { name } => Call::get(path(&name, "")).view(View::History),
        PluginCmd::Rollback { name } => Call::new(Method::POST, path(&name, "/rollback")),
        PluginCmd::Delete { name, cancel_tasks } => {
            let q = if cancel_tasks { "?tasks=cancel" } else { "" };
            Call::new(Method::DELETE, path(&name, q))
        }
        PluginCmd::Pause { name } => Call::new(Method::POST, path(&name, "/pause")),
        PluginCmd::Resume { name } => Call::new(Method::POST, path(&name, "/resume")),
        PluginCmd::MaySchedule { name, patterns } => {
            let patterns = (!patterns.is_empty()).then_some(patterns);
            Call::new(Method::PATCH, path(&name, "")).json(json!({"may_schedule": patterns}))
        }
        PluginCmd::Weight { name, weight } => {
            Call::new(Method::PATCH, path(&name, "")).json(json!({"weight": weight}))
        }
        PluginCmd::OwnerWeight {
            name,
            owner,
            weight,
            ..
        } => Call::new(
            Method::PUT,
            path(&name, &format!("/owners/{}", enc(&owner))),
        )
        .json(json!({"weight": weight})),
        PluginCmd::TimeLimit { name, limit, .. } => {
            let ms = limit.map(|d| d.as_millis() as u64);
            Call::new(Method::PATCH, path(&name, "")).json(json!({"time_limit_ms": ms}))
        }
        PluginCmd::CheckTimeLimit { name, limit, .. } => {
            let ms = limit.map(|d| d.as_millis() as u64);
            Call::new(Method::PATCH, path(&name, "")).json(json!({"check_time_limit_ms": ms}))
        }
        PluginCmd::Memory { name, bytes, .. } => {
            Call::new(Method::PATCH, path(&name, "")).json(json!({"memory_bytes": bytes}))
        }
        PluginCmd::MaxPending { name, max, .. } => {
            Call::new(Method::PATCH, path(&name, "")).json(json!({"max_pending": max}))
        }
        PluginCmd::OwnerMaxPending { name, max, .. } => {
            Call::new(Method::PATCH, path(&name, "")).json(json!({"max_pending_per_owner": max}))
        }
        PluginCmd::RateLimit { name, rate, .. } => {
            let rate = rate.map(|(max, per_ms)| json!({"max": max, "per_ms": per_ms}));
            Call::new(Method::PATCH, path(&name, "")).json(json!({"rate_limit": rate}))
        }
        PluginCmd::OwnerRateLimit { name, rate, .. } => {
            let rate = rate.map(|(max, per_ms)| json!({"max": max, "per_ms": per_ms}));
            Call::new(Method::PATCH, path(&name, "")).json(json!({"owner_rate_limit": rate}))
        }
        PluginCmd::OwnerLimit { name, max, .. } => Call::new(Method::PATCH, path(&name, ""))
            .json(json!({"max_concurrency_per_owner": max})),
        PluginCmd::Limit { name, max, .. } => {
            Call::new(Method::PATCH, path(&name, "")).json(json!({"max_concurrency": max}))
        }
        PluginCmd::AllowHosts { .. } => unreachable!("run() reads the list first"),
        PluginCmd::Config { name, entries } => {
            let map: serde_json::Map<String, Value> = entries
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect();
            Call::new(Method::PATCH, path(&name, "")).json(json!({"config": map}))
        }
        PluginCmd::Secret(cmd) => secret_call(cmd)?,
    })
}

/// `plugin allow-hosts`: reads the plugin's list, replaces it (or adds to it, or takes from it),
/// and says on stderr what changed, so a replace never drops an origin unsaid.
pub(super) async fn allow_hosts(
    r: &Client,
    name: &str,
    origins: Vec<String>,
    add: bool,
    remove: bool,
) -> Result<Value> {
    let path = format!("/v1/plugins/{}", enc(name));
    let list = |v: &Value| -> Vec<String> {
        v["allowed_hosts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|o| o.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = list(
        &r.call(Method::GET, &path, eggtimer_client::Body::None)
            .await?,
    );
    let after: Vec<String> = if add {
        let mut l = before.clone();
        l.extend(origins.into_iter().filter(|o| !before.contains(o)));
        l
    } else if remove {
        before
            .iter()
            .filter(|o| !origins.contains(o))
            .cloned()
            .collect()
    } else {
        origins
    };
    let body = eggtimer_client::Body::Json(json!({"allowed_hosts": after}));
    let out = r.call(Method::PATCH, &path, body).await?;
    let now = list(&out);
    let added: Vec<&str> = now
        .iter()
        .filter(|o| !before.contains(o))
        .map(String::as_str)
        .collect();
    let dropped: Vec<&str> = before
        .iter()
        .filter(|o| !now.contains(o))
        .map(String::as_str)
        .collect();
    let said = |what: &str, l: &[&str]| (!l.is_empty()).then(|| format!("{what} {}", l.join(", ")));
    let changes: Vec<String> = [said("added", &added), said("removed", &dropped)]
        .into_iter()
        .flatten()
        .collect();
    eprintln!(
        "{name} may call {}{}",
        if now.is_empty() {
            "no host".to_owned()
        } else {
            now.join(", ")
        },
        if changes.is_empty() {
            " (unchanged)".to_owned()
        } else {
            format!(" ({})", changes.join("; "))
        }
    );
    Ok(out)
}

/// `?promote=false` and `?force=true` of a push or promotion.
fn deploy_query(candidate: bool, force: bool) -> String {
    match (candidate, force) {
        (false, false) => String::new(),
        (true, false) => "?promote=false".into(),
        (false, true) => "?force=true".into(),
        (true, true) => "?promote=false&force=true".into(),
    }
}

fn secret_call(cmd: SecretCmd) -> Result<Call> {
    let path = |name: &str, key: &str| {
        let key = if key.is_empty() {
            String::new()
        } else {
            format!("/{}", enc(key))
        };
        format!("/v1/plugins/{}/secrets{key}", enc(name))
    };
    Ok(match cmd {
        SecretCmd::Set { name, key, value } => {
            let value = match value {
                Some(v) => v,
                None => {
                    let mut line = String::new();
                    std::io::stdin()
                        .read_line(&mut line)
                        .context("reading the secret from standard input")?;
                    line.trim_end_matches(['\n', '\r']).to_owned()
                }
            };
            if value.is_empty() {
                bail!(
                    "the secret {key:?} is empty: give its value as the last argument or on \
                     standard input (`eggtimer plugin secret set {name} {key} < file`)"
                );
            }
            Call::new(Method::PUT, path(&name, &key)).json(json!({"value": value}))
        }
        SecretCmd::Delete { name, key } => Call::new(Method::DELETE, path(&name, &key)),
        SecretCmd::List { name } => Call::get(path(&name, "")),
    })
}
