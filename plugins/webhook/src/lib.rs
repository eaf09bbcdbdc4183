//! `webhook`: delivers a JSON body to a URL, signed. Payload: `{"url", "body": any JSON,
//! "headers"?: {name: value}}`.
//!
//! It POSTs `body` as JSON to `url` with `X-Eggtimer-Signature: sha256=<hex HMAC-SHA256 of the
//! exact body bytes, keyed with the plugin's secret "signing_key">`, `X-Eggtimer-Task: <task id>`
//! and the host's `Idempotency-Key` (the same on every attempt, so a receiver that honours it
//! acts once). 2xx: done. 408, 429 (after its `Retry-After`) and 5xx: retried with backoff.
//! Other statuses: failed for good, with the status and the first KiB of the answer. The URL's
//! origin must be in the plugin's `allowed_hosts`.

use std::collections::BTreeMap;
use std::time::Duration;

use eggtimer_sdk::http::{Request, Response};
use eggtimer_sdk::{Error, Outcome, Task, handler, secret};
use hmac::{Hmac, Mac};
use serde::Deserialize;

#[derive(Deserialize)]
pub struct Delivery {
    pub url: String,
    pub body: serde_json::Value,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// How much of a refusing answer goes into the error.
const SHOWN: usize = 1024;

/// `sha256=<hex>` of the body, keyed with `key`.
pub fn signature(key: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).expect("any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

pub fn handle(task: Task<Delivery>) -> eggtimer_sdk::Result {
    let d = &task.payload;
    let Some(key) = secret("signing_key")? else {
        return Ok(Outcome::Fail(
            "the webhook plugin has no secret \"signing_key\": set it with `eggtimer plugin secret set webhook signing_key`".into(),
        ));
    };
    let body = serde_json::to_vec(&d.body)?;
    let mut req = Request::post(&d.url)
        .header("Content-Type", "application/json")
        .header("X-Eggtimer-Signature", &signature(&key, &body))
        .header("X-Eggtimer-Task", &task.id);
    for (k, v) in &d.headers {
        req = req.header(k, v);
    }
    // a refused or failed request (not allowed, unreachable, too slow) is an error: retried
    let resp = req.body(body).send()?;
    outcome(&resp)
}

/// What an answer means for the delivery: done, a failed attempt (`Err`: retried with the
/// runner's backoff), a retry at the receiver's `Retry-After`, or failed for good.
pub fn outcome(resp: &Response) -> eggtimer_sdk::Result {
    let shown = || {
        let text = resp.text();
        let mut cut = text.len().min(SHOWN);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("the receiver answered {}: {}", resp.status, &text[..cut])
    };
    match resp.status {
        200..=299 => Ok(Outcome::Done),
        429 => match retry_after(resp) {
            Some(d) => Ok(Outcome::RetryAfter(d)),
            None => Err(Error::from(shown())),
        },
        408 | 500..=599 => Err(Error::from(shown())),
        _ => Ok(Outcome::Fail(shown())),
    }
}

/// A `Retry-After` in seconds (an HTTP date is treated as absent), at most an hour.
fn retry_after(resp: &Response) -> Option<Duration> {
    let secs: u64 = resp.header("retry-after")?.trim().parse().ok()?;
    Some(Duration::from_secs(secs.min(3600)))
}

handler!(handle);

#[cfg(test)]
mod tests {
    use super::*;
    use eggtimer_sdk::testing::{TestHost, idempotency_key};

    fn host() -> TestHost {
        let mut h = TestHost::new();
        h.secrets.insert("signing_key".into(), "k".into());
        h
    }

    const PAYLOAD: &str =
        r#"{"url":"https://hooks.example.com/in","body":{"order":42},"headers":{"X-Tenant":"t1"}}"#;

    #[test]
    fn delivers_signed_json() {
        let mut h = host();
        h.http_responses.push_back(Ok(Response::new(204, "")));
        assert_eq!(h.run_json(handle, PAYLOAD), Ok(Outcome::Done));
        let r = &h.http_requests[0];
        assert_eq!(
            (r.method.as_str(), r.url.as_str()),
            ("POST", "https://hooks.example.com/in")
        );
        assert_eq!(r.body, br#"{"order":42}"#);
        let get = |n: &str| {
            r.headers
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            get("X-Eggtimer-Signature"),
            Some(signature("k", br#"{"order":42}"#))
        );
        assert_eq!(get("X-Eggtimer-Task").as_deref(), Some("test-task"));
        assert_eq!(get("X-Tenant").as_deref(), Some("t1"));
        assert_eq!(
            get("Idempotency-Key"),
            Some(idempotency_key("test-task", TestHost::DEFAULT_NOW, 0))
        );
    }

    #[test]
    fn statuses() {
        let with = |s: u16, h: Option<&str>| {
            let mut r = Response::new(s, "nope");
            if let Some(v) = h {
                r.headers.push(("Retry-After".into(), v.into()));
            }
            outcome(&r)
        };
        assert_eq!(with(200, None), Ok(Outcome::Done));
        assert_eq!(
            with(500, None).unwrap_err().0,
            "the receiver answered 500: nope"
        );
        assert!(with(408, None).is_err());
        assert!(with(429, None).is_err());
        assert_eq!(
            with(429, Some("7")),
            Ok(Outcome::RetryAfter(Duration::from_secs(7)))
        );
        assert_eq!(
            with(400, None),
            Ok(Outcome::Fail("the receiver answered 400: nope".into()))
        );
    }

    #[test]
    fn no_signing_key_fails_for_good() {
        let mut h = TestHost::new();
        assert!(
            matches!(h.run_json(handle, PAYLOAD), Ok(Outcome::Fail(m)) if m.contains("signing_key"))
        );
        assert!(h.http_requests.is_empty());
    }

    #[test]
    fn a_refused_origin_is_a_failed_attempt() {
        let mut h = host();
        h.http_responses.push_back(Err(
            "https://hooks.example.com:443 is not in plugin \"webhook\"'s allowed_hosts".into(),
        ));
        let e = h.run_json(handle, PAYLOAD).unwrap_err();
        assert!(e.0.contains("allowed_hosts"), "{e}");
    }
}
