//! The command-line client for business teams: `eggtimer plugin|task|owner|dead ...`, speaking
//! the HTTP API of a running eggtimer. Prints the reply's JSON; exits non-zero on an error reply.

use anyhow::{Context, Result};
use eggtimer_client::{Client, segment as enc};
use reqwest::Method;
use serde_json::{Value, json};

mod plugins;
mod tasks;

use plugins::{allow_hosts, plugin_call};
use tasks::{dead_call, owner_call, task_call};

use crate::config::{
    Command, EventCmd, KeyCmd, PluginCmd, RemoteArgs, ScheduleCmd, SourceCmd, TaskCmd,
    parse_duration,
};

/// The client of the eggtimer that `--url` names, with the token of `RemoteArgs`.
fn client(r: &RemoteArgs) -> Result<Client> {
    Ok(Client::new(&r.url).token(r.bearer()?))
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
    Schedule,
    Keys,
    Audit,
    History,
    OwnerStats,
}

/// What a command sends.
enum Body {
    None,
    Json(Value),
    /// A plugin binary, read from this file.
    Wasm(std::path::PathBuf),
}

/// One command as an API call: its method, path, body and how its reply is shown. A find
/// (`pages`) reads on through short pages from a cursor until it has this many tasks.
struct Call {
    method: Method,
    path: String,
    body: Body,
    view: View,
    pages: Option<(Option<String>, usize)>,
}

impl Call {
    fn new(method: Method, path: impl Into<String>) -> Call {
        Call {
            method,
            path: path.into(),
            body: Body::None,
            view: View::Json,
            pages: None,
        }
    }

    fn get(path: impl Into<String>) -> Call {
        Call::new(Method::GET, path)
    }

    fn json(mut self, body: Value) -> Call {
        self.body = Body::Json(body);
        self
    }

    fn view(mut self, view: View) -> Call {
        self.view = view;
        self
    }
}

/// Runs one client command.
pub async fn run(cmd: Command) -> Result<()> {
    let (remote, call) = match cmd {
        Command::Serve(_) | Command::CompilePlugin => unreachable!("not a client command"),
        Command::Runners { remote } => (remote, Call::get("/v1/runners").view(View::Runners)),
        Command::Task {
            remote,
            cmd:
                TaskCmd::DryRun {
                    id,
                    plugin,
                    wasm: Some(wasm),
                    ..
                },
        } => {
            let r = client(&remote)?;
            let out = crate::dry_local::run(&r, &id, plugin.as_deref(), &wasm).await?;
            return show(&out, View::Json);
        }
        Command::Plugin {
            remote,
            cmd:
                PluginCmd::AllowHosts {
                    name,
                    origins,
                    add,
                    remove,
                    set: _,
                },
        } => {
            let r = client(&remote)?;
            let out = allow_hosts(&r, &name, origins, add, remove).await?;
            return show(&out, View::Json);
        }
        Command::Plugin { remote, cmd } => (remote, plugin_call(cmd)?),
        Command::Task { remote, cmd } => (remote, task_call(cmd)?),
        Command::Owner { remote, cmd } => (remote, owner_call(cmd)?),
        Command::Dead { remote, cmd } => (remote, dead_call(cmd)),
        Command::Event { remote, cmd } => (remote, event_call(cmd)?),
        Command::Source { remote, cmd } => (remote, source_call(cmd)),
        Command::Schedule { remote, cmd } => (remote, schedule_call(cmd)?),
        Command::Key { remote, cmd } => (remote, key_call(cmd)),
        Command::Audit {
            remote,
            key,
            plugin,
            limit,
        } => {
            let q: Vec<String> = [("key", key), ("plugin", plugin)]
                .into_iter()
                .filter_map(|(k, v)| Some(format!("&{k}={}", enc(&v?))))
                .collect();
            let path = format!("/v1/audit?limit={limit}{}", q.concat());
            (remote, Call::get(path).view(View::Audit))
        }
    };
    let r = client(&remote)?;
    let out = match (call.pages, call.body) {
        (Some((cursor, limit)), _) => find_pages(&r, &call.path, cursor, limit).await?,
        (None, body) => {
            let body = match body {
                Body::None => eggtimer_client::Body::None,
                Body::Json(v) => eggtimer_client::Body::Json(v),
                Body::Wasm(file) => eggtimer_client::Body::Wasm(
                    std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?,
                ),
            };
            match r.call(call.method, &call.path, body).await {
                Ok(v) => v,
                Err(eggtimer_client::Error::Api {
                    status,
                    code,
                    message,
                    error,
                }) => {
                    // a deploy refused by its check: the tasks it can't read, as a table
                    if code == "incompatible_payloads" {
                        eprint!("{}", crate::table::refused(&error));
                    }
                    anyhow::bail!("{status}: {}", in_cli_terms(&message, &error));
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    show(&out, if remote.json { View::Json } else { call.view })
}

/// An API error's advice in the CLI's own commands: the API names its routes and query
/// parameters (`POST /v1/plugins/orders/promote`, `?force=true`), a CLI user types commands.
fn in_cli_terms(message: &str, error: &Value) -> String {
    let mut m = message.to_owned();
    // the version refused is in the error's details
    let version = error["version"]
        .as_u64()
        .map_or("VERSION".into(), |v| v.to_string());
    route_to_command(&mut m, "POST /v1/plugins/", "/promote", |name| {
        format!("`eggtimer plugin promote {name} {version}`")
    });
    route_to_command(&mut m, "DELETE /v1/plugins/", "?tasks=cancel", |name| {
        format!("`eggtimer plugin delete {name} --cancel-tasks`")
    });
    m.replace("with ?force=true", "with --force")
        .replace("name one with ?plugin=", "name one with --plugin PLUGIN")
}

/// Replaces the first `<before>NAME<after>` in `m` with `command(NAME)`.
fn route_to_command(m: &mut String, before: &str, after: &str, command: impl Fn(&str) -> String) {
    if let Some(at) = m.find(before)
        && let Some(len) = m[at..].find(after)
    {
        let name = m[at + before.len()..at + len].to_owned();
        m.replace_range(at..at + len + after.len(), &command(&name));
    }
}

/// Prints a reply (nothing for an empty one): as a table, or as JSON.
fn show(out: &Value, view: View) -> Result<()> {
    let text = match view {
        _ if out.is_null() => return Ok(()),
        View::Json => None,
        View::Plugins => Some(crate::table::plugins(out)),
        View::Tasks => Some(crate::table::tasks(out)),
        View::Task => Some(crate::table::task(out)),
        View::Runners => Some(crate::table::runners(out)),
        View::Schedules => Some(crate::table::schedules(out)),
        View::Schedule => Some(crate::table::schedule(out)),
        View::Keys => Some(crate::table::keys(out)),
        View::Audit => Some(crate::table::audit(out)),
        View::History => Some(crate::table::history(out)),
        View::OwnerStats => Some(crate::table::owner_stats(out)),
    };
    let text = match text {
        Some(t) => t,
        None => serde_json::to_string_pretty(out)? + "\n",
    };
    // a reader that stopped early (`| head`) is not an error
    use std::io::Write;
    match std::io::stdout().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn key_call(cmd: KeyCmd) -> Call {
    match cmd {
        KeyCmd::Create {
            name,
            role,
            plugins,
            max_plugins,
            max_pending,
            task_bytes,
            event_bytes,
            kv_bytes,
            emitted_bytes,
            publish,
            listen,
            streams,
        } => {
            eprintln!("the key's secret (\"key\") is shown this once: Redis keeps only its hash");
            let mut body = json!({"name": name, "role": role, "plugins": plugins,
                                  "publish": publish, "listen": listen, "streams": streams});
            if let Some(m) = max_plugins {
                body["max_plugins"] = json!(m);
            }
            if let Some(m) = max_pending {
                body["max_pending"] = json!(m);
            }
            if let Some(m) = task_bytes {
                body["task_bytes"] = json!(m);
            }
            for (field, m) in [
                ("event_bytes", event_bytes),
                ("kv_bytes", kv_bytes),
                ("emitted_bytes", emitted_bytes),
            ] {
                if let Some(m) = m {
                    body[field] = json!(m);
                }
            }
            Call::new(Method::POST, "/v1/keys").json(body)
        }
        KeyCmd::Update {
            id,
            name,
            role,
            plugins,
            max_plugins,
            max_pending,
            task_bytes,
            event_bytes,
            kv_bytes,
            emitted_bytes,
            publish,
            listen,
            streams,
        } => {
            let mut body = json!({});
            let lists = [
                ("plugins", plugins),
                ("publish", publish),
                ("listen", listen),
                ("streams", streams),
            ];
            for (field, list) in lists {
                if let Some(l) = list {
                    let l: Vec<String> = l.into_iter().filter(|p| !p.is_empty()).collect();
                    body[field] = json!(l);
                }
            }
            for (field, v) in [("name", name), ("role", role)] {
                if let Some(v) = v {
                    body[field] = json!(v);
                }
            }
            let limits = [
                ("max_plugins", max_plugins),
                ("max_pending", max_pending),
                ("task_bytes", task_bytes),
                ("event_bytes", event_bytes),
                ("kv_bytes", kv_bytes),
                ("emitted_bytes", emitted_bytes),
            ];
            for (field, v) in limits {
                if let Some(v) = v {
                    // `none` removes the limit; anything else goes as written, for the API to
                    // check (a number written as text is refused there, saying so)
                    body[field] = match v.as_str() {
                        "none" => Value::Null,
                        n => n.parse::<u64>().map_or(json!(n), |n| json!(n)),
                    };
                }
            }
            Call::new(Method::PATCH, format!("/v1/keys/{}", enc(&id))).json(body)
        }
        KeyCmd::List => Call::get("/v1/keys").view(View::Keys),
        KeyCmd::Revoke { id } => Call::new(Method::DELETE, format!("/v1/keys/{}", enc(&id))),
    }
}

/// A duration flag as whole milliseconds (the API bounds it: the exact value is sent, never a
/// wrapped one).
fn millis(flag: &str, text: &str) -> Result<Value> {
    let ms = parse_duration(text)
        .map_err(|e| anyhow::anyhow!("{flag}: {e}"))?
        .as_millis();
    Ok(json!(u64::try_from(ms).unwrap_or(u64::MAX)))
}

/// A JSON object of the given fields that are set.
fn fields(pairs: Vec<(&str, Option<Value>)>) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_owned(), v?)))
            .collect(),
    )
}

fn payload(text: &str) -> Result<Value> {
    serde_json::from_str(text).context("--payload must be JSON")
}

fn event_call(cmd: EventCmd) -> Result<Call> {
    Ok(match cmd {
        EventCmd::Send { topic, key, data } => {
            let data: Value = serde_json::from_str(&data).context("--data must be JSON")?;
            Call::new(Method::POST, format!("/v1/events/{}", enc(&topic)))
                .json(json!({"key": key, "data": data}))
        }
        EventCmd::List {
            topic,
            plugin,
            limit,
        } => {
            let plugin = plugin
                .map(|p| format!("&plugin={}", enc(&p)))
                .unwrap_or_default();
            Call::get(format!("/v1/events/{}?limit={limit}{plugin}", enc(&topic)))
        }
    })
}

fn source_call(cmd: SourceCmd) -> Call {
    match cmd {
        SourceCmd::Add {
            name,
            stream,
            plugin,
            emitted,
            key_field,
            topic,
        } => {
            let topic = topic.unwrap_or_else(|| name.clone());
            let mut body = json!({"name": name, "key_field": key_field, "topic": topic});
            for (field, v) in [("stream", stream), ("plugin", plugin), ("emitted", emitted)] {
                if let Some(v) = v {
                    body[field] = json!(v);
                }
            }
            Call::new(Method::POST, "/v1/sources").json(body)
        }
        SourceCmd::List => Call::get("/v1/sources"),
        SourceCmd::Remove { name } => {
            Call::new(Method::DELETE, format!("/v1/sources/{}", enc(&name)))
        }
    }
}

fn schedule_call(cmd: ScheduleCmd) -> Result<Call> {
    let path = |id: &str, then: &str| format!("/v1/schedules/{}{then}", enc(id));
    Ok(match cmd {
        ScheduleCmd::Put {
            id,
            plugin,
            cron,
            every,
            tz,
            payload: p,
            owner,
            overlap,
            max_attempts,
            priority,
        } => Call::new(Method::PUT, path(&id, "")).json(fields(vec![
            ("plugin", Some(json!(plugin))),
            ("payload", Some(payload(&p)?)),
            ("cron", cron.map(|c| json!(c))),
            (
                "every_ms",
                every.map(|e| millis("--every", &e)).transpose()?,
            ),
            ("tz", tz.map(|v| json!(v))),
            ("owner", owner.map(|v| json!(v))),
            ("overlap", overlap.map(|v| json!(v))),
            ("max_attempts", max_attempts.map(|v| json!(v))),
            ("priority", priority.map(|v| json!(v))),
        ])),
        ScheduleCmd::List => Call::get("/v1/schedules").view(View::Schedules),
        ScheduleCmd::Get { id } => Call::get(path(&id, "")).view(View::Schedule),
        ScheduleCmd::Pause { id } => Call::new(Method::POST, path(&id, "/pause")),
        ScheduleCmd::Resume { id } => Call::new(Method::POST, path(&id, "/resume")),
        ScheduleCmd::Delete { id } => Call::new(Method::DELETE, path(&id, "")),
    })
}

/// `GET path` (a find) from `cursor`, reading on while pages come back short with a next cursor
/// (a filter no index serves, such as scheduled tasks of one plugin, can leave a page short or
/// empty) until `limit` tasks are in or 20 pages were read: one answer, with the last cursor.
async fn find_pages(r: &Client, path: &str, cursor: Option<String>, limit: usize) -> Result<Value> {
    let (mut tasks, mut at) = (Vec::new(), cursor);
    for _ in 0..20 {
        let page_path = match &at {
            Some(c) => format!("{path}&cursor={}", enc(c)),
            None => path.to_owned(),
        };
        let mut v = r
            .call(Method::GET, &page_path, eggtimer_client::Body::None)
            .await?;
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
