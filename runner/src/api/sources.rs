//! Sources (`/v1/sources`): a team's Redis Stream read into events of a topic its key may
//! publish to (see `store::sources`).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::body::{self, ApiResult, field};
use super::{ApiError, AppState, doc};
use crate::api::auth::Who;
use eggtimer_store::Source;

/// A source to add.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSource {
    /// 1 to 64 of `a-z 0-9 -`.
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    name: String,
    /// The Redis Stream to read (1 to 200 bytes without control characters; not one of
    /// eggtimer's own keys). Name a stream or a `plugin`, not both.
    #[serde(default, deserialize_with = "field::id")]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    stream: Option<String>,
    /// Read the events this plugin emits (to the topic `emitted`) instead of a stream: a plugin
    /// the caller's key may act on. Each event's data is what the plugin emitted, its key the
    /// data's member `key_field` (a string or an integer).
    #[serde(default, deserialize_with = "field::plugin")]
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    plugin: Option<String>,
    /// With `plugin`: the topic it emits to (default: `topic`).
    #[serde(default, deserialize_with = "field::string")]
    #[schema(pattern = "^[a-z0-9._-]{1,64}$")]
    emitted: Option<String>,
    /// The entry field (with `plugin`: the member of the emitted data) whose value is the
    /// event's key.
    #[serde(deserialize_with = "field::required_id")]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    key_field: String,
    /// The topic its events are published to: one the caller's key may publish to.
    #[schema(pattern = "^[a-z0-9._-]{1,64}$")]
    topic: String,
}

/// `POST /v1/sources`: reads `stream` into events of `topic` from now on (each entry's fields
/// are the event's data, `key_field`'s value its key), on every runner; or, with `plugin`, the
/// events that plugin emits to `emitted` (a plugin's emitted events driving tasks, where the
/// key may both act on the plugin and publish to the topic).
#[utoipa::path(post, path = "/v1/sources", tag = "events",
    request_body(content = NewSource, content_type = "application/json"),
    responses((status = 201, description = "the source", body = Source), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn source_add(
    State(st): State<AppState>,
    Who(caller): Who,
    headers: HeaderMap,
    body: axum::body::Body,
) -> ApiResult<Response> {
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, 64 << 10).await?;
    let n: NewSource = body::typed(body::raw(&bytes)?)?;
    if !eggtimer_base::names::valid_plugin_name(&n.name) {
        return Err(ApiError::bad(format!(
            "{:?} is not a source name: 1 to 64 of a-z 0-9 -",
            n.name
        )));
    }
    if !eggtimer_base::names::valid_topic(&n.topic) {
        return Err(ApiError::bad(format!(
            "{:?} is not a topic: 1 to 64 of a-z 0-9 . _ -",
            n.topic
        )));
    }
    if let Some(why) = caller.refuses_topic(&n.topic, true) {
        return Err(ApiError::forbidden(why));
    }
    let stream = match (n.stream, &n.plugin) {
        (Some(stream), None) => {
            if n.emitted.is_some() {
                return Err(unprocessable(
                    "`emitted` goes with `plugin`, not with `stream`",
                ));
            }
            // eggtimer's own keys (other teams' tasks, events, kv) are no source of anyone's
            // events: a plugin's emitted events are read only through `plugin`
            let ns = st.store.keys().ns();
            if stream.starts_with(&format!("{{{ns}}}")) || stream.starts_with(&format!("{{{ns}:")) {
                return Err(ApiError::forbidden(format!(
                    "{stream:?} is one of eggtimer's own keys (namespace {ns:?}), not a stream of yours"
                )));
            }
            // a team reads the streams an admin granted its key, never another team's
            if let Some(why) = caller.refuses_stream(&stream) {
                return Err(ApiError::forbidden(why));
            }
            // asking creates nothing, and says no more of a key than that it is no stream
            match st.store.key_type(&stream).await?.as_str() {
                "stream" => {}
                "none" => {
                    return Err(unprocessable(&format!(
                        "there is no stream {stream:?}: a source reads a stream that exists"
                    )));
                }
                _ => return Err(unprocessable(&format!("{stream:?} is not a stream"))),
            }
            stream
        }
        (None, Some(plugin)) => {
            if let Some(why) = caller.refuses(plugin) {
                return Err(ApiError::forbidden(why));
            }
            let emitted = n.emitted.as_deref().unwrap_or(&n.topic);
            if !eggtimer_base::names::valid_topic(emitted) {
                return Err(ApiError::bad(format!(
                    "{emitted:?} is not a topic: 1 to 64 of a-z 0-9 . _ -"
                )));
            }
            st.store.keys().events(plugin, emitted)
        }
        (Some(_), Some(_)) => return Err(unprocessable("name a `stream` or a `plugin`, not both")),
        (None, None) => return Err(unprocessable("name a `stream` or a `plugin` to read")),
    };
    let s = Source {
        name: n.name,
        stream,
        plugin: n.plugin,
        key_field: n.key_field,
        topic: n.topic,
        created_at: st.store.clock().now_ms(),
    };
    if let Some(old) = st
        .store
        .source_list()
        .await?
        .into_iter()
        .find(|o| o.name == s.name)
        && caller.refuses_topic(&old.topic, true).is_some()
    {
        return Err(ApiError::forbidden(format!(
            "source {:?} publishes to {:?}, which this key may not publish to",
            old.name, old.topic
        )));
    }
    st.store.source_put(&s).await.map_err(|e| {
        // Redis's own words stay in the runner's log
        tracing::warn!(stream = %s.stream, "adding a source: {e:#}");
        unprocessable(&format!("can't read {:?} as a stream", s.stream))
    })?;
    Ok((StatusCode::CREATED, axum::Json(s)).into_response())
}

/// `GET /v1/sources`: the sources publishing to topics the key may publish to or listen on.
#[utoipa::path(get, path = "/v1/sources", tag = "events",
    responses((status = 200, description = "by name", body = Vec<Source>), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn source_list(State(st): State<AppState>, Who(caller): Who) -> ApiResult<Response> {
    let list: Vec<Source> = st
        .store
        .source_list()
        .await?
        .into_iter()
        .filter(|s| {
            caller.refuses_topic(&s.topic, true).is_none()
                || caller.refuses_topic(&s.topic, false).is_none()
        })
        .collect();
    Ok(axum::Json(list).into_response())
}

/// `DELETE /v1/sources/{name}`: stops reading it (the stream stays).
#[utoipa::path(delete, path = "/v1/sources/{name}", tag = "events",
    params(("name" = String, Path, pattern = "^[a-z0-9][a-z0-9-]{0,63}$")),
    responses((status = 204, description = "removed"), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn source_delete(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    let Some(s) = st
        .store
        .source_list()
        .await?
        .into_iter()
        .find(|s| s.name == name)
    else {
        return Err(ApiError::not_found(format!("no source {name:?}")));
    };
    if let Some(why) = caller.refuses_topic(&s.topic, true) {
        return Err(ApiError::forbidden(why));
    }
    st.store.source_delete(&name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A well-formed source that names what it reads wrongly (422).
fn unprocessable(why: &str) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_source", why)
}
