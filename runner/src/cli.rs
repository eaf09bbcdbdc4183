//! The command-line client for business teams: `eggtimer plugin|task|owner|dead ...`, speaking
//! the HTTP API of a running eggtimer. Prints the reply's JSON; exits non-zero on an error reply.

use anyhow::{Context, Result, bail};
use reqwest::Method;
use serde_json::{Value, json};

use crate::config::{
    Command, DeadCmd, OwnerCmd, PluginCmd, RemoteArgs, ScheduleCmd, TaskCmd, parse_duration,
    parse_signed_ms,
};

struct Remote {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Remote {
    fn new(r: &RemoteArgs) -> Result<Remote> {
        Ok(Remote {
            http: reqwest::Client::builder().build()?,
            base: r.url.trim_end_matches('/').to_owned(),
            token: r.token.clone(),
        })
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        self.send(req, &method, path).await
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        method: &Method,
        path: &str,
    ) -> Result<Value> {
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {}{path}: is eggtimer running there?", self.base))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let v: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if !status.is_success() {
            let msg = v["error"]["message"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| v.to_string());
            bail!("{status}: {msg}");
        }
        Ok(v)
    }
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// How a reply is shown to a person (`--json` always prints the reply).
#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    Json,
    Plugins,
    Tasks,
    Task,
    Runners,
    Schedules,
}

/// Runs one client command.
pub async fn run(cmd: Command) -> Result<()> {
    let json_flag = match &cmd {
        Command::Serve(_) => false,
        Command::Plugin { remote, .. }
        | Command::Task { remote, .. }
        | Command::Owner { remote, .. }
        | Command::Schedule { remote, .. }
        | Command::Dead { remote, .. }
        | Command::Runners { remote } => remote.json,
    };
    let view = match &cmd {
        Command::Plugin {
            cmd: PluginCmd::List,
            ..
        } => View::Plugins,
        Command::Task {
            cmd: TaskCmd::Get { .. },
            ..
        } => View::Task,
        Command::Task {
            cmd: TaskCmd::Find { .. },
            ..
        }
        | Command::Owner {
            cmd: OwnerCmd::List { .. },
            ..
        }
        | Command::Dead {
            cmd: DeadCmd::List { .. },
            ..
        } => View::Tasks,
        Command::Schedule {
            cmd: ScheduleCmd::List,
            ..
        } => View::Schedules,
        Command::Runners { .. } => View::Runners,
        _ => View::Json,
    };
    let out = match cmd {
        Command::Runners { remote } => {
            Remote::new(&remote)?
                .call(Method::GET, "/v1/runners", None)
                .await?
        }
        Command::Serve(_) => unreachable!("not a client command"),
        Command::Plugin { remote, cmd } => {
            let r = Remote::new(&remote)?;
            match cmd {
                PluginCmd::Push { name, file } => {
                    let wasm = std::fs::read(&file)
                        .with_context(|| format!("reading {}", file.display()))?;
                    let path = format!("/v1/plugins/{}", enc(&name));
                    let mut req = r
                        .http
                        .put(format!("{}{path}", r.base))
                        .header("content-type", "application/wasm")
                        .body(wasm);
                    if let Some(t) = &r.token {
                        req = req.bearer_auth(t);
                    }
                    r.send(req, &Method::PUT, &path).await?
                }
                PluginCmd::List => r.call(Method::GET, "/v1/plugins", None).await?,
                PluginCmd::Get { name } => {
                    r.call(Method::GET, &format!("/v1/plugins/{}", enc(&name)), None)
                        .await?
                }
                PluginCmd::Rollback { name } => {
                    r.call(
                        Method::POST,
                        &format!("/v1/plugins/{}/rollback", enc(&name)),
                        None,
                    )
                    .await?
                }
                PluginCmd::Delete { name } => {
                    r.call(Method::DELETE, &format!("/v1/plugins/{}", enc(&name)), None)
                        .await?
                }
                PluginCmd::Pause { name } => {
                    r.call(
                        Method::POST,
                        &format!("/v1/plugins/{}/pause", enc(&name)),
                        None,
                    )
                    .await?
                }
                PluginCmd::Resume { name } => {
                    r.call(
                        Method::POST,
                        &format!("/v1/plugins/{}/resume", enc(&name)),
                        None,
                    )
                    .await?
                }
                PluginCmd::Limit { name, max, .. } => {
                    r.call(
                        Method::PATCH,
                        &format!("/v1/plugins/{}", enc(&name)),
                        Some(json!({"max_concurrency": max})),
                    )
                    .await?
                }
            }
        }
        Command::Task { remote, cmd } => {
            let r = Remote::new(&remote)?;
            match cmd {
                TaskCmd::Add {
                    plugin,
                    payload,
                    at,
                    r#in,
                    id,
                    owner,
                    max_attempts,
                } => {
                    let payload: Value =
                        serde_json::from_str(&payload).context("--payload must be JSON")?;
                    let mut spec = json!({"plugin": plugin, "payload": payload});
                    if let Some(t) = at {
                        spec["run_at"] = json!(t);
                    }
                    if let Some(d) = r#in {
                        // the API bounds it (10 years); send the exact value, never a wrapped one
                        let ms = parse_duration(&d).map_err(anyhow::Error::msg)?.as_millis();
                        spec["delay_ms"] = json!(u64::try_from(ms).unwrap_or(u64::MAX));
                    }
                    if let Some(id) = id {
                        spec["id"] = json!(id);
                    }
                    if let Some(o) = owner {
                        spec["owner"] = json!(o);
                    }
                    if let Some(m) = max_attempts {
                        spec["max_attempts"] = json!(m);
                    }
                    r.call(Method::POST, "/v1/tasks", Some(spec)).await?
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
                    let mut q = Vec::new();
                    for (k, v) in [
                        ("plugin", plugin),
                        ("state", state),
                        ("owner", owner),
                        ("due_after", due_after.map(|t| t.to_string())),
                        ("due_before", due_before.map(|t| t.to_string())),
                        ("limit", limit.map(|n| n.to_string())),
                    ] {
                        if let Some(v) = v {
                            q.push(format!("{k}={}", enc(&v)));
                        }
                    }
                    let path = format!("/v1/tasks?{}", q.join("&"));
                    find_pages(&r, &path, cursor, limit.unwrap_or(100) as usize).await?
                }
                TaskCmd::Get { id } => {
                    r.call(Method::GET, &format!("/v1/tasks/{}", enc(&id)), None)
                        .await?
                }
                TaskCmd::Cancel { id } => {
                    r.call(Method::DELETE, &format!("/v1/tasks/{}", enc(&id)), None)
                        .await?
                }
                TaskCmd::Run { id } => {
                    r.call(Method::POST, &format!("/v1/tasks/{}/run", enc(&id)), None)
                        .await?
                }
                TaskCmd::Move { id, at, by } => {
                    let body = match (at, by) {
                        (Some(t), None) => json!({"run_at": t}),
                        (None, Some(b)) => {
                            json!({"shift_ms": parse_signed_ms(&b).map_err(anyhow::Error::msg)?})
                        }
                        _ => bail!("give --at T or --by DURATION"),
                    };
                    r.call(
                        Method::PATCH,
                        &format!("/v1/tasks/{}", enc(&id)),
                        Some(body),
                    )
                    .await?
                }
            }
        }
        Command::Owner { remote, cmd } => {
            let r = Remote::new(&remote)?;
            match cmd {
                OwnerCmd::Shift { owner, by, plugin } => {
                    let mut body =
                        json!({"shift_ms": parse_signed_ms(&by).map_err(anyhow::Error::msg)?});
                    if let Some(p) = plugin {
                        body["plugin"] = json!(p);
                    }
                    r.call(
                        Method::POST,
                        &format!("/v1/owners/{}/shift", enc(&owner)),
                        Some(body),
                    )
                    .await?
                }
                OwnerCmd::Cancel { owner, plugin } => {
                    let q = plugin
                        .map(|p| format!("?plugin={}", enc(&p)))
                        .unwrap_or_default();
                    r.call(
                        Method::DELETE,
                        &format!("/v1/owners/{}/tasks{q}", enc(&owner)),
                        None,
                    )
                    .await?
                }
                OwnerCmd::List { owner } => {
                    r.call(
                        Method::GET,
                        &format!("/v1/owners/{}/tasks", enc(&owner)),
                        None,
                    )
                    .await?
                }
            }
        }
        Command::Dead { remote, cmd } => {
            let r = Remote::new(&remote)?;
            match cmd {
                DeadCmd::List { limit } => {
                    r.call(Method::GET, &format!("/v1/dead?limit={limit}"), None)
                        .await?
                }
                DeadCmd::Retry { id } => {
                    r.call(Method::POST, &format!("/v1/dead/{}/retry", enc(&id)), None)
                        .await?
                }
                DeadCmd::Drop { id } => {
                    r.call(Method::DELETE, &format!("/v1/dead/{}", enc(&id)), None)
                        .await?
                }
                DeadCmd::RetryAll { plugin } => {
                    r.call(
                        Method::POST,
                        "/v1/dead/retry",
                        Some(json!({"plugin": plugin})),
                    )
                    .await?
                }
                DeadCmd::DropAll { plugin } => {
                    let q = plugin
                        .map(|p| format!("?plugin={}", enc(&p)))
                        .unwrap_or_default();
                    r.call(Method::DELETE, &format!("/v1/dead{q}"), None)
                        .await?
                }
            }
        }
        Command::Schedule { remote, cmd } => {
            let r = Remote::new(&remote)?;
            let path = |id: &str, then: &str| format!("/v1/schedules/{}{then}", enc(id));
            match cmd {
                ScheduleCmd::Put {
                    id,
                    plugin,
                    cron,
                    every,
                    tz,
                    payload,
                    owner,
                    overlap,
                    max_attempts,
                } => {
                    let payload: Value =
                        serde_json::from_str(&payload).context("--payload must be JSON")?;
                    let mut spec = json!({"plugin": plugin, "payload": payload});
                    if let Some(c) = cron {
                        spec["cron"] = json!(c);
                    }
                    if let Some(e) = every {
                        let ms = parse_duration(&e).map_err(anyhow::Error::msg)?.as_millis();
                        spec["every_ms"] = json!(u64::try_from(ms).unwrap_or(u64::MAX));
                    }
                    for (k, v) in [("tz", tz), ("owner", owner), ("overlap", overlap)] {
                        if let Some(v) = v {
                            spec[k] = json!(v);
                        }
                    }
                    if let Some(m) = max_attempts {
                        spec["max_attempts"] = json!(m);
                    }
                    r.call(Method::PUT, &path(&id, ""), Some(spec)).await?
                }
                ScheduleCmd::List => r.call(Method::GET, "/v1/schedules", None).await?,
                ScheduleCmd::Get { id } => r.call(Method::GET, &path(&id, ""), None).await?,
                ScheduleCmd::Pause { id } => {
                    r.call(Method::POST, &path(&id, "/pause"), None).await?
                }
                ScheduleCmd::Resume { id } => {
                    r.call(Method::POST, &path(&id, "/resume"), None).await?
                }
                ScheduleCmd::Delete { id } => r.call(Method::DELETE, &path(&id, ""), None).await?,
            }
        }
    };
    if out.is_null() {
        return Ok(());
    }
    let text = match view {
        _ if json_flag => None,
        View::Json => None,
        View::Plugins => Some(crate::table::plugins(&out)),
        View::Tasks => Some(crate::table::tasks(&out)),
        View::Task => Some(crate::table::task(&out)),
        View::Runners => Some(crate::table::runners(&out)),
        View::Schedules => Some(crate::table::schedules(&out)),
    };
    match text {
        Some(t) => print!("{t}"),
        None => println!("{}", serde_json::to_string_pretty(&out)?),
    }
    Ok(())
}

/// `GET path` (a find) from `cursor`, reading on while pages come back short with a next cursor
/// (a filter no index serves, such as scheduled tasks of one plugin, can leave a page short or
/// empty) until `limit` tasks are in or 20 pages were read: one answer, with the last cursor.
async fn find_pages(r: &Remote, path: &str, cursor: Option<String>, limit: usize) -> Result<Value> {
    let (mut tasks, mut at) = (Vec::new(), cursor);
    for _ in 0..20 {
        let page_path = match &at {
            Some(c) => format!("{path}&cursor={}", enc(c)),
            None => path.to_owned(),
        };
        let mut v = r.call(Method::GET, &page_path, None).await?;
        if let Some(page) = v["tasks"].as_array_mut() {
            tasks.append(page);
        }
        at = v["next_cursor"].as_str().map(str::to_owned);
        if at.is_none() || tasks.len() >= limit {
            break;
        }
    }
    Ok(serde_json::json!({"tasks": tasks, "next_cursor": at}))
}
