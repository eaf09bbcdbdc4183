//! Test harness: real `redis-server` processes on free ports (start, stop, kill, restart), the real
//! `eggtimer` binary as a child process, and the real wasm plugins built from `plugins/`.
//!
//! A program that is missing makes the test fail with how to install it; nothing is skipped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub use eggtimer;

pub mod api_doc;
pub mod as_key;
mod cluster;
pub mod events;
pub mod guests;
mod proxy;
pub mod redis_log;
mod redis_server;
mod released;
mod runner_process;
mod sentinel;
mod starts;
mod store;
mod streams;
pub use cluster::RedisCluster;
pub use proxy::Proxy;
pub use redis_server::RedisServer;
pub use released::released_eggtimer;
pub use runner_process::RunnerProcess;
pub use sentinel::Sentinels;
pub use starts::{both_ran, runners_holding_shards, starts, upload_start_reporter};
pub use store::{
    claim_when_due, due_entries, find_all, found_ids, key, layout_of, noop_task,
    store_keeping_done, store_on,
};
pub use streams::{events_key, read_events, read_events_timed, read_stream, read_stream_timed};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace")
        .to_path_buf()
}

/// A fresh directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "eggtimer-test-{}-{}-{}",
        tag,
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("creating a temp dir");
    d
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` every few ms until it returns Some, or panics after `limit` saying `what`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace());
    c
}

/// The runner binary: `EGGTIMER_BIN` when set (`cargo xtask test` builds it first and says where),
/// else built here (a no-op when it is up to date). Built as `cargo xtask test` builds it, with
/// the whole workspace and its tests, so that the binary and the tests share one build of every
/// dependency (built alone, cargo would resolve the dependencies' features differently and build
/// wasmtime and the rest a second time).
pub fn eggtimer_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("EGGTIMER_BIN") {
            return PathBuf::from(bin);
        }
        let status = cargo()
            .args(["build", "--quiet", "--workspace", "--bins", "--tests"])
            .status()
            .expect("running cargo");
        assert!(status.success(), "building the eggtimer binary failed");
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| workspace().join("target"));
        target.join("debug").join("eggtimer")
    })
    .clone()
}

/// The first of `names` found on PATH.
pub fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .find(|p| p.is_file())
}

/// Every plugin built to wasm (`cargo xtask plugins`, once per test process): target/plugins.
pub fn built_plugins() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let status = cargo().args(["xtask", "plugins"]).status().expect("running cargo xtask plugins");
        assert!(
            status.success(),
            "building the plugins failed; they need the wasm target: `rustup target add wasm32-wasip2`"
        );
        workspace().join("target").join("plugins")
    })
    .clone()
}

/// Whether a built plugin is one of the TypeScript or Python ones.
pub fn is_guest_language(file: &str) -> bool {
    file.ends_with("-ts.wasm") || file.ends_with("-py.wasm")
}

/// The Rust plugins, as runners load them with --plugins-dir: a temp dir of links to them. The
/// TypeScript and Python plugins (each seconds to compile, 18 MB for Python) are left out; their
/// tests upload the ones they need.
pub fn plugins_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = temp_dir("plugins");
        for e in std::fs::read_dir(built_plugins()).expect("target/plugins") {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".wasm") && !is_guest_language(&name) {
                std::os::unix::fs::symlink(e.path(), dir.join(&name)).unwrap();
            }
        }
        dir
    })
    .clone()
}

/// The bytes of a built plugin (any language).
pub fn plugin_wasm(name: &str) -> Vec<u8> {
    let path = built_plugins().join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; the TypeScript plugins need Node.js 20+ and npm, the Python ones python3 with venv \
             (Debian/Ubuntu: `sudo apt-get install -y nodejs npm python3-venv`); `cargo xtask plugins` builds them",
            path.display()
        )
    })
}

/// A secrets key file (`--secrets-key-file`, 0600) in a temp dir.
pub fn secrets_key_file() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = temp_dir("secrets").join("secrets.key");
    std::fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A compiled-plugin cache shared by the runners of this test process, in the temp dir.
pub fn shared_plugin_cache() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| temp_dir("plugin-cache")).clone()
}

/// An HTTP client for a runner's API.
pub fn http() -> reqwest::Client {
    http_within(Duration::from_secs(30))
}

/// An HTTP client whose requests give up after `timeout`.
fn http_within(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder().timeout(timeout).build().unwrap()
}

/// The resident memory of a process, in bytes (Linux).
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A JSON reply: (status, body).
pub type Reply = (u16, serde_json::Value);

async fn reply(r: reqwest::Response) -> Reply {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// Sends a request to a runner; `body` is sent as JSON when given.
pub async fn call(method: &str, url: &str, body: Option<serde_json::Value>) -> Reply {
    let mut req = http().request(method.parse().unwrap(), url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    reply(req.send().await.expect("the runner answers")).await
}

/// Uploads a plugin binary. The runner answers once the plugin is compiled, which for a large
/// component in a debug build on a busy machine can take longer than `http()`'s 30 s: this waits
/// up to 5 minutes (how long compiling takes is the benchmark's business, not a test's).
pub async fn upload(base: &str, name: &str, wasm: Vec<u8>) -> Reply {
    let r = http_within(Duration::from_secs(300))
        .put(format!("{base}/v1/plugins/{name}"))
        .header("content-type", "application/wasm")
        .body(wasm)
        .send()
        .await
        .expect("the runner answers");
    reply(r).await
}

/// Waits until a task reaches `state` (or panics after `limit`); returns the task.
pub async fn wait_state(base: &str, id: &str, state: &str, limit: Duration) -> serde_json::Value {
    eventually(limit, &format!("task {id} to be {state}"), || async {
        let (s, t) = call("GET", &format!("{base}/v1/tasks/{id}"), None).await;
        (s == 200 && t["state"] == state).then_some(t)
    })
    .await
}

/// The same component with a custom section appended: another digest, so another version.
pub fn variant(wasm: &[u8], n: usize) -> Vec<u8> {
    let name = b"eggtimer-test-variant";
    let payload = n.to_le_bytes();
    let mut out = wasm.to_vec();
    out.push(0); // custom section
    let size = 1 + name.len() + payload.len();
    assert!(size < 128);
    out.push(size as u8);
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(&payload);
    out
}

/// The same component with a custom section of `bytes` zero bytes appended: a binary as large
/// as a test needs that still loads and runs as the original does.
pub fn padded(wasm: &[u8], bytes: usize) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"eggtimer-test-padding";
    let mut out = wasm.to_vec();
    out.push(0); // custom section
    leb128(1 + name.len() + bytes, &mut out);
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.resize(out.len() + bytes, 0);
    out
}

/// The `id`s of a JSON array of tasks, sorted.
pub fn sorted_ids(tasks: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = tasks
        .as_array()
        .expect("an array of tasks")
        .iter()
        .map(|t| t["id"].as_str().expect("a task id").to_owned())
        .collect();
    ids.sort();
    ids
}

/// The current time in ms.
pub fn now_ms() -> i64 {
    eggtimer::clock::system_ms()
}

/// A runner on `redis` with every plugin of plugins/ and a 50 ms retry base (so retries in a test
/// take moments), with extra args.
pub fn runner_fast_retry(redis: &RedisServer, extra: &[&str]) -> RunnerProcess {
    let mut args = vec!["--retry-base", "50ms"];
    args.extend_from_slice(extra);
    RunnerProcess::with_plugins(redis, &args)
}

/// The value of one series of a runner's `/metrics` (`name{labels}` as exposed), if it has it.
pub async fn metric(base: &str, series: &str) -> Option<f64> {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("the runner answers")
        .text()
        .await
        .expect("a metrics text");
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// An owner's scheduled tasks as (what `name` reads off each, its `priority`), sorted by the
/// first: `name` picks the field that tells them apart.
pub async fn owner_priorities(
    base: &str,
    owner: &str,
    name: fn(&serde_json::Value) -> &serde_json::Value,
) -> Vec<(String, serde_json::Value)> {
    let (s, list) = call("GET", &format!("{base}/v1/owners/{owner}/tasks"), None).await;
    assert_eq!(s, 200, "{list}");
    let mut got: Vec<(String, serde_json::Value)> = list
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|t| (name(t).as_str().unwrap().to_owned(), t["priority"].clone()))
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    got
}

/// Schedules one spec or an array through the API, expecting 201.
pub async fn post_tasks(base: &str, specs: serde_json::Value) {
    let (s, b) = call("POST", &format!("{base}/v1/tasks"), Some(specs)).await;
    assert_eq!(s, 201, "{b}");
}

/// A client of the API scheduling `coupon-expiry` reminders: `batches` requests of 10, one every
/// 100 ms, each due a second after it is sent.
pub struct Reminders {
    acknowledged: Arc<AtomicU64>,
    client: tokio::task::JoinHandle<Vec<String>>,
}

/// Starts a [`Reminders`] client against the API at `base`.
pub fn schedule_reminders(base: &str, batches: usize) -> Reminders {
    let url = format!("{base}/v1/tasks");
    let acknowledged = Arc::new(AtomicU64::new(0));
    let count = acknowledged.clone();
    let client = tokio::spawn(async move {
        let mut ids = Vec::new();
        for batch in 0..batches {
            let due = now_ms() + 1_000;
            let specs: Vec<serde_json::Value> = (0..10)
                .map(|i| {
                    serde_json::json!({"plugin": "coupon-expiry", "id": format!("c{batch}-{i}"), "run_at": due,
                           "payload": {"coupon_id": "x", "user_id": "u1", "expires_at": due}})
                })
                .collect();
            let (s, _) = call("POST", &url, Some(serde_json::json!(specs))).await;
            if s == 201 {
                ids.extend((0..10).map(|i| format!("c{batch}-{i}")));
                count.store(ids.len() as u64, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ids
    });
    Reminders {
        acknowledged,
        client,
    }
}

impl Reminders {
    /// Waits until at least `n` reminders were answered 201.
    pub async fn wait_acknowledged(&self, n: u64) {
        eventually(
            Duration::from_secs(30),
            "reminders acknowledged",
            || async { (self.acknowledged.load(Ordering::SeqCst) >= n).then_some(()) },
        )
        .await;
    }

    /// Waits for the client's last request; the ids answered 201 (acknowledged).
    pub async fn acknowledged(self) -> Vec<String> {
        self.client.await.unwrap()
    }
}

/// Waits until no shard holds a task scheduled or in flight.
pub async fn wait_drained(store: &eggtimer::Store, limit: Duration) {
    eventually(limit, "every task to have run", || async {
        let c = store.shard_counts().await.ok()?;
        c.iter()
            .all(|c| c.scheduled + c.inflight == 0)
            .then_some(())
    })
    .await;
}

/// Every string Redis holds, whatever the key's type.
pub fn everything_in_redis(redis: &RedisServer) -> String {
    let mut c = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    let mut all = String::new();
    for k in keys {
        all.push_str(&k);
        let ty: String = redis::cmd("TYPE").arg(&k).query(&mut c).unwrap();
        let v: redis::Value = match ty.as_str() {
            "string" => redis::cmd("GET").arg(&k).query(&mut c).unwrap(),
            "hash" => redis::cmd("HGETALL").arg(&k).query(&mut c).unwrap(),
            "list" => redis::cmd("LRANGE")
                .arg(&k)
                .arg(0)
                .arg(-1)
                .query(&mut c)
                .unwrap(),
            "set" => redis::cmd("SMEMBERS").arg(&k).query(&mut c).unwrap(),
            "zset" => redis::cmd("ZRANGE")
                .arg(&k)
                .arg(0)
                .arg(-1)
                .query(&mut c)
                .unwrap(),
            "stream" => redis::cmd("XRANGE")
                .arg(&k)
                .arg("-")
                .arg("+")
                .query(&mut c)
                .unwrap(),
            _ => redis::Value::Nil,
        };
        all.push_str(&format!("{v:?}"));
    }
    all
}

/// Asserts an API answer is 503 `not_replicated` for a write none of its one replica confirmed.
pub fn assert_not_replicated(status: u16, body: &serde_json::Value) {
    assert_eq!(
        (status, &body["error"]["code"]),
        (503, &serde_json::json!("not_replicated")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("0 of the 1 replicas"),
        "{body}"
    );
}
