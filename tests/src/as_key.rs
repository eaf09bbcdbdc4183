//! Requests as a key or the admin token (`Authorization: Bearer`), for the tests of teams, roles
//! and the operator's caps.

use std::time::Duration;

use serde_json::{Value, json};

use crate::eventually;

/// How long a wait for a task's state may take.
const T: Duration = Duration::from_secs(60);
/// The admin token the tests start their runners with (`--token`).
pub const ADMIN: &str = "admin-s3cret-token";

/// A request with a bearer (None: without one), a JSON body when given.
pub async fn req(
    method: &str,
    url: &str,
    bearer: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = reqwest::Client::new().request(method.parse().unwrap(), url);
    if let Some(b) = bearer {
        r = r.bearer_auth(b);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.expect("the runner answers");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Uploads a plugin with `bearer`: (status, reply).
pub async fn upload_as(base: &str, bearer: &str, name: &str, wasm: Vec<u8>) -> (u16, Value) {
    let resp = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
        .put(format!("{base}/v1/plugins/{name}"))
        .bearer_auth(bearer)
        .header("content-type", "application/wasm")
        .body(wasm)
        .send()
        .await
        .expect("the runner answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Waits until a task reaches `state`, asking as the admin.
pub async fn wait_state(base: &str, id: &str, state: &str) -> Value {
    eventually(T, &format!("task {id} to be {state}"), || async {
        let (s, t) = req("GET", &format!("{base}/v1/tasks/{id}"), Some(ADMIN), None).await;
        (s == 200 && t["state"] == state).then_some(t)
    })
    .await
}

/// Waits until a task reaches one of `states`, asking as the admin; returns it.
pub async fn wait_state_in(base: &str, id: &str, states: &[&str]) -> Value {
    eventually(T, &format!("task {id} to be one of {states:?}"), || async {
        let (s, t) = req("GET", &format!("{base}/v1/tasks/{id}"), Some(ADMIN), None).await;
        (s == 200 && states.iter().any(|st| t["state"] == *st)).then_some(t)
    })
    .await
}

/// Makes a key as the admin; returns (id, secret).
pub async fn make_key(base: &str, name: &str, role: &str, plugins: &[&str]) -> (String, String) {
    let (s, k) = req(
        "POST",
        &format!("{base}/v1/keys"),
        Some(ADMIN),
        Some(json!({"name": name, "role": role, "plugins": plugins})),
    )
    .await;
    assert_eq!(s, 201, "{k}");
    (
        k["id"].as_str().unwrap().to_owned(),
        k["key"].as_str().unwrap().to_owned(),
    )
}
