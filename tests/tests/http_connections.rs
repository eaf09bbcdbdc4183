//! The HTTP listener's connections: an idle one, an HTTP/2 one included, is closed and frees its
//! slot; one that moves bytes (pings) but sends no request is closed as idle too. Real runner
//! processes and raw TCP clients.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use eggtimer_tests::{RedisServer, RunnerProcess, call};
use serde_json::json;

fn start(redis: &RedisServer, extra: &[&str]) -> RunnerProcess {
    RunnerProcess::with_plugins(redis, extra)
}

/// A connection with no traffic is closed after the idle timeout, an HTTP/2 one too (an h2 client
/// that opened a connection and went quiet used to hold its slot for good): with every slot held
/// by idle clients, a request still gets through once they are closed.
#[tokio::test]
async fn idle_connections_http2_too_are_closed_and_free_their_slot() {
    let redis = RedisServer::start();
    let r = start(
        &redis,
        &[
            "--http-max-connections",
            "2",
            "--http-request-timeout",
            "1s",
            "--http-idle-timeout",
            "1s",
        ],
    );
    let h2 = || {
        let mut s = TcpStream::connect(("127.0.0.1", r.port)).unwrap();
        // the HTTP/2 preface and an empty SETTINGS frame, then nothing
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .unwrap();
        s
    };
    let mut idle = [h2(), h2()];
    let started = Instant::now();
    for c in &mut idle {
        c.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = [0u8; 256];
        loop {
            match c.read(&mut buf) {
                Ok(0) => break, // closed by the server
                Ok(_) => {}     // its SETTINGS and the like
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break, // reset by the server
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "an idle HTTP/2 connection was never closed"
            );
        }
    }
    let (s, b) = call("GET", &format!("{}/healthz", r.url), None).await;
    assert_eq!((s, b), (200, json!({"ok": true})));
}

/// A connection that moves bytes but sends no request is closed as idle too: an HTTP/2 client
/// that pings every 200 ms (the server answering each ping) and never asks anything used to keep
/// its slot for good; it is closed after the idle timeout (here 3 s: the request timeout + 2 s).
#[tokio::test]
async fn a_connection_that_only_pings_is_closed_as_idle() {
    let redis = RedisServer::start();
    let r = start(
        &redis,
        &["--http-request-timeout", "1s", "--http-idle-timeout", "1s"],
    );
    let mut c = TcpStream::connect(("127.0.0.1", r.port)).unwrap();
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 256];
    let mut answered = 0usize;
    let closed_after = loop {
        // a PING frame: 8 bytes of opaque data, stream 0
        let ping = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00eggtimer";
        if c.write_all(ping).is_err() {
            break started.elapsed();
        }
        match c.read(&mut buf) {
            Ok(0) => break started.elapsed(),
            Ok(n) => answered += buf[..n].windows(8).filter(|w| w == b"eggtimer").count(),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break started.elapsed(),
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "a connection that pinged for 20 s without a request was never closed ({answered} pings answered)"
        );
        // the client's pace: a ping every 200 ms
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(answered > 0, "the server answered no ping");
    assert!(
        closed_after >= Duration::from_millis(2500),
        "closed after {closed_after:?}, before the idle timeout"
    );
}
