//! A run's outbound HTTP requests, whichever way its plugin sends them (the host's `http-send`
//! or `wasi:http`): the run's budget of them, the allowed origins, the `Idempotency-Key` and
//! `traceparent`, the time limit, metrics; and a dry run's, which are recorded, not sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tracing::warn;

/// What a run's outbound HTTP requests need, whichever way the plugin sends them (the host's
/// `http-send` or `wasi:http`).
pub struct HttpCtx {
    pub outbound: Arc<super::http::Outbound>,
    pub allowed_hosts: Arc<[String]>,
    /// The task's trace context, sent as `traceparent`.
    pub traceparent: Option<String>,
    /// The end of the run's time limit.
    pub deadline: Instant,
    pub task_id: String,
    pub occurrence: i64,
    pub plugin: String,
    /// Requests asked for so far (the next one's place in the run, for its Idempotency-Key).
    pub sent: AtomicUsize,
    /// A dry run's: requests are recorded, not sent.
    pub dry: Option<Arc<std::sync::Mutex<DryHttp>>>,
}

/// A dry run's HTTP: each request the plugin may send (its origin allowed) is recorded as it
/// would go out, not sent, and answered with the next canned answer (none left: an error that
/// says "dry run").
#[derive(Default)]
pub struct DryHttp {
    pub canned: std::collections::VecDeque<super::http::Response>,
    pub asked: Vec<Asked>,
}

/// A request a dry run's plugin asked to send.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Asked {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    /// The body as text (invalid UTF-8 replaced).
    pub body: String,
}

/// Why a request of a plugin got no answer.
pub enum HttpFailure {
    /// Past the run's request budget: the run stops (`http-send` traps).
    OverBudget(String),
    /// Not sent: an origin the plugin may not reach, a bad URL or header.
    Refused(String),
    /// Sent, and no answer: connection, TLS, time limit, a body too large.
    Failed(String),
}

impl HttpCtx {
    /// Sends one request of the run: counted in its request budget, checked against its allowed
    /// origins (see `http.rs`), given its `Idempotency-Key` and `traceparent` unless the plugin
    /// set them, within the run's time limit; measured (`eggtimer_http_*`, span `plugin.http`).
    pub async fn send(
        &self,
        method: &str,
        url: &str,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> Result<super::http::Response, HttpFailure> {
        let index = self.sent.fetch_add(1, Ordering::Relaxed);
        if index >= self.outbound.max_requests {
            return Err(HttpFailure::OverBudget(format!(
                "more than {} HTTP requests in one run (raise it with --max-http-requests)",
                self.outbound.max_requests
            )));
        }
        let plugin = &self.plugin;
        let mut checked =
            super::http::check(plugin, &self.allowed_hosts, method, url, headers, body).map_err(
                |e| {
                    warn!(task = %self.task_id, %plugin, "plugin HTTP request refused: {e}");
                    metrics::counter!("eggtimer_http_requests_total", "plugin" => plugin.clone(), "host" => "refused", "status" => "refused").increment(1);
                    HttpFailure::Refused(e)
                },
            )?;
        let has = |name: &str, h: &[(String, String)]| {
            h.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
        };
        if !has("idempotency-key", &checked.headers) {
            let key = super::http::idempotency_key(&self.task_id, self.occurrence, index);
            checked.headers.push(("Idempotency-Key".into(), key));
        }
        if let Some(tp) = &self.traceparent
            && !has("traceparent", &checked.headers)
        {
            checked.headers.push(("traceparent".into(), tp.clone()));
        }
        if let Some(dry) = &self.dry {
            let mut d = dry.lock().unwrap_or_else(|e| e.into_inner());
            d.asked.push(Asked {
                method: checked.method.to_string(),
                url: checked.url.to_string(),
                headers: checked.headers,
                body: String::from_utf8_lossy(&checked.body).into_owned(),
            });
            return d.canned.pop_front().ok_or_else(|| {
                HttpFailure::Failed(
                    "dry run: the request was recorded, not sent (give the dry run answers in \
                     its `http` list to answer it)"
                        .into(),
                )
            });
        }
        let host = checked.host.clone();
        let span = tracing::info_span!("plugin.http", %plugin, task = %self.task_id, origin = %checked.origin, method = %checked.method);
        let started = Instant::now();
        let result =
            tracing::Instrument::instrument(self.outbound.send(checked, self.deadline), span).await;
        metrics::histogram!("eggtimer_http_request_seconds", "plugin" => plugin.clone())
            .record(started.elapsed().as_secs_f64());
        let status = match &result {
            Ok(r) => r.status.to_string(),
            Err(_) => "error".into(),
        };
        metrics::counter!("eggtimer_http_requests_total", "plugin" => plugin.clone(), "host" => host, "status" => status).increment(1);
        result.map_err(HttpFailure::Failed)
    }
}
