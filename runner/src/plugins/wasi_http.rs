//! The standard `wasi:http` outgoing handler (`wasmtime-wasi-http`), for plugins built with a
//! toolchain whose HTTP client speaks it (a StarlingMonkey build's `fetch`, Rust's `wasi`
//! crates). Its requests go through [`HttpCtx::send`], as the host's own `http-send` does: the
//! plugin's allowed origins, the address rule, no redirects, the run's request budget and time
//! limit, the `Idempotency-Key` (the two ways share one count, so each request has its own place
//! in the run). Bodies are capped at [`MAX_RESPONSE_BYTES`] each way: the requests run on tasks of
//! their own, outside the run's effects budget.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use wasmtime_wasi_http::{Error, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks};

use wasmtime::component::ResourceTable;

use super::http::MAX_RESPONSE_BYTES;
use super::run_http::{HttpCtx, HttpFailure};

/// Headers of how a message is framed on the wire (lowercase, as `http` names them).
const FRAMING: [&str; 4] = ["host", "connection", "content-length", "transfer-encoding"];

/// An instance's `wasi:http` context and hooks.
pub struct WasiHttp {
    ctx: WasiHttpCtx,
    hooks: Hooks,
}

impl Default for WasiHttp {
    fn default() -> Self {
        WasiHttp {
            ctx: WasiHttpCtx::new(),
            hooks: Hooks { run: None },
        }
    }
}

/// Sends the requests of the current run (none outside a run).
struct Hooks {
    run: Option<Arc<HttpCtx>>,
}

impl WasiHttp {
    /// The view `wasi:http` works through, sending for `run` (the current run's context: a warm
    /// instance serves many runs; none outside a run).
    pub fn view<'a>(
        &'a mut self,
        table: &'a mut ResourceTable,
        run: Option<Arc<HttpCtx>>,
    ) -> WasiHttpCtxView<'a> {
        self.hooks.run = run;
        WasiHttpCtxView {
            ctx: &mut self.ctx,
            table,
            hooks: &mut self.hooks,
        }
    }
}

type Sent = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), Error>> + Send>,
                ),
                Error,
            >,
        > + Send,
>;

impl WasiHttpHooks for Hooks {
    /// reqwest sets `Host` from the URL.
    fn set_host_header(&mut self) -> bool {
        false
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Sent {
        let run = self.run.clone();
        Box::new(async move {
            let Some(run) = run else {
                return Err(Error::HttpRequestDenied);
            };
            let (parts, body) = request.into_parts();
            let body = match Limited::new(body, MAX_RESPONSE_BYTES).collect().await {
                Ok(b) => b.to_bytes().to_vec(),
                Err(_) => return Err(Error::HttpRequestBodySize(None)),
            };
            // framing is the transport's: wasi:http checked Content-Length against the body,
            // which is whole now, and the client sets it (and Host) again
            let headers = parts
                .headers
                .iter()
                .filter(|(k, _)| !FRAMING.contains(&k.as_str()))
                .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect();
            let url = parts.uri.to_string();
            let answer = match run.send(parts.method.as_str(), &url, headers, body).await {
                Ok(r) => r,
                Err(HttpFailure::OverBudget(_) | HttpFailure::Refused(_)) => {
                    return Err(Error::HttpRequestDenied);
                }
                Err(HttpFailure::Failed(e)) => return Err(Error::InternalError(Some(e))),
            };
            let mut response = http::Response::builder().status(answer.status);
            // the body is whole: how it was framed on the wire is not the guest's business
            for (k, v) in &answer.headers {
                if !FRAMING.contains(&k.as_str()) {
                    response = response.header(k, v);
                }
            }
            let body = Full::new(Bytes::from(answer.body))
                .map_err(|never| match never {})
                .boxed_unsync();
            let response = response
                .body(body)
                .map_err(|e| Error::InternalError(Some(e.to_string())))?;
            let done: Box<dyn Future<Output = Result<(), Error>> + Send> =
                Box::new(async { Ok(()) });
            Ok((response, done))
        })
    }
}
