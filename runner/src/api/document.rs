//! The OpenAPI document as a whole (`GET /v1/openapi.json`): its description, the bearer scheme,
//! and the rules over several fields that utoipa can't express, added to the JSON it makes.

use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::doc::{ErrorBody, ErrorDetail};

/// The document as JSON, with the rules utoipa can't express (JSON Schema's `not` and `oneOf`
/// over fields): a task spec's `run_at` and `delay_ms` are not both given, a schedule has one of
/// `cron` and `every_ms`, a source one of `stream` and `plugin`.
pub fn finish(doc: utoipa::openapi::OpenApi) -> Value {
    let mut v = serde_json::to_value(doc).expect("the document serializes");
    // a schedule: exactly one of cron and every_ms
    if let Some(obj) = v
        .pointer_mut("/components/schemas/ScheduleSpec")
        .and_then(Value::as_object_mut)
    {
        obj.insert(
            "not".into(),
            serde_json::json!({
                "required": ["cron", "every_ms"],
                "properties": {"cron": {"type": "string"}, "every_ms": {"type": "integer"}}
            }),
        );
        obj.insert(
            "anyOf".into(),
            serde_json::json!([
                {"required": ["cron"], "properties": {"cron": {"type": "string"}}},
                {"required": ["every_ms"], "properties": {"every_ms": {"type": "integer"}}}
            ]),
        );
    }
    // a source reads a stream or a plugin's emitted events, exactly one of them (`emitted` goes
    // with `plugin`); null is absent
    if let Some(obj) = v
        .pointer_mut("/components/schemas/NewSource")
        .and_then(Value::as_object_mut)
    {
        let given =
            |f: &str| serde_json::json!({"required": [f], "properties": {f: {"type": "string"}}});
        obj.insert(
            "oneOf".into(),
            serde_json::json!([
                {"allOf": [given("stream"), {"not": given("plugin")}, {"not": given("emitted")}]},
                {"allOf": [given("plugin"), {"not": given("stream")}]}
            ]),
        );
    }
    if let Some(spec) = v.pointer_mut("/components/schemas/TaskSpec")
        && let Some(obj) = spec.as_object_mut()
    {
        obj.insert(
            "not".into(),
            serde_json::json!({
                "required": ["run_at", "delay_ms"],
                "properties": {"run_at": {"type": "integer"}, "delay_ms": {"type": "integer"}}
            }),
        );
    }
    v
}

/// Adds the bearer-token scheme.
pub struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "eggtimer admin API",
        version = "1",
        description = "Schedule, move, cancel and run delayed tasks; upload WebAssembly plugins. Times are ms since the Unix epoch."
    ),
    modifiers(&Bearer),
    components(schemas(ErrorBody, ErrorDetail))
)]
pub struct ApiDoc;
