//! Events in (`POST /v1/events/{topic}`) and debounced scheduling: the API side of
//! `store::events`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::value::RawValue;
use utoipa::ToSchema;
use utoipa::openapi::{Ref, RefOr, schema};

use super::body::{self, ApiResult, field};
use super::{ApiError, AppState, doc};
use crate::api::auth::Who;
use eggtimer_base::names::Topic;
use eggtimer_store::{Debounce, Event, Listener};

/// Most events one request publishes.
pub const MAX_EVENTS: usize = 1000;

/// One event (`{"key", "data"}`) or an array of 1 to 1,000.
#[derive(ToSchema, serde::Deserialize)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum EventBody<'a> {
    #[serde(borrow)]
    One(EventIn<'a>),
    #[serde(borrow)]
    Many(EventBatch<'a>),
}

/// 1 to 1,000 events.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
pub struct EventBatch<'a>(#[serde(borrow)] Vec<EventIn<'a>>);

impl utoipa::PartialSchema for EventBatch<'_> {
    fn schema() -> RefOr<schema::Schema> {
        schema::ArrayBuilder::new()
            .items(RefOr::Ref(Ref::from_schema_name("EventIn")))
            .min_items(Some(1))
            .max_items(Some(MAX_EVENTS))
            .description(Some("1 to 1,000 events"))
            .into()
    }
}

impl ToSchema for EventBatch<'_> {
    fn schemas(schemas: &mut Vec<(String, RefOr<schema::Schema>)>) {
        schemas.push((
            EventIn::name().into(),
            <EventIn as utoipa::PartialSchema>::schema(),
        ));
        <EventIn as ToSchema>::schemas(schemas);
    }
}

/// One event.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventIn<'a> {
    /// Which tasks it reaches: those listening on this topic with this key. 1 to 200 bytes
    /// without control characters.
    #[serde(deserialize_with = "field::required_id")]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    key: String,
    /// Any JSON, handed to the plugins of the tasks it starts (`task.event.data`).
    #[serde(borrow, default)]
    #[schema(value_type = Option<Value>)]
    data: Option<&'a RawValue>,
}

/// What a publish did.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct PublishReply {
    /// Events stored (kept for the lookback of tasks scheduled after them).
    published: u64,
    /// Tasks they cancelled or started (before this answer).
    matched: u64,
}

/// `POST /v1/events/{topic}`: one event or an array (up to 1,000), for the key's `publish`
/// topics.
#[utoipa::path(post, path = "/v1/events/{topic}", tag = "events",
    params(("topic" = String, Path, pattern = "^[a-z0-9._-]{1,64}$")),
    request_body(content = EventBody, content_type = "application/json"),
    responses((status = 200, description = "stored and delivered", body = PublishReply), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn publish(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> ApiResult<Response> {
    let topic = Topic::new(topic)?;
    // a key that may not publish here is refused before its body is read
    st.tasks.may_publish(&caller, &topic)?;
    body::require_content_type(&headers, "application/json")?;
    let bytes = body::read(body, st.max_body_bytes).await?;
    let v = body::raw(&bytes)?;
    let ins: Vec<EventIn> = if body::is_array(v) {
        body::typed_array(v, MAX_EVENTS, "the array of events")?
    } else {
        vec![body::typed(v)?]
    };
    if ins.is_empty() {
        return Err(ApiError::bad("the array of events is empty"));
    }
    let mut events = Vec::with_capacity(ins.len());
    for e in ins {
        let data = e.data.map_or("null", |d| d.get());
        eggtimer_base::limits::payload("data", data, st.max_payload_bytes)
            .map_err(|e| ApiError::too_large(e.0))?;
        events.push(Event {
            topic: topic.to_string(),
            key: e.key,
            data: data.to_owned(),
        });
    }
    let done = st
        .tasks
        .publish(&caller, &topic, &events, st.events_max_bytes)
        .await?;
    Ok(axum::Json(PublishReply {
        published: done.stored,
        matched: done.acted,
    })
    .into_response())
}

/// An event a task listens for.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ListenSpec {
    /// 1 to 64 of `a-z 0-9 . _ -`.
    #[schema(pattern = "^[a-z0-9._-]{1,64}$")]
    topic: String,
    /// 1 to 200 bytes without control characters.
    #[serde(deserialize_with = "field::required_id")]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    key: String,
    then: eggtimer_store::Then,
}

/// A debounce: the task's id is its key.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DebounceSpec {
    /// 1 to 200 bytes without control characters: the task's id.
    #[serde(deserialize_with = "field::required_id")]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    key: String,
    #[serde(deserialize_with = "field::required_duration")]
    #[schema(value_type = i64, minimum = 1, maximum = 86400000)]
    quiet_ms: i64,
    #[serde(deserialize_with = "field::required_duration")]
    #[schema(value_type = i64, minimum = 1, maximum = 315360000000_i64)]
    max_wait_ms: i64,
}

/// What a task spec asks of events and debouncing, checked: its listeners, lookback, debounce
/// window, and its id (a debounced task's is its key).
pub(super) struct Reacts {
    pub on: Vec<Listener>,
    pub lookback_ms: u64,
    pub debounce: Option<Debounce>,
    pub id: Option<String>,
}

impl Reacts {
    /// Checks a spec's `on`, `lookback_ms` and `debounce` (`at` prefixes messages).
    pub(super) fn of(
        at: &str,
        on: Option<Vec<ListenSpec>>,
        lookback_ms: Option<i64>,
        debounce: Option<DebounceSpec>,
        id: Option<String>,
        max_lookback: u64,
    ) -> ApiResult<Reacts> {
        let on: Vec<Listener> = on
            .unwrap_or_default()
            .into_iter()
            .map(|l| Listener {
                topic: l.topic,
                key: l.key,
                then: l.then,
            })
            .collect();
        if on.len() > 8 {
            return Err(ApiError::bad(format!("{at}on lists more than 8 events")));
        }
        if let Some(l) = on
            .iter()
            .find(|l| !eggtimer_base::names::valid_topic(&l.topic))
        {
            return Err(ApiError::bad(format!(
                "{at}on: {:?} is not a topic (1 to 64 of a-z 0-9 . _ -)",
                l.topic
            )));
        }
        let lookback_ms = lookback_ms.map_or(eggtimer_store::DEFAULT_LOOKBACK_MS, |l| l as u64);
        if lookback_ms > max_lookback {
            // well-formed, but this runner keeps events for less
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_task",
                format!(
                    "{at}lookback_ms ({lookback_ms}) is past this runner's --event-retention ({max_lookback} ms)"
                ),
            ));
        }
        let debounce = match debounce {
            None => None,
            Some(d) => {
                let unfit = |why: &str| {
                    ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "invalid_task",
                        format!("{at}{why}"),
                    )
                };
                if !on.is_empty() {
                    return Err(unfit(
                        "a debounced task can't listen for events (give debounce or on, not both)",
                    ));
                }
                if id.as_ref().is_some_and(|id| *id != d.key) {
                    return Err(unfit(
                        "a debounced task's id is its debounce key: leave id out",
                    ));
                }
                if d.quiet_ms < 1 || d.quiet_ms > 86_400_000 || d.max_wait_ms < 1 {
                    return Err(ApiError::bad(format!(
                        "{at}debounce.quiet_ms must be 1 to 86400000 and max_wait_ms at least 1"
                    )));
                }
                Some((
                    d.key,
                    eggtimer_store::Debounce {
                        quiet_ms: d.quiet_ms as u64,
                        max_wait_ms: d.max_wait_ms as u64,
                    },
                ))
            }
        };
        let (id, debounce) = match debounce {
            Some((key, d)) => (Some(key), Some(d)),
            None => (id, None),
        };
        Ok(Reacts {
            on,
            lookback_ms,
            debounce,
            id,
        })
    }
}
