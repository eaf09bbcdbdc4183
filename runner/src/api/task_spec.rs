//! The body of `POST /v1/tasks`: one task spec or an array of them, each field read and bounded
//! as it is parsed (an error names it, `[3].plugin`), made into the tasks to schedule.

use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;
use utoipa::ToSchema;
use utoipa::openapi::{Ref, RefOr, schema};

use super::AppState;
use super::body::{self, ApiResult, field};
use super::error::ApiError;
use eggtimer_base::limits;
use eggtimer_store::NewTask;

// The body of `POST /v1/tasks` (or one element of its array). Each field is read and bounded as
// it is parsed, so an error names it (`[3].plugin`).
/// A task to schedule.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec<'a> {
    /// The plugin that runs it.
    #[serde(default, deserialize_with = "field::plugin")]
    #[schema(value_type = String, required = true, pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    plugin: Option<String>,
    /// Any JSON, handed to the plugin.
    #[serde(borrow)]
    #[schema(value_type = Option<Value>)]
    payload: Option<&'a RawValue>,
    /// When (ms since the Unix epoch); neither run_at nor delay_ms means now.
    #[serde(default, deserialize_with = "field::time")]
    #[schema(minimum = 0, maximum = 253402300799999_i64)]
    run_at: Option<i64>,
    /// How long from now (ms).
    #[serde(default, deserialize_with = "field::duration")]
    #[schema(minimum = 0, maximum = 315360000000_i64)]
    delay_ms: Option<i64>,
    /// 1 to 200 bytes without control characters; generated when absent.
    #[serde(default, deserialize_with = "field::id")]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    id: Option<String>,
    /// 1 to 200 bytes without control characters.
    #[serde(default, deserialize_with = "field::id")]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    owner: Option<String>,
    #[serde(default, deserialize_with = "field::max_attempts")]
    #[schema(minimum = 1, maximum = 1000)]
    max_attempts: Option<u32>,
    /// After the task finished, scheduling this id again within this long (ms) is 409
    /// `duplicate` and changes nothing.
    #[serde(default, deserialize_with = "field::duration")]
    #[schema(minimum = 0, maximum = 315360000000_i64)]
    unique_for_ms: Option<i64>,
    /// A W3C trace context: the task's run joins this trace (overrides the `traceparent`
    /// header for this spec). Ids of zeros name no trace and are ignored.
    #[serde(default, deserialize_with = "field::traceparent")]
    #[schema(value_type = Option<String>, pattern = "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")]
    traceparent: Option<Option<String>>,
    /// The latest time (ms since the Unix epoch) the task may start; not started by then, it is
    /// dead with the error `expired` instead of running. Before the task is due: 422.
    #[serde(default, deserialize_with = "field::time")]
    #[schema(minimum = 0, maximum = 253402300799999_i64)]
    start_by: Option<i64>,
    /// Events it listens for (at most 8): `cancel` cancels it when one arrives, `run` runs it at
    /// once with the event (`task.event`); with none by its due time it runs then, without one.
    /// The caller's key must be allowed to listen on each topic.
    #[serde(default)]
    #[schema(max_items = 8)]
    on: Option<Vec<super::events::ListenSpec>>,
    /// An event that arrived up to this long (ms) before the task was scheduled still matches;
    /// 60,000 when absent, at most the runner's `--event-retention`.
    #[serde(default, deserialize_with = "field::duration")]
    #[schema(minimum = 0, maximum = 315360000000_i64)]
    lookback_ms: Option<i64>,
    /// One task per key: scheduling again within `quiet_ms` moves it to now + `quiet_ms` (never
    /// past its first payload + `max_wait_ms`) and keeps every payload (`task.batch`).
    #[serde(default)]
    debounce: Option<super::events::DebounceSpec>,
    /// 0 (the default) to 9: among its plugin's due tasks, the higher starts first (inside its
    /// owner's turn). A task due for longer than the runner's `--priority-aging-ms` counts as
    /// 9. Never starts a task before its due time. Not with `debounce`.
    #[serde(default, deserialize_with = "field::priority")]
    #[schema(minimum = 0, maximum = 9)]
    priority: Option<u8>,
}

/// Most specs in one POST /v1/tasks.
pub const MAX_BATCH: usize = 10_000;

/// One task spec, or an array of 1 to 10,000.
#[derive(ToSchema, serde::Deserialize)]
#[allow(dead_code, clippy::large_enum_variant)]
#[serde(untagged)]
pub enum ScheduleBody<'a> {
    #[serde(borrow)]
    One(TaskSpec<'a>),
    #[serde(borrow)]
    Many(SpecBatch<'a>),
}

/// 1 to 10,000 task specs, scheduled all or nothing.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
pub struct SpecBatch<'a>(#[serde(borrow)] Vec<TaskSpec<'a>>);

impl utoipa::PartialSchema for SpecBatch<'_> {
    fn schema() -> RefOr<schema::Schema> {
        schema::ArrayBuilder::new()
            .items(RefOr::Ref(Ref::from_schema_name("TaskSpec")))
            .min_items(Some(1))
            .max_items(Some(MAX_BATCH))
            .description(Some("1 to 10,000 task specs, scheduled all or nothing"))
            .into()
    }
}

impl ToSchema for SpecBatch<'_> {
    fn schemas(schemas: &mut Vec<(String, RefOr<schema::Schema>)>) {
        schemas.push((
            TaskSpec::name().into(),
            <TaskSpec as utoipa::PartialSchema>::schema(),
        ));
        <TaskSpec as ToSchema>::schemas(schemas);
    }
}

fn new_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

impl TaskSpec<'_> {
    /// The task this spec asks for, given the time it is read at; `at` prefixes messages (e.g.
    /// "[3]."). `traceparent` is the request's header, used when the spec has none.
    fn into_task(
        self,
        at: &str,
        now: i64,
        max_payload: usize,
        max_lookback: u64,
        traceparent: Option<&str>,
    ) -> ApiResult<NewTask> {
        let plugin = self
            .plugin
            .ok_or_else(|| ApiError::bad(format!("{at}plugin is required")))?;
        let run_at = match (self.run_at, self.delay_ms) {
            (Some(_), Some(_)) => {
                return Err(ApiError::bad(format!(
                    "{at}give run_at or delay_ms, not both"
                )));
            }
            (Some(t), None) => t,
            (None, Some(d)) => limits::shifted(&format!("{at}delay_ms"), now, d)?,
            (None, None) => now,
        };
        if let Some(by) = self.start_by
            && by < run_at
        {
            // well-formed but impossible
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_task",
                format!(
                    "{at}start_by ({by}) is before the task is due ({run_at}): it could never start"
                ),
            ));
        }
        let priority = self.priority.unwrap_or(0);
        if priority > 0 && self.debounce.is_some() {
            // well-formed but impossible, as `on` with debounce
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_task",
                format!(
                    "{at}priority can't be given with debounce: a debounced task runs at priority 0"
                ),
            ));
        }
        let payload = self.payload.map_or("null", |p| p.get());
        limits::payload(&format!("{at}payload"), payload, max_payload)
            .map_err(|e| ApiError::too_large(e.0))?;
        let reacts = super::events::Reacts::of(
            at,
            self.on,
            self.lookback_ms,
            self.debounce,
            self.id,
            max_lookback,
        )?;
        let (on, lookback_ms, debounce, id) =
            (reacts.on, reacts.lookback_ms, reacts.debounce, reacts.id);
        Ok(NewTask {
            on,
            lookback_ms,
            debounce,
            id: id.unwrap_or_else(new_id),
            plugin,
            payload: payload.to_owned(),
            run_at,
            owner: self.owner,
            max_attempts: self.max_attempts.unwrap_or(5),
            unique_for_ms: self.unique_for_ms.unwrap_or(0) as u64,
            traceparent: match self.traceparent {
                Some(given) => given,
                None => traceparent.map(str::to_owned),
            },
            start_by: self.start_by,
            priority,
        })
    }
}

/// The `traceparent` header, checked (an empty header is no header, as proxies and curl's
/// `-H 'traceparent;'` send it).
pub(super) fn traceparent_header(headers: &HeaderMap) -> ApiResult<Option<String>> {
    match headers.get("traceparent").filter(|h| !h.is_empty()) {
        None => Ok(None),
        Some(h) => h
            .to_str()
            .map_err(|_| "not visible ASCII".to_owned())
            .and_then(crate::trace::parse_traceparent)
            .map_err(|e| ApiError::bad(format!("the traceparent header {e}"))),
    }
}

/// One task spec or a non-empty array of up to [`MAX_BATCH`], each checked (errors name the
/// field, `[3].plugin` in an array).
pub(super) fn parse_specs(
    st: &AppState,
    v: &RawValue,
    traceparent: Option<&str>,
) -> ApiResult<Vec<NewTask>> {
    let now = st.store.clock().now_ms();
    if !body::is_array(v) {
        let spec: TaskSpec = body::typed(v)?;
        return Ok(vec![spec.into_task(
            "",
            now,
            st.max_payload_bytes,
            st.store.options().event_retention_ms,
            traceparent,
        )?]);
    }
    let specs: Vec<TaskSpec> = body::typed_array(v, MAX_BATCH, "the array of task specs")?;
    if specs.is_empty() {
        return Err(ApiError::bad("the array of task specs is empty"));
    }
    specs
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.into_task(
                &format!("[{i}]."),
                now,
                st.max_payload_bytes,
                st.store.options().event_retention_ms,
                traceparent,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    /// Any JSON value, nested a little.
    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            ".{0,30}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,10}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Spec-shaped objects: the real field names with any values.
    fn spec_like() -> impl Strategy<Value = Value> {
        let field = prop_oneof![
            Just("plugin"),
            Just("payload"),
            Just("run_at"),
            Just("delay_ms"),
            Just("id"),
            Just("owner"),
            Just("max_attempts"),
            Just("other"),
        ];
        let value = prop_oneof![
            any_json(),
            any::<i64>().prop_map(|n| json!(n)),
            "[a-z0-9-]{1,8}".prop_map(Value::String),
            "\\PC{0,250}".prop_map(Value::String),
        ];
        prop::collection::btree_map(field, value, 0..8)
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        /// Whatever the input, the parser answers (never panics), and what it accepts is in
        /// bounds: a time in range, a valid id and owner, a payload within its limit.
        #[test]
        fn the_spec_parser_accepts_only_bounded_tasks(v in prop_oneof![any_json(), spec_like()]) {
            let text = v.to_string();
            let raw: &RawValue = serde_json::from_str(&text).unwrap();
            let parsed = body::typed::<TaskSpec>(raw)
                .and_then(|s| s.into_task("", 1_700_000_000_000, 4096, 60_000, None));
            match parsed {
                Ok(t) => {
                    prop_assert!(limits::time("", t.run_at).is_ok());
                    prop_assert!(limits::id_like(&t.id));
                    prop_assert!(t.owner.as_deref().is_none_or(limits::id_like));
                    prop_assert!(t.payload.len() <= 4096);
                    prop_assert!((1..=1000).contains(&t.max_attempts));
                    prop_assert!(serde_json::from_str::<Value>(&t.payload).is_ok());
                }
                Err(e) => prop_assert!(e.status.is_client_error(), "{}", e.message),
            }
        }
    }

    /// One spec read as the only element of a batch.
    fn spec(s: &str) -> ApiResult<NewTask> {
        let batch = format!("[{s}]");
        let v: &RawValue = serde_json::from_str(&batch).unwrap();
        let mut specs: Vec<TaskSpec> = body::typed_array(v, 10, "the array")?;
        specs.remove(0).into_task("[0].", 1_000, 64, 60_000, None)
    }

    #[test]
    fn specs_are_bounded_and_errors_name_the_field() {
        let e = spec(r#"{"plugin":"p","run_at":9223372036854775807}"#).unwrap_err();
        assert!(
            e.message.starts_with("[0].run_at must be a time"),
            "{}",
            e.message
        );
        let e = spec(r#"{"plugin":"p","delay_ms":9223372036854775807}"#).unwrap_err();
        assert!(
            e.message.starts_with("[0].delay_ms must be from 0"),
            "{}",
            e.message
        );
        let e = spec(r#"{"plugin":"p","id":"a\u0000b"}"#).unwrap_err();
        assert!(
            e.message.starts_with("[0].id must be 1 to 200 bytes"),
            "{}",
            e.message
        );
        let e = spec(&format!(
            r#"{{"plugin":"p","owner":"{}"}}"#,
            "o".repeat(5000)
        ))
        .unwrap_err();
        assert!(e.message.starts_with("[0].owner"), "{}", e.message);
        let e = spec(r#"{"plugin":"p","nope":1}"#).unwrap_err();
        assert!(e.message.contains("unknown field `nope`"), "{}", e.message);
        let e = spec(r#"{"plugin":"p","payload":"this is longer than sixty-four bytes, which is the limit in this test"}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        let t = spec(r#"{"plugin":"p","delay_ms":5,"payload":{"a":[1,2]}}"#).unwrap();
        assert_eq!((t.run_at, t.payload.as_str()), (1_005, r#"{"a":[1,2]}"#));
        let e = spec(r#"{"plugin":"p","traceparent":"00-abc-01"}"#).unwrap_err();
        assert!(
            e.message
                .starts_with("[0].traceparent must be a W3C traceparent"),
            "{}",
            e.message
        );
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = spec(&format!(r#"{{"plugin":"p","traceparent":"{tp}"}}"#)).unwrap();
        assert_eq!(t.traceparent.as_deref(), Some(tp));
    }
}
