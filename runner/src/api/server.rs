//! The HTTP listener, hardened: a cap on open connections, a time limit on reading a request's
//! headers, on reading its body and on the whole request, a connection with no traffic closed
//! (HTTP/1 keep-alive and HTTP/2 alike), one that sends bytes but no request closed as idle too
//! (an HTTP/2 client pinging, a trickle of header bytes), and a bounded graceful shutdown, so slow
//! or idle clients can't exhaust the runner or hold up its exit.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tower_http::timeout::{RequestBodyTimeoutLayer, TimeoutLayer};
use tracing::{debug, warn};

/// What the listener allows.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// Open connections at once; more wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Time to send a request's headers.
    pub header_timeout: Duration,
    /// Time to send a request's body.
    pub body_timeout: Duration,
    /// Time for a whole request (408 after it).
    pub request_timeout: Duration,
    /// How long a connection may stay open with no byte read or written, or with no request
    /// being answered, begun or ended (never less than the request timeout and 2 s more, so no
    /// request in flight is cut).
    pub idle_timeout: Duration,
    /// How long open connections may take to finish at shutdown.
    pub shutdown_grace: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(90),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Serves `app` on `listener` until `stop`, then lets open connections finish within the grace.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    mut stop: watch::Receiver<bool>,
) {
    let app = app
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.request_timeout,
        ))
        .layer(RequestBodyTimeoutLayer::new(limits.body_timeout));
    let conns = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&conns).acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stopped(&mut stop) => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // e.g. out of file descriptors: back off instead of spinning
                    warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        let (stream, last) = Tracked::new(stream);
        let service = Counted {
            app: app.clone(),
            requests: Arc::clone(&last.requests),
        };
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service))
            .into_owned();
        let conn = graceful.watch(conn);
        // (a request still being answered sends its 408 at the request timeout: a connection
        // that quiet for longer has nothing in flight)
        let idle = limits
            .idle_timeout
            .max(limits.request_timeout + Duration::from_secs(2));
        tokio::spawn(async move {
            tokio::select! {
                r = conn => if let Err(e) = r { debug!("connection ended: {e}") },
                () = idle_for(&last, idle) => debug!("closed a connection idle for {idle:?}"),
                () = no_request_for(&last.requests, idle) => {
                    debug!("closed a connection that sent no request for {idle:?}");
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(limits.shutdown_grace) => {
            warn!("HTTP connections still open after {:?}; closing them", limits.shutdown_grace);
        }
    }
}

/// Resolves once `stop` is true (the watch guard is dropped inside, so the future stays Send).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A TCP stream that notes when a byte last went either way (ms since `since`).
struct Tracked {
    inner: TcpStream,
    since: Instant,
    last: Arc<AtomicU64>,
}

impl Tracked {
    fn new(inner: TcpStream) -> (Tracked, Activity) {
        let since = Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        let activity = Activity {
            since,
            last: Arc::clone(&last),
            requests: Arc::new(Requests {
                since,
                open: AtomicU64::new(0),
                last: AtomicU64::new(0),
            }),
        };
        (Tracked { inner, since, last }, activity)
    }

    fn touch(&self) {
        self.last
            .store(self.since.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// When a [`Tracked`] stream last moved a byte, and its requests.
struct Activity {
    since: Instant,
    last: Arc<AtomicU64>,
    requests: Arc<Requests>,
}

/// The requests of one connection: how many are being answered (until their response's body is
/// sent or dropped), and when one last began or ended (ms since `since`).
struct Requests {
    since: Instant,
    open: AtomicU64,
    last: AtomicU64,
}

impl Requests {
    fn touch(&self) {
        self.last
            .store(self.since.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// One request being answered: counted in [`Requests`] until dropped.
struct Answering(Arc<Requests>);

impl Answering {
    fn new(r: &Arc<Requests>) -> Answering {
        r.open.fetch_add(1, Ordering::Relaxed);
        r.touch();
        Answering(Arc::clone(r))
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.touch();
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Resolves once no request has been answered, begun or ended for `idle`.
async fn no_request_for(r: &Requests, idle: Duration) {
    loop {
        let quiet_until = r.since + Duration::from_millis(r.last.load(Ordering::Relaxed)) + idle;
        let now = Instant::now();
        if now >= quiet_until && r.open.load(Ordering::Relaxed) == 0 {
            return;
        }
        tokio::time::sleep_until(quiet_until.max(now + Duration::from_millis(100)).into()).await;
    }
}

/// The app, counting a connection's requests in [`Requests`]: each counts from its call until
/// its response's body is done.
#[derive(Clone)]
struct Counted {
    app: Router,
    requests: Arc<Requests>,
}

impl<B> tower::Service<axum::http::Request<B>> for Counted
where
    B: axum::body::HttpBody<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::<axum::extract::Request>::poll_ready(&mut self.app, cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let answering = Answering::new(&self.requests);
        let call = tower::Service::call(&mut self.app, req.map(axum::body::Body::new));
        Box::pin(async move {
            let resp = call.await?;
            Ok(resp.map(|body| {
                axum::body::Body::new(WithAnswering {
                    body,
                    _answering: answering,
                })
            }))
        })
    }
}

/// A response body that keeps its request counted until it is sent or dropped.
struct WithAnswering {
    body: axum::body::Body,
    _answering: Answering,
}

impl axum::body::HttpBody for WithAnswering {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Resolves once the stream has moved no byte for `idle`.
async fn idle_for(a: &Activity, idle: Duration) {
    loop {
        let last = a.since + Duration::from_millis(a.last.load(Ordering::Relaxed));
        let quiet_until = last + idle;
        if Instant::now() >= quiet_until {
            return;
        }
        tokio::time::sleep_until(quiet_until.into()).await;
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
