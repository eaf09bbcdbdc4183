//! docs/api.md, the API reference, rendered from the OpenAPI document a runner serves: every route
//! with its parameters, body and answers, then every schema with its fields and bounds. The
//! openapi test compares the file with a fresh rendering (and rewrites it with EGGTIMER_BLESS=1).

use std::fmt::Write;

use serde_json::Value;

const METHODS: [&str; 5] = ["get", "put", "post", "patch", "delete"];

/// The reference for `doc` (an OpenAPI 3.1 document).
pub fn markdown(doc: &Value) -> String {
    let mut out = String::new();
    let version = doc["info"]["version"].as_str().unwrap_or("1");
    let _ = writeln!(out, "# The eggtimer HTTP API (v{version})\n");
    out.push_str(
        "Generated from the OpenAPI document every runner serves at `GET /v1/openapi.json` (a test \
         checks that this file matches it). JSON in and out; times are milliseconds since the Unix \
         epoch; every error is `{\"error\": {\"code\", \"message\"}}`. With a token configured, \
         `/v1` routes need `Authorization: Bearer <token or key>`; the role each route needs is in \
         the README's \"Teams\".\n\n",
    );
    // routes, grouped by tag in the order tags first appear
    let mut routes: Vec<(String, &str, &str, &Value)> = Vec::new();
    if let Some(paths) = doc["paths"].as_object() {
        for (path, item) in paths {
            for m in METHODS {
                if let Some(op) = item.get(m) {
                    let tag = op["tags"][0].as_str().unwrap_or("other").to_owned();
                    routes.push((tag, m, path, op));
                }
            }
        }
    }
    let mut tags: Vec<String> = Vec::new();
    for (t, ..) in &routes {
        if !tags.contains(t) {
            tags.push(t.clone());
        }
    }
    out.push_str("## Routes\n\n");
    for t in &tags {
        let _ = write!(out, "[{t}](#{}) · ", slug(t));
    }
    out.push_str("[errors](#errors) · [schemas](#schemas)\n\n");
    for t in &tags {
        let _ = writeln!(out, "### {t}\n");
        for (_, m, path, op) in routes.iter().filter(|r| &r.0 == t) {
            route(&mut out, m, path, op);
        }
    }
    out.push_str("## Errors\n\n");
    out.push_str(
        "Every route may answer these, each with an [ErrorBody](#errorbody); a route lists the \
         statuses it can give.\n\n| status | |\n|---|---|\n",
    );
    for (status, description) in common_errors(doc) {
        let _ = writeln!(out, "| {status} | {} |", cell(&description));
    }
    out.push('\n');
    out.push_str("## Schemas\n\n");
    if let Some(schemas) = doc["components"]["schemas"].as_object() {
        for (name, s) in schemas {
            let _ = writeln!(out, "### {name}\n");
            if let Some(d) = s["description"].as_str() {
                let _ = writeln!(out, "{}\n", one_line(d));
            }
            schema_body(&mut out, s);
        }
    }
    out
}

fn route(out: &mut String, method: &str, path: &str, op: &Value) {
    let _ = writeln!(out, "#### `{} {path}`\n", method.to_uppercase());
    let text = [op["summary"].as_str(), op["description"].as_str()]
        .into_iter()
        .flatten()
        .map(one_line)
        .collect::<Vec<_>>()
        .join(" ");
    let own = format!("`{} {path}`", method.to_uppercase());
    let text = text
        .strip_prefix(&own)
        .map(|t| t.trim_start_matches([':', '.', ' ']).to_owned())
        .unwrap_or(text);
    if !text.is_empty() {
        let _ = writeln!(out, "{text}\n");
    }
    if let Some(params) = op["parameters"].as_array().filter(|p| !p.is_empty()) {
        out.push_str("| parameter | in | type | |\n|---|---|---|---|\n");
        for p in params {
            let required = if p["required"].as_bool() == Some(true) {
                "required. "
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {required}{} |",
                p["name"].as_str().unwrap_or(""),
                p["in"].as_str().unwrap_or(""),
                type_of(&p["schema"]),
                cell(p["description"].as_str().unwrap_or(""))
            );
        }
        out.push('\n');
    }
    if let Some(content) = op["requestBody"]["content"].as_object() {
        for (media, c) in content {
            let _ = writeln!(out, "Body (`{media}`): {}\n", type_of(&c["schema"]));
        }
    }
    if let Some(responses) = op["responses"].as_object() {
        let errors: Vec<&str> = responses
            .iter()
            .filter(|(status, r)| is_error(status, r))
            .map(|(status, _)| status.as_str())
            .collect();
        out.push_str("| answer | |\n|---|---|\n");
        for (status, r) in responses.iter().filter(|(s, r)| !is_error(s, r)) {
            let body = r["content"]
                .as_object()
                .and_then(|c| c.values().next())
                .map(|c| format!(" → {}", type_of(&c["schema"])))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "| {status} | {}{body} |",
                cell(r["description"].as_str().unwrap_or(""))
            );
        }
        if !errors.is_empty() {
            let _ = writeln!(out, "| {} | [errors](#errors) |", errors.join(", "));
        }
        out.push('\n');
    }
}

/// An error answer (4xx or 5xx with an ErrorBody).
fn is_error(status: &str, r: &Value) -> bool {
    let body = r["content"]
        .as_object()
        .and_then(|c| c.values().next())
        .and_then(|c| c["schema"]["$ref"].as_str());
    (status.starts_with('4') || status.starts_with('5'))
        && body.is_none_or(|b| b.ends_with("/ErrorBody"))
}

/// Each error status with the description its routes give it (the first one met).
fn common_errors(doc: &Value) -> Vec<(String, String)> {
    let mut seen = std::collections::BTreeMap::new();
    for item in doc["paths"]
        .as_object()
        .into_iter()
        .flat_map(|p| p.values())
    {
        for m in METHODS {
            let responses = item[m]["responses"].as_object();
            for (status, r) in responses.into_iter().flatten() {
                if is_error(status, r) {
                    seen.entry(status.clone())
                        .or_insert_with(|| r["description"].as_str().unwrap_or("").to_owned());
                }
            }
        }
    }
    seen.into_iter().collect()
}

/// A heading's anchor as GitHub makes it.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// An object schema's fields as a table; anything else as its type.
fn schema_body(out: &mut String, s: &Value) {
    let Some(props) = s["properties"].as_object() else {
        let _ = writeln!(out, "{}\n", type_of(s));
        return;
    };
    let required: Vec<&str> = s["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    out.push_str("| field | type | |\n|---|---|---|\n");
    for (name, p) in props {
        let req = if required.contains(&name.as_str()) {
            "required. "
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "| `{name}` | {} | {req}{} |",
            type_of(p),
            cell(p["description"].as_str().unwrap_or(""))
        );
    }
    out.push('\n');
}

/// A schema in a few words: `string` (1–200 chars, pattern), `[TaskSpec]`, `Task \| null`.
fn type_of(s: &Value) -> String {
    if let Some(r) = s["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap_or(r);
        return format!("[{name}](#{})", slug(name));
    }
    for k in ["oneOf", "anyOf"] {
        if let Some(v) = s[k].as_array() {
            return v.iter().map(type_of).collect::<Vec<_>>().join(" \\| ");
        }
    }
    if let Some(e) = s["enum"].as_array() {
        return e
            .iter()
            .map(|v| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(" \\| ");
    }
    let mut t = match &s["type"] {
        Value::String(t) => t.clone(),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" \\| "),
        _ => "any".to_owned(),
    };
    if t.starts_with("array") {
        t = t.replacen("array", &format!("array of {}", type_of(&s["items"])), 1);
    }
    if s["additionalProperties"].is_object() {
        // a map: its names' schema to its values'
        let names = match s["propertyNames"].is_object() {
            true => type_of(&s["propertyNames"]),
            false => "string".to_owned(),
        };
        let values = type_of(&s["additionalProperties"]);
        t = format!("object of {names} to {values}");
    }
    let mut bounds = Vec::new();
    match (s["minimum"].as_i64(), s["maximum"].as_i64()) {
        (Some(a), Some(b)) => bounds.push(format!("{a} to {b}")),
        (Some(a), None) => bounds.push(format!("≥ {a}")),
        (None, Some(b)) => bounds.push(format!("≤ {b}")),
        _ => {}
    }
    match (s["minLength"].as_u64(), s["maxLength"].as_u64()) {
        (Some(a), Some(b)) => bounds.push(format!("{a}–{b} chars")),
        (None, Some(b)) => bounds.push(format!("≤ {b} chars")),
        _ => {}
    }
    if let Some(n) = s["maxItems"].as_u64() {
        bounds.push(format!("≤ {n} items"));
    }
    if let Some(n) = s["maxProperties"].as_u64() {
        bounds.push(format!("≤ {n} names"));
    }
    if let Some(f) = s["format"].as_str() {
        bounds.push(f.to_owned());
    }
    if let Some(p) = s["pattern"].as_str() {
        bounds.push(format!("`{}`", p.replace('|', "\\|")));
    }
    if bounds.is_empty() {
        t
    } else {
        format!("{t} ({})", bounds.join(", "))
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn cell(s: &str) -> String {
    one_line(s).replace('|', "\\|")
}
