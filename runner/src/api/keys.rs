//! API keys (admin only): `POST/GET /v1/keys`, `PATCH/DELETE /v1/keys/{id}`. The audit of what
//! keys did is `audit`'s.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::body::{self, ApiResult, field};
use super::doc;
use super::error::ApiError;
use eggtimer_base::access::{
    KeyLimits, KeyRecord, MAX_PATTERNS, MAX_TASK_BYTES, Role, new_secret, secret_hash,
};
use eggtimer_base::limits;
use eggtimer_base::names::valid_pattern;
use eggtimer_store::MAX_MAX_PENDING;

/// Most a key's `max_plugins` may be.
const MAX_PLUGINS_OF_KEY: u64 = 100_000;

/// A new key.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewKey {
    /// Who holds it (a team, a service), 1 to 200 bytes.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    name: String,
    role: Role,
    /// Plugin patterns: a name, a prefix ending in `*`, or `*` for every plugin.
    #[schema(min_items = 1, max_items = 100, value_type = Vec<doc::PluginPattern>)]
    plugins: Vec<String>,
    /// Most plugins its patterns may hold (it uploads no new plugin past it).
    #[serde(default, deserialize_with = "field::int")]
    #[schema(value_type = Option<u32>, minimum = 0, maximum = 100000)]
    max_plugins: Option<i64>,
    /// Most tasks its plugins may hold together: each plugin it uploads gets what is left as
    /// the ceiling of its `max_pending`.
    #[serde(default, deserialize_with = "field::int")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1000000000)]
    max_pending: Option<i64>,
    /// Most bytes of tasks its plugins may make Redis hold together (payloads, listeners,
    /// debounced payloads); absent: the runner's `--team-task-bytes`.
    #[serde(default, deserialize_with = "field::int")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1099511627776_u64)]
    task_bytes: Option<i64>,
    /// Most bytes of events it may publish within the event retention; absent: the runner's
    /// `--events-max-bytes`.
    #[serde(default, deserialize_with = "field::int")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1099511627776_u64)]
    event_bytes: Option<i64>,
    /// Most bytes of kv keys and values its plugins' runs may keep together; absent: the
    /// runner's `--team-kv-bytes`.
    #[serde(default, deserialize_with = "field::int")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1099511627776_u64)]
    kv_bytes: Option<i64>,
    /// Most bytes of entries its plugins' emitted event streams may hold together; absent: the
    /// runner's `--team-emitted-bytes`.
    #[serde(default, deserialize_with = "field::int")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1099511627776_u64)]
    emitted_bytes: Option<i64>,
    /// Topic patterns it may publish events to (`POST /v1/events/{topic}`): a topic, a prefix
    /// ending in `*`, or `*`. None: it publishes nothing.
    #[serde(default)]
    #[schema(max_items = 100, value_type = Vec<doc::TopicPattern>)]
    publish: Vec<String>,
    /// Topic patterns its tasks may listen on (`on`), the same way.
    #[serde(default)]
    #[schema(max_items = 100, value_type = Vec<doc::TopicPattern>)]
    listen: Vec<String>,
    /// Redis Streams of the team's own it may read through a source (`POST /v1/sources` with
    /// `stream`): a stream name, a prefix ending in `*`, or `*` (1 to 200 bytes without control
    /// characters each). None: it reads no stream.
    #[serde(default)]
    #[schema(max_items = 100, value_type = Vec<doc::StreamPattern>)]
    streams: Vec<String>,
}

/// A key, without its secret.
#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyInfo {
    id: String,
    name: String,
    role: Role,
    plugins: Vec<String>,
    created_at: i64,
    /// Most plugins its patterns may hold (absent: no ceiling of the key's own).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_plugins: Option<u32>,
    /// Most tasks its plugins may hold together (absent: no ceiling of the key's own).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_pending: Option<u64>,
    /// Most bytes of tasks its plugins may make Redis hold together (absent: the runner's
    /// `--team-task-bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    task_bytes: Option<u64>,
    /// Most bytes of events it may publish within the event retention (absent: the runner's
    /// `--events-max-bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    event_bytes: Option<u64>,
    /// Most bytes of kv keys and values its plugins' runs may keep together (absent: the
    /// runner's `--team-kv-bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_bytes: Option<u64>,
    /// Most bytes of entries its plugins' emitted event streams may hold together (absent: the
    /// runner's `--team-emitted-bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    emitted_bytes: Option<u64>,
    /// Topic patterns it may publish events to (absent: none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    publish: Vec<String>,
    /// Topic patterns its tasks may listen on (absent: none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    listen: Vec<String>,
    /// Stream patterns it may read through a source (absent: none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    streams: Vec<String>,
    /// When a runner last took it (to the second), null if never.
    last_used_at: Option<i64>,
    /// How many of its requests were refused (any 4xx or 5xx: the audit keeps those apart),
    /// since it was made.
    refused: u64,
}

/// A key just made, with its secret: shown in this reply only.
#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyCreated {
    id: String,
    name: String,
    role: Role,
    plugins: Vec<String>,
    created_at: i64,
    /// Most plugins its patterns may hold (absent: no ceiling of the key's own).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_plugins: Option<u32>,
    /// Most tasks its plugins may hold together (absent: no ceiling of the key's own).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_pending: Option<u64>,
    /// Most bytes of tasks its plugins may make Redis hold together (absent: the runner's
    /// `--team-task-bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    task_bytes: Option<u64>,
    /// Most bytes of events it may publish within the event retention (absent: the runner's
    /// `--events-max-bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    event_bytes: Option<u64>,
    /// Most bytes of kv keys and values its plugins' runs may keep together (absent: the
    /// runner's `--team-kv-bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_bytes: Option<u64>,
    /// Most bytes of entries its plugins' emitted event streams may hold together (absent: the
    /// runner's `--team-emitted-bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    emitted_bytes: Option<u64>,
    /// Topic patterns it may publish events to (absent: none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    publish: Vec<String>,
    /// Topic patterns its tasks may listen on (absent: none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    listen: Vec<String>,
    /// Stream patterns it may read through a source (absent: none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    streams: Vec<String>,
    /// The bearer secret. Redis keeps only its hash: it can't be shown again.
    key: String,
}

#[utoipa::path(post, path = "/v1/keys", tag = "keys",
    request_body(content = NewKey, content_type = "application/json"),
    responses((status = 201, description = "the key, with its secret", body = KeyCreated), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn key_create(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, 64 << 10).await?;
    let k: NewKey = body::typed(body::raw(&bytes)?)?;
    limits::id("name", &k.name)?;
    check_plugins(&k.plugins)?;
    check_topics("publish", &k.publish)?;
    check_topics("listen", &k.listen)?;
    check_streams(&k.streams)?;
    let max_plugins = within("max_plugins", k.max_plugins, MAX_PLUGINS_OF_KEY)?;
    let max_pending = within("max_pending", k.max_pending, MAX_MAX_PENDING)?;
    let task_bytes = within("task_bytes", k.task_bytes, MAX_TASK_BYTES)?;
    let event_bytes = within("event_bytes", k.event_bytes, MAX_TASK_BYTES)?;
    let kv_bytes = within("kv_bytes", k.kv_bytes, MAX_TASK_BYTES)?;
    let emitted_bytes = within("emitted_bytes", k.emitted_bytes, MAX_TASK_BYTES)?;
    let (id, secret) = new_secret();
    let record = KeyRecord {
        id,
        name: k.name,
        role: k.role,
        plugins: k.plugins,
        created_at: st.store.clock().now_ms(),
        limits: KeyLimits {
            max_plugins: max_plugins.map(|n| n as u32),
            max_pending,
            task_bytes,
            event_bytes,
            kv_bytes,
            emitted_bytes,
        },
        topics: eggtimer_base::access::TopicRights {
            publish: k.publish,
            listen: k.listen,
            streams: k.streams,
        },
    };
    st.store.key_put(&record, &secret_hash(&secret)).await?;
    let created = KeyCreated {
        id: record.id,
        name: record.name,
        role: record.role,
        plugins: record.plugins,
        created_at: record.created_at,
        max_plugins: record.limits.max_plugins,
        max_pending: record.limits.max_pending,
        task_bytes: record.limits.task_bytes,
        event_bytes: record.limits.event_bytes,
        kv_bytes: record.limits.kv_bytes,
        emitted_bytes: record.limits.emitted_bytes,
        publish: record.topics.publish,
        listen: record.topics.listen,
        streams: record.topics.streams,
        key: secret,
    };
    Ok((StatusCode::CREATED, axum::Json(created)).into_response())
}

/// A key's plugin patterns: 1 to `MAX_PATTERNS` of them, each a pattern.
fn check_plugins(plugins: &[String]) -> ApiResult<()> {
    if plugins.is_empty() || plugins.len() > MAX_PATTERNS {
        return Err(ApiError::bad(format!(
            "plugins must list 1 to {MAX_PATTERNS} patterns (`*` for every plugin)"
        )));
    }
    if let Some(p) = plugins.iter().find(|p| !valid_pattern(p)) {
        return Err(ApiError::bad(format!(
            "plugins: {p:?} is not a pattern (a plugin name, a prefix ending in `*`, or `*`)"
        )));
    }
    Ok(())
}

/// A key's `publish` or `listen` topic patterns.
fn check_topics(field: &str, list: &[String]) -> ApiResult<()> {
    if list.len() > MAX_PATTERNS {
        return Err(ApiError::bad(format!(
            "{field} lists more than {MAX_PATTERNS} patterns"
        )));
    }
    if let Some(p) = list
        .iter()
        .find(|p| !eggtimer_base::names::valid_topic_pattern(p))
    {
        return Err(ApiError::bad(format!(
            "{field}: {p:?} is not a topic pattern (a topic of 1 to 64 of a-z 0-9 . _ -, a prefix ending in `*`, or `*`)"
        )));
    }
    Ok(())
}

/// A key's stream patterns.
fn check_streams(streams: &[String]) -> ApiResult<()> {
    if streams.len() > MAX_PATTERNS {
        return Err(ApiError::bad(format!(
            "streams lists more than {MAX_PATTERNS} patterns"
        )));
    }
    if let Some(p) = streams.iter().find(|p| !eggtimer_base::limits::id_like(p)) {
        return Err(ApiError::bad(format!(
            "streams: {p:?} is not a stream pattern (a stream name, a prefix ending in `*`, or `*`: 1 to 200 bytes without control characters)"
        )));
    }
    Ok(())
}

/// A key's limit within 0..=max (None: no limit).
fn within(field: &str, v: Option<i64>, max: u64) -> ApiResult<Option<u64>> {
    v.map(|n| {
        u64::try_from(n)
            .ok()
            .filter(|n| *n <= max)
            .ok_or_else(|| ApiError::bad(format!("{field} must be from 0 to {max}, got {n}")))
    })
    .transpose()
}

/// [`within`] for a limit a change may give (`Some(None)`: lift it).
fn given_within(field: &str, v: Option<Option<i64>>, max: u64) -> ApiResult<Option<Option<u64>>> {
    v.map(|v| within(field, v, max)).transpose()
}

/// A change of a key: each field given replaces the key's own, `null` removes a limit; what
/// is not given stays. Its id, secret and creation time never change.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KeyPatch {
    /// Who holds it (a team, a service), 1 to 200 bytes.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    name: Option<String>,
    #[serde(default)]
    role: Option<Role>,
    /// Plugin patterns: a name, a prefix ending in `*`, or `*` for every plugin.
    #[serde(default)]
    #[schema(min_items = 1, max_items = 100, value_type = Option<Vec<doc::PluginPattern>>)]
    plugins: Option<Vec<String>>,
    /// Most plugins its patterns may hold; `null`: no ceiling of the key's own.
    #[serde(default, deserialize_with = "given_int")]
    #[schema(value_type = Option<u32>, nullable = true, minimum = 0, maximum = 100000)]
    max_plugins: Option<Option<i64>>,
    /// Most tasks its plugins may hold together; `null`: no ceiling of the key's own. It
    /// shares out among the plugins the key uploads from now on: the plugins it holds keep the
    /// `max_pending` ceilings they were given (an admin changes those with `PATCH
    /// /v1/plugins/{name}`).
    #[serde(default, deserialize_with = "given_int")]
    #[schema(value_type = Option<u64>, nullable = true, minimum = 0, maximum = 1000000000)]
    max_pending: Option<Option<i64>>,
    /// Most bytes of tasks its plugins may make Redis hold together; `null`: the runner's
    /// `--team-task-bytes`. Tasks held already stay; new ones are refused past it.
    #[serde(default, deserialize_with = "given_int")]
    #[schema(value_type = Option<u64>, nullable = true, minimum = 0, maximum = 1099511627776_u64)]
    task_bytes: Option<Option<i64>>,
    /// Most bytes of events it may publish within the event retention; `null`: the runner's
    /// `--events-max-bytes`.
    #[serde(default, deserialize_with = "given_int")]
    #[schema(value_type = Option<u64>, nullable = true, minimum = 0, maximum = 1099511627776_u64)]
    event_bytes: Option<Option<i64>>,
    /// Most bytes of kv keys and values its plugins' runs may keep together; `null`: the
    /// runner's `--team-kv-bytes`. What is kept already stays; runs' writes past it are refused.
    #[serde(default, deserialize_with = "given_int")]
    #[schema(value_type = Option<u64>, nullable = true, minimum = 0, maximum = 1099511627776_u64)]
    kv_bytes: Option<Option<i64>>,
    /// Most bytes of entries its plugins' emitted event streams may hold together; `null`: the
    /// runner's `--team-emitted-bytes`. Each plugin trims its own streams to it as it writes.
    #[serde(default, deserialize_with = "given_int")]
    #[schema(value_type = Option<u64>, nullable = true, minimum = 0, maximum = 1099511627776_u64)]
    emitted_bytes: Option<Option<i64>>,
    /// Topic patterns it may publish events to (`[]`: none).
    #[serde(default)]
    #[schema(max_items = 100, value_type = Option<Vec<doc::TopicPattern>>)]
    publish: Option<Vec<String>>,
    /// Topic patterns its tasks may listen on (`[]`: none). Tasks that listen already keep
    /// listening.
    #[serde(default)]
    #[schema(max_items = 100, value_type = Option<Vec<doc::TopicPattern>>)]
    listen: Option<Vec<String>>,
    /// Redis Stream patterns it may read through a source (`[]`: none). Sources made already
    /// keep reading.
    #[serde(default)]
    #[schema(max_items = 100, value_type = Option<Vec<doc::StreamPattern>>)]
    streams: Option<Vec<String>>,
}

/// A field that may be given as `null` (to remove a limit): `Some(None)`; absent is `None`.
fn given_int<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<i64>>, D::Error> {
    field::int(d).map(Some)
}

/// A key as the API shows it.
fn info(k: KeyRecord, used: Option<i64>, refused: u64) -> KeyInfo {
    KeyInfo {
        id: k.id,
        name: k.name,
        role: k.role,
        plugins: k.plugins,
        created_at: k.created_at,
        max_plugins: k.limits.max_plugins,
        max_pending: k.limits.max_pending,
        task_bytes: k.limits.task_bytes,
        event_bytes: k.limits.event_bytes,
        kv_bytes: k.limits.kv_bytes,
        emitted_bytes: k.limits.emitted_bytes,
        publish: k.topics.publish,
        listen: k.topics.listen,
        streams: k.topics.streams,
        last_used_at: used,
        refused,
    }
}

#[utoipa::path(patch, path = "/v1/keys/{id}", tag = "keys", params(KeyId),
    request_body(content = KeyPatch, content_type = "application/json"),
    responses((status = 200, description = "the key as it is now: every runner takes the change within a second", body = KeyInfo), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn key_update(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    limits::id("the key id", &id)?;
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, 64 << 10).await?;
    let p: KeyPatch = body::typed(body::raw(&bytes)?)?;
    if let Some(n) = &p.name {
        limits::id("name", n)?;
    }
    if let Some(l) = &p.plugins {
        check_plugins(l)?;
    }
    check_topics("publish", p.publish.as_deref().unwrap_or_default())?;
    check_topics("listen", p.listen.as_deref().unwrap_or_default())?;
    check_streams(p.streams.as_deref().unwrap_or_default())?;
    let max_plugins = given_within("max_plugins", p.max_plugins, MAX_PLUGINS_OF_KEY)?;
    let max_pending = given_within("max_pending", p.max_pending, MAX_MAX_PENDING)?;
    let task_bytes = given_within("task_bytes", p.task_bytes, MAX_TASK_BYTES)?;
    let event_bytes = given_within("event_bytes", p.event_bytes, MAX_TASK_BYTES)?;
    let kv_bytes = given_within("kv_bytes", p.kv_bytes, MAX_TASK_BYTES)?;
    let emitted_bytes = given_within("emitted_bytes", p.emitted_bytes, MAX_TASK_BYTES)?;
    // a change made meanwhile by another admin is read again, never written over
    for _ in 0..8 {
        let Some((mut k, used, refused, was)) = st.store.key_by_id(&id).await? else {
            return Err(ApiError::not_found(format!("no key {id:?}")));
        };
        if let Some(n) = &p.name {
            k.name.clone_from(n);
        }
        if let Some(r) = p.role {
            k.role = r;
        }
        if let Some(l) = &p.plugins {
            k.plugins.clone_from(l);
        }
        if let Some(m) = max_plugins {
            k.limits.max_plugins = m.map(|n| n as u32);
        }
        if let Some(m) = max_pending {
            k.limits.max_pending = m;
        }
        if let Some(m) = task_bytes {
            k.limits.task_bytes = m;
        }
        if let Some(m) = event_bytes {
            k.limits.event_bytes = m;
        }
        if let Some(m) = kv_bytes {
            k.limits.kv_bytes = m;
        }
        if let Some(m) = emitted_bytes {
            k.limits.emitted_bytes = m;
        }
        for (to, from) in [
            (&mut k.topics.publish, &p.publish),
            (&mut k.topics.listen, &p.listen),
            (&mut k.topics.streams, &p.streams),
        ] {
            if let Some(l) = from {
                to.clone_from(l);
            }
        }
        if st.store.key_replace(&was, &k).await? {
            st.access.forget_keys();
            st.store.forget_team_budget(&id);
            return Ok(axum::Json(info(k, used, refused)).into_response());
        }
    }
    Err(ApiError::conflict(format!(
        "key {id:?} kept changing while this change was made: try again"
    )))
}

#[utoipa::path(get, path = "/v1/keys", tag = "keys",
    responses((status = 200, description = "every key, oldest first, without secrets", body = Vec<KeyInfo>), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn key_list(State(st): State<AppState>) -> ApiResult<Response> {
    let keys: Vec<KeyInfo> = st
        .store
        .key_list()
        .await?
        .into_iter()
        .map(|(k, used, refused)| info(k, used, refused))
        .collect();
    Ok(axum::Json(keys).into_response())
}

/// A key's id in the path.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct KeyId {
    /// As `POST /v1/keys` gave it.
    #[param(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    id: String,
}

#[utoipa::path(delete, path = "/v1/keys/{id}", tag = "keys", params(KeyId),
    responses((status = 204, description = "revoked: every runner refuses it within a second"), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn key_delete(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    limits::id("the key id", &id)?;
    if !st.store.key_delete(&id).await? {
        return Err(ApiError::not_found(format!("no key {id:?}")));
    }
    st.access.forget_keys();
    Ok(StatusCode::NO_CONTENT.into_response())
}
