//! Plugins calling services: the `webhook` sample plugin in a real runner process delivering to a
//! real HTTP server on 127.0.0.1, with its allowed_hosts, its secret and the host's
//! Idempotency-Key; a real redis-server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use eggtimer_tests::{
    RedisServer, RunnerProcess, call, eventually, plugins_dir, post_tasks, secrets_key_file,
    wait_state,
};
use hmac::Mac;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);
const SECRET: &str = "whsec-5f1d3a0b9c7e4e21a8d6";

/// One request the receiver got.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    headers: HeaderMap,
    body: Bytes,
    /// When it arrived.
    at: Instant,
}

#[derive(Clone, Default)]
struct Receiver {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// How often each path was asked.
    count: Arc<Mutex<HashMap<String, usize>>>,
}

impl Receiver {
    fn of(&self, path: &str) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|s| s.path == path).cloned().collect()
    }
}

/// `/ok`: 200. `/flaky`: 500, then 200. `/bad`: 400. `/hold`: the first request is never
/// answered (held for a minute), later ones 200.
async fn receive(
    State(r): State<Receiver>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let n = {
        let mut c = r.count.lock().unwrap();
        let n = c.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    r.seen.lock().unwrap().push(Seen {
        path: path.clone(),
        headers,
        body,
        at: Instant::now(),
    });
    match (path.as_str(), n) {
        ("flaky", 1) => (StatusCode::INTERNAL_SERVER_ERROR, "try later".into()),
        ("bad", _) => (StatusCode::BAD_REQUEST, "no such hook".into()),
        ("hold", 1) => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            (StatusCode::OK, "late".into())
        }
        _ => (StatusCode::OK, "thanks".into()),
    }
}

async fn start_receiver() -> (Receiver, u16) {
    let r = Receiver::default();
    let app = axum::Router::new()
        .route("/{path}", axum::routing::post(receive))
        .with_state(r.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (r, port)
}

fn runner(redis: &RedisServer, key: &std::path::Path, extra: &[&str]) -> RunnerProcess {
    let dir = plugins_dir();
    let mut args = vec![
        "--plugins-dir",
        dir.to_str().unwrap(),
        "--retry-base",
        "50ms",
        "--secrets-key-file",
        key.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    RunnerProcess::start(&redis.url(), &args)
}

/// Gives the webhook plugin its signing secret.
async fn set_signing_key(base: &str) {
    let (s, b) = call(
        "PUT",
        &format!("{base}/v1/plugins/webhook/secrets/signing_key"),
        Some(json!({"value": SECRET})),
    )
    .await;
    assert_eq!(s, 204, "{b}");
}

fn delivery(id: &str, url: &str) -> Value {
    json!({"plugin": "webhook", "id": id, "max_attempts": 3,
           "payload": {"url": url, "body": {"order_id": id, "amount": 1250}}})
}

fn header<'a>(s: &'a Seen, name: &str) -> &'a str {
    s.headers
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or_else(|| panic!("no {name} header in {s:?}"))
}

fn signature(body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[tokio::test(flavor = "multi_thread")]
async fn webhooks_go_only_where_allowed_signed_once_with_one_idempotency_key() {
    let redis = RedisServer::start();
    let (recv, port) = start_receiver().await;
    let key = secrets_key_file();
    let r = runner(&redis, &key, &[]);
    let base = &r.url;
    let origin = format!("http://127.0.0.1:{port}");

    // the secret: set, listed by name, never shown
    set_signing_key(base).await;
    let (s, list) = call("GET", &format!("{base}/v1/plugins/webhook/secrets"), None).await;
    assert_eq!(s, 200);
    assert_eq!(list[0]["name"], "signing_key", "{list}");
    assert!(list[0]["updated_at"].as_i64().unwrap() > 0);

    // no allowed_hosts yet: the call is refused naming the origin, and nothing arrives
    post_tasks(base, delivery("d-refused", &format!("{origin}/ok"))).await;
    let t = wait_state(base, "d-refused", "dead", T).await;
    let err = t["last_error"].as_str().unwrap_or_default().to_owned();
    assert!(
        err.contains(&format!(
            "{origin} is not in plugin \"webhook\"'s allowed_hosts"
        )),
        "{t}"
    );
    assert!(recv.of("ok").is_empty(), "a refused request arrived");

    let (s, p) = call(
        "PATCH",
        &format!("{base}/v1/plugins/webhook"),
        Some(
            json!({"allowed_hosts": [&origin, format!("http://localhost:{port}")],
                    "config": {"region": "eu"}}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(p["allowed_hosts"][0], origin.as_str());
    assert_eq!(p["config"]["region"], "eu");
    // every runner applies a setting within a second
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    // allowed: delivered once, signed with the secret, with the task id and an idempotency key
    post_tasks(base, delivery("d-ok", &format!("{origin}/ok"))).await;
    let t = wait_state(base, "d-ok", "done", T).await;
    assert_eq!(t["attempts"], 1, "{t}");
    let ok = recv.of("ok");
    assert_eq!(ok.len(), 1, "delivered once");
    let body: Value = serde_json::from_slice(&ok[0].body).unwrap();
    assert_eq!(body, json!({"order_id": "d-ok", "amount": 1250}));
    assert_eq!(
        header(&ok[0], "x-eggtimer-signature"),
        signature(&ok[0].body)
    );
    assert_eq!(header(&ok[0], "x-eggtimer-task"), "d-ok");
    assert_eq!(header(&ok[0], "content-type"), "application/json");
    assert_eq!(header(&ok[0], "idempotency-key").len(), 32);

    // 500 then 200: two requests, one Idempotency-Key
    post_tasks(base, delivery("d-flaky", &format!("{origin}/flaky"))).await;
    let t = wait_state(base, "d-flaky", "done", T).await;
    assert_eq!(t["attempts"], 2, "{t}");
    let flaky = recv.of("flaky");
    assert_eq!(flaky.len(), 2);
    assert_eq!(
        header(&flaky[0], "idempotency-key"),
        header(&flaky[1], "idempotency-key")
    );
    assert_ne!(
        header(&flaky[0], "idempotency-key"),
        header(&ok[0], "idempotency-key")
    );

    // 400: dead at once, the status and the answer in the error
    post_tasks(base, delivery("d-bad", &format!("{origin}/bad"))).await;
    let t = wait_state(base, "d-bad", "dead", T).await;
    assert_eq!(t["attempts"], 1, "{t}");
    let err = t["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("the receiver answered 400: no such hook"),
        "{t}"
    );

    // a name that resolves to a loopback address is refused, though its origin is allowed
    post_tasks(
        base,
        delivery("d-local", &format!("http://localhost:{port}/ok")),
    )
    .await;
    let t = wait_state(base, "d-local", "dead", T).await;
    let err = t["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("localhost resolves to") && err.contains("loopback, private or link-local"),
        "{t}"
    );
    assert_eq!(recv.of("ok").len(), 1, "the request to localhost arrived");

    // the secret is nowhere in clear: not in Redis, not in an answer, not in the log
    let all = eggtimer_tests::everything_in_redis(&redis);
    assert!(
        all.contains("plugin:secrets:webhook"),
        "no sealed secret in Redis"
    );
    assert!(!all.contains(SECRET), "the secret is in Redis in clear");
    let (_, plugin) = call("GET", &format!("{base}/v1/plugins/webhook"), None).await;
    assert!(!plugin.to_string().contains(SECRET));
    assert!(!list.to_string().contains(SECRET));
    assert!(!r.log_text().contains(SECRET), "the secret is in the log");

    // the metrics count the requests by plugin, host and status
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("eggtimer_http_requests_total")
                && l.contains("plugin=\"webhook\"")
                && l.contains("status=\"500\"")),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runner_killed_while_the_receiver_holds_the_request_is_followed_by_one_with_the_same_key()
{
    let redis = RedisServer::start();
    let (recv, port) = start_receiver().await;
    let key = secrets_key_file();
    let mut a = runner(&redis, &key, &["--lease", "2s"]);
    let base = a.url.clone();
    let (s, _) = call(
        "PUT",
        &format!("{base}/v1/plugins/webhook/secrets/signing_key"),
        Some(json!({"value": SECRET})),
    )
    .await;
    assert_eq!(s, 204);
    let (s, b) = call(
        "PATCH",
        &format!("{base}/v1/plugins/webhook"),
        Some(
            json!({"allowed_hosts": [format!("http://127.0.0.1:{port}")], "time_limit_ms": 30_000}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    post_tasks(
        &base,
        delivery("d-hold", &format!("http://127.0.0.1:{port}/hold")),
    )
    .await;
    eventually(T, "the held request", || async {
        (!recv.of("hold").is_empty()).then_some(())
    })
    .await;
    a.kill();
    // another runner takes the task over after its lease and delivers it again, with the key
    let b = runner(&redis, &key, &["--lease", "2s"]);
    let t = wait_state(&b.url, "d-hold", "done", T).await;
    let hold = recv.of("hold");
    assert_eq!(hold.len(), 2, "{t}");
    assert_eq!(
        header(&hold[0], "idempotency-key"),
        header(&hold[1], "idempotency-key"),
        "the second delivery carries another Idempotency-Key"
    );
    assert_eq!(hold[0].body, hold[1].body);
}

/// A test CA and a certificate for 127.0.0.1 it signed (openssl), in a temp dir: (ca.pem,
/// cert.pem, key.pem).
fn test_ca() -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let dir = eggtimer_tests::temp_dir("test-ca");
    let openssl = eggtimer_tests::find_program(&["openssl"])
        .expect("openssl is not installed; Debian/Ubuntu: `sudo apt-get install -y openssl`");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&openssl)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=eggtimer test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "key.pem",
        "-out",
        "req.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "req.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    )
}

/// An HTTPS receiver (Python's http.server with ssl) on 127.0.0.1: answers 200 and prints
/// `GOT <path> <body>` for each POST. Returns the process and its port.
fn https_receiver(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> (std::process::Child, u16, Arc<Mutex<Vec<String>>>) {
    use std::io::BufRead;
    let script = r#"
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        b = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        print("GOT", self.path, b.decode(), flush=True)
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(sys.argv[1], sys.argv[2])
s.socket = ctx.wrap_socket(s.socket, server_side=True)
print("PORT", s.server_address[1], flush=True)
s.serve_forever()
"#;
    let mut child = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(cert)
        .arg(key)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the HTTPS receiver");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let port: u16 = first.strip_prefix("PORT ").unwrap().parse().unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = Arc::clone(&got);
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            g.lock().unwrap().push(l);
        }
    });
    (child, port, got)
}

#[tokio::test(flavor = "multi_thread")]
async fn https_to_a_private_ca_needs_the_operators_ca_file() {
    let redis = RedisServer::start();
    let (ca, cert, key) = test_ca();
    let (mut server, port, got) = https_receiver(&cert, &key);
    let secrets = secrets_key_file();
    let origin = format!("https://127.0.0.1:{port}");
    // without the CA file the certificate is not trusted: the delivery fails, nothing arrives
    let a = runner(&redis, &secrets, &[]);
    let (s, _) = call(
        "PUT",
        &format!("{}/v1/plugins/webhook/secrets/signing_key", a.url),
        Some(json!({"value": SECRET})),
    )
    .await;
    assert_eq!(s, 204);
    let (s, b) = call(
        "PATCH",
        &format!("{}/v1/plugins/webhook", a.url),
        Some(json!({"allowed_hosts": [&origin]})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    post_tasks(
        &a.url,
        json!({"plugin": "webhook", "id": "tls-untrusted", "max_attempts": 1,
               "payload": {"url": format!("{origin}/in"), "body": {"n": 1}}}),
    )
    .await;
    let t = wait_state(&a.url, "tls-untrusted", "dead", T).await;
    let err = t["last_error"].as_str().unwrap_or_default().to_lowercase();
    assert!(err.contains("certificate"), "{t}");
    drop(a);
    // with it, delivered over TLS
    let b = runner(&redis, &secrets, &["--http-ca-file", ca.to_str().unwrap()]);
    post_tasks(
        &b.url,
        json!({"plugin": "webhook", "id": "tls-ok", "max_attempts": 1,
               "payload": {"url": format!("{origin}/in"), "body": {"n": 2}}}),
    )
    .await;
    let t = eventually(T, "tls-ok to finish", || async {
        let (_, t) = call("GET", &format!("{}/v1/tasks/tls-ok", b.url), None).await;
        (t["state"] == "done" || t["state"] == "dead").then_some(t)
    })
    .await;
    assert_eq!(t["state"], "done", "{t}");
    let lines = got.lock().unwrap().clone();
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(lines, vec![r#"GOT /in {"n":2}"#.to_owned()]);
}

/// A rate limit holds where it matters, at the service the plugin calls: the webhook plugin
/// under `rate_limit {max 50, per_ms 1000}` with 400 deliveries due at once, on two runners, and
/// the receiver sees at most 55 requests (50 + 10%) in any second, each delivery once, no attempt
/// used by waiting. Before, a start was counted at the time reserved for it, and runs that came
/// back late bunched with the next window's (59–69 in the busiest second).
#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limit_holds_at_the_receiver_across_two_runners() {
    let redis = RedisServer::start();
    let (recv, port) = start_receiver().await;
    let key = secrets_key_file();
    let r = runner(&redis, &key, &[]);
    let _second = runner(&redis, &key, &[]);
    let base = &r.url;
    let origin = format!("http://127.0.0.1:{port}");
    set_signing_key(base).await;
    let (s, p) = call(
        "PATCH",
        &format!("{base}/v1/plugins/webhook"),
        Some(json!({"allowed_hosts": [&origin], "rate_limit": {"max": 50, "per_ms": 1000}})),
    )
    .await;
    assert_eq!(s, 200, "{p}");
    // every runner applies a setting within a second
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let n = 400;
    let specs: Vec<Value> = (0..n)
        .map(|i| delivery(&format!("r-{i}"), &format!("{origin}/rated")))
        .collect();
    post_tasks(base, json!(specs)).await;
    for i in 0..n {
        let t = wait_state(base, &format!("r-{i}"), "done", T).await;
        assert_eq!(t["attempts"], 1, "waiting used no attempt: {t}");
    }
    let seen = recv.of("rated");
    let mut ids: Vec<String> = seen
        .iter()
        .map(|s| header(s, "x-eggtimer-task").to_owned())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!((seen.len(), ids.len()), (n, n), "each delivery once");
    let mut at: Vec<Instant> = seen.iter().map(|s| s.at).collect();
    at.sort();
    // the most requests in any second at the receiver
    let (mut busiest, mut from) = (0, 0);
    for to in 0..at.len() {
        while at[to] - at[from] >= Duration::from_secs(1) {
            from += 1;
        }
        busiest = busiest.max(to - from + 1);
    }
    eprintln!(
        "busiest second at the receiver: {busiest}; 400 delivered in {:?}",
        at[at.len() - 1] - at[0]
    );
    assert!(busiest <= 55, "{busiest} requests in one second");
}

/// A secret's value is at most 65,536 characters, as the document's `maxLength` counts them,
/// however JSON writes them: one past it is a 400 naming the limit (it was a 413 when escaped
/// characters made the body larger than the route read), 65,536 four-byte characters fit.
#[tokio::test]
async fn a_secret_is_at_most_65536_characters_however_json_writes_them() {
    let redis = RedisServer::start();
    let key = secrets_key_file();
    let r = runner(&redis, &key, &[]);
    let put = |n: usize| {
        // U+1F600 as an escaped surrogate pair: twelve bytes of JSON for one character
        let body = format!("{{\"value\": \"{}\"}}", "\\ud83d\\ude00".repeat(n));
        let url = format!("{}/v1/plugins/webhook/secrets/big", r.url);
        async move {
            let resp = reqwest::Client::new()
                .put(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap())
        }
    };
    let (s, b) = put(65_537).await;
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("at most 65536 characters"), "{b}");
    let (s, b) = put(65_536).await;
    assert_eq!(s, 204, "{b}");
}
