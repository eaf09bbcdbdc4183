//! The clients a team's services call eggtimer with (clients/rust, clients/js, clients/python),
//! each against a real runner with a token: schedule, read, move, cancel, run now, an owner's
//! tasks, a recurring schedule, the API's errors. The TypeScript and Python clients run their own
//! suites (node's test runner, unittest) with EGGTIMER_URL and EGGTIMER_TOKEN naming this runner;
//! the TypeScript client's types are checked by compiling its README example with tsc.

use std::process::Command;
use std::time::{Duration, Instant};

use eggtimer_client::{Client, DebounceVerdict, TaskSpec, TaskState};
use eggtimer_tests::guests::{program, run_ok};
use eggtimer_tests::{RedisServer, RunnerProcess, built_plugins, now_ms, temp_dir, workspace};
use serde_json::json;

const TOKEN: &str = "clients-admin-token";
const HOUR: i64 = 3_600_000;

fn runner(redis: &RedisServer) -> RunnerProcess {
    RunnerProcess::with_plugins(redis, &["--token", TOKEN])
}

fn run_suite(cmd: &mut Command, what: &str, r: &RunnerProcess) -> String {
    run_ok(
        cmd.env("EGGTIMER_URL", &r.url)
            .env("EGGTIMER_TOKEN", TOKEN)
            .env("EGGTIMER_PLUGIN", "noop")
            .env("EGGTIMER_PLUGIN_2", "bench-record")
            .env("PYTHONDONTWRITEBYTECODE", "1"),
        what,
    )
}

#[tokio::test]
async fn the_rust_client_schedules_moves_cancels_and_reads() {
    let redis = RedisServer::start();
    let r = runner(&redis);
    let et = Client::new(&r.url).token(Some(TOKEN.into()));

    let at = now_ms() + HOUR;
    let spec = TaskSpec::new("noop")
        .payload(json!({"order_id": "o-17"}))
        .id("rs order/1")
        .owner("u-rs")
        .priority(4)
        .run_at(at);
    let got = et.schedule(&spec).await.unwrap();
    assert_eq!((got.id.as_str(), got.run_at), ("rs order/1", at));
    let task = et.get("rs order/1").await.unwrap().expect("the task");
    assert_eq!(task.state, TaskState::Scheduled);
    assert_eq!(task.payload, json!({"order_id": "o-17"}));
    assert_eq!(task.owner.as_deref(), Some("u-rs"));
    assert_eq!(task.priority, 4);

    assert_eq!(
        et.move_by("rs order/1", -HOUR / 2).await.unwrap().run_at,
        at - HOUR / 2
    );
    assert_eq!(
        et.move_to("rs order/1", at + 5).await.unwrap().run_at,
        at + 5
    );
    assert_eq!(et.get("rs order/1").await.unwrap().unwrap().run_at, at + 5);
    assert!(et.cancel("rs order/1").await.unwrap());
    assert!(et.get("rs order/1").await.unwrap().is_none());
    assert!(!et.cancel("rs order/1").await.unwrap());

    // one id in two plugins: the by-id calls name one with in_plugin
    for plugin in ["noop", "bench-record"] {
        let spec = TaskSpec::new(plugin).id("rs twin").run_at(at);
        et.schedule(&spec).await.unwrap();
    }
    let e = et.get("rs twin").await.unwrap_err();
    assert_eq!(e.code(), Some("ambiguous_id"), "{e}");
    let other = et.in_plugin("bench-record");
    assert_eq!(
        other.get("rs twin").await.unwrap().unwrap().plugin,
        "bench-record"
    );
    assert_eq!(other.move_by("rs twin", 5).await.unwrap().run_at, at + 5);
    assert!(other.cancel("rs twin").await.unwrap());
    assert_eq!(et.get("rs twin").await.unwrap().unwrap().plugin, "noop");
    assert!(et.cancel("rs twin").await.unwrap());

    // due now, and run now: both run
    let now = et.schedule(&TaskSpec::new("noop")).await.unwrap();
    et.schedule(&TaskSpec::new("noop").id("rs-later").delay_ms(HOUR))
        .await
        .unwrap();
    et.run_now("rs-later").await.unwrap();
    for id in [now.id.as_str(), "rs-later"] {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let t = et.get(id).await.unwrap();
            if t.as_ref().map(|t| t.state) == Some(TaskState::Done) {
                break;
            }
            assert!(Instant::now() < deadline, "{id} never ran: {t:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // an owner's tasks: listed in due order, shifted, cancelled
    let specs: Vec<TaskSpec> = (0..3)
        .map(|i| {
            TaskSpec::new("noop")
                .id(format!("rs-o-{i}"))
                .owner("u-rs")
                .run_at(at + i)
        })
        .collect();
    assert_eq!(et.schedule_many(&specs).await.unwrap().len(), 3);
    let ids = |ts: Vec<eggtimer_client::Task>| ts.into_iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(
        ids(et.owner_tasks("u-rs").await.unwrap()),
        ["rs-o-0", "rs-o-1", "rs-o-2"]
    );
    assert_eq!(
        et.shift_owner("u-rs", -1000, Some("noop")).await.unwrap(),
        3
    );
    assert_eq!(et.owner_tasks("u-rs").await.unwrap()[0].run_at, at - 1000);
    // paused (its counts say so), resumed
    let noop_paused = eggtimer_client::OwnerPauses {
        all: false,
        plugins: vec!["noop".into()],
    };
    assert_eq!(
        et.pause_owner("u-rs", Some("noop")).await.unwrap(),
        noop_paused
    );
    let stats = et.owner_stats("u-rs").await.unwrap();
    assert_eq!(
        (stats.scheduled, &stats.plugins[0].plugin, &stats.paused),
        (3, &"noop".to_owned(), &noop_paused)
    );
    // (none was due, so none was parked: none to put back)
    assert_eq!(et.resume_owner("u-rs", None).await.unwrap(), 0);
    let stats = et.owner_stats("u-rs").await.unwrap();
    assert_eq!(stats.paused, eggtimer_client::OwnerPauses::default());
    assert_eq!(et.cancel_owner("u-rs", None).await.unwrap(), 3);
    assert!(et.owner_tasks("u-rs").await.unwrap().is_empty());

    // a task that a payment cancels, and the event that does
    let paid = TaskSpec::new("noop")
        .id("paid-rs")
        .run_at(at)
        .cancel_on("payments", "o-rs");
    et.schedule(&paid).await.unwrap();
    assert_eq!(et.get("paid-rs").await.unwrap().unwrap().on.len(), 1);
    let data = json!({"amount": 5});
    assert_eq!(et.publish("payments", "o-rs", &data).await.unwrap(), 1);
    assert!(et.get("paid-rs").await.unwrap().is_none());

    // a debounced task: two payloads of one key make one task that has both; a debounced spec
    // is answered without a due time, so it has methods of its own (nothing sent to the wrong one)
    let fed = |n: i64| {
        TaskSpec::new("noop")
            .payload(json!({"n": n}))
            .debounce("rs-feed", HOUR, 2 * HOUR)
    };
    let d = et.schedule_debounced(&fed(1)).await.unwrap();
    assert_eq!(
        (d.id.as_str(), d.debounced),
        ("rs-feed", DebounceVerdict::New)
    );
    let d = et.schedule_debounced_many(&[fed(2)]).await.unwrap();
    assert_eq!(d[0].debounced, DebounceVerdict::Merged);
    let e = et.schedule(&fed(3)).await.unwrap_err();
    assert!(e.to_string().contains("schedule_debounced"), "{e}");
    let e = et
        .schedule_debounced(&TaskSpec::new("noop").id("rs-plain"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("Client::schedule"), "{e}");
    assert!(et.get("rs-plain").await.unwrap().is_none());
    let task = et.get("rs-feed").await.unwrap().unwrap();
    assert_eq!(task.batch, [json!({"n": 1}), json!({"n": 2})]);
    assert!(et.cancel("rs-feed").await.unwrap());

    // the API's errors, with status, code and message
    let e = et
        .schedule(&TaskSpec::new("no-such-plugin"))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(422), "{e}");
    assert!(e.to_string().contains("no-such-plugin"), "{e}");
    let e = et
        .schedule(&TaskSpec::new("noop").run_at(i64::MAX))
        .await
        .unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(400), Some("bad_request")),
        "{e}"
    );
    let e = Client::new(&r.url).get("x").await.unwrap_err();
    assert_eq!(e.status(), Some(401), "no token: {e}");
    let e = Client::new("http://127.0.0.1:9")
        .get("x")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is eggtimer running there?"), "{e}");
}

#[tokio::test]
async fn the_typescript_client_passes_its_suite_against_a_real_runner() {
    built_plugins(); // installs tsc into target/js-tools
    let node = program(
        "node",
        "install Node.js 20+ (Debian/Ubuntu: sudo apt-get install -y nodejs npm)",
    );
    let redis = RedisServer::start();
    let r = runner(&redis);
    let js = workspace().join("clients/js");
    let out = run_suite(
        Command::new(&node)
            .current_dir(&js)
            .args(["--test", "test/"]),
        "node --test (clients/js)",
        &r,
    );
    assert!(
        out.contains("# pass 10") && out.contains("# fail 0"),
        "{out}"
    );

    // the README's example, type-checked against index.d.ts (strict)
    let stage = temp_dir("clientts");
    std::fs::create_dir_all(stage.join("node_modules/@eggtimer")).unwrap();
    std::os::unix::fs::symlink(&js, stage.join("node_modules/@eggtimer/client")).unwrap();
    let readme = std::fs::read_to_string(js.join("README.md")).unwrap();
    let example = readme
        .split("```ts\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a ```ts example in clients/js/README.md");
    // Node's `process` without @types/node
    let shim = "declare const process: { env: Record<string, string | undefined> };\n";
    std::fs::write(stage.join("example.ts"), format!("{shim}{example}")).unwrap();
    std::fs::write(
        stage.join("tsconfig.json"),
        r#"{ "compilerOptions": { "strict": true, "noEmit": true, "target": "es2022", "module": "esnext", "moduleResolution": "bundler", "types": [] }, "files": ["example.ts"] }"#,
    )
    .unwrap();
    let tsc = workspace().join("target/js-tools/node_modules/.bin/tsc");
    let out = Command::new(&tsc)
        .current_dir(&stage)
        .args(["-p", "tsconfig.json", "--pretty", "false"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the README's example does not type-check:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[tokio::test]
async fn the_python_client_passes_its_suite_against_a_real_runner() {
    let python = program(
        "python3",
        "install Python 3.9+ (Debian/Ubuntu: sudo apt-get install -y python3)",
    );
    let redis = RedisServer::start();
    let r = runner(&redis);
    let out = run_suite(
        Command::new(&python)
            .current_dir(temp_dir("pyclient"))
            .arg(workspace().join("clients/python/tests/test_client.py"))
            .arg("-v"),
        "python3 -m unittest (clients/python)",
        &r,
    );
    assert!(
        out.contains("Ran 10 tests") && out.contains("\nOK"),
        "{out}"
    );
}
