//! A component that asks for more than any plugin may have (core instances, memories), whose
//! start code traps or never ends, or that costs too much to compile, is refused at upload,
//! naming why, and takes nothing from the other plugins: their tasks on the same runner run. The components are written here in the component model's text format:
//! each exports a `handle` that answers done, beside the core instances it asks for.

use std::time::Duration;

use eggtimer_tests::{
    RedisServer, RunnerProcess, metric, now_ms, plugin_wasm, post_tasks as schedule,
    runner_fast_retry as start, temp_dir, upload, wait_state,
};
use serde_json::json;

const T: Duration = Duration::from_secs(60);

/// A plugin component whose `handle` answers done, with `bare` more core instances of a module
/// without memory and `memories` more of one with a memory of a page.
fn greedy_component(bare: usize, memories: usize) -> Vec<u8> {
    let mut more = String::new();
    for _ in 0..bare {
        more.push_str("  (core instance (instantiate $bare))\n");
    }
    for _ in 0..memories {
        more.push_str("  (core instance (instantiate $with-memory))\n");
    }
    component(&more)
}

/// A plugin component whose `handle` answers done, with `more` (core modules and instances)
/// beside it.
fn component(more: &str) -> Vec<u8> {
    let mut wat = String::from(
        r#"(component
  (import "eggtimer:plugin/types@0.1.0" (instance $types
    (type $task (record
      (field "id" string) (field "plugin" string) (field "attempt" u32)
      (field "max-attempts" u32) (field "due" s64) (field "owner" (option string))
      (field "payload" string)))
    (export "task" (type (eq $task)))
    (type $outcome (variant
      (case "done") (case "retry-after" u64) (case "fail" string) (case "run-again-at" s64)))
    (export "outcome" (type (eq $outcome)))))
  (alias export $types "task" (type $task))
  (alias export $types "outcome" (type $outcome))
  (core module $main
    (memory (export "memory") 1)
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) (i32.const 4096))
    ;; the task's twelve flat values in; a pointer to Ok(Done) (zeros) out
    (func (export "handle")
      (param i32 i32 i32 i32 i32 i32 i64 i32 i32 i32 i32 i32) (result i32)
      (i32.const 1024)))
  (core module $bare)
  (core module $with-memory (memory 1))
  (core instance $main (instantiate $main))
"#,
    );
    wat.push_str(more);
    wat.push_str(
        r#"  (func $handle (param "task" $task) (result (result $outcome (error string)))
    (canon lift (core func $main "handle") (memory (core memory $main "memory"))
      (realloc (core func $main "realloc"))))
  (export "handle" (func $handle)))
"#,
    );
    wat::parse_str(&wat).expect("the test's component text is valid")
}

/// Uploads `wasm` as `name`, expecting 400 `invalid_plugin`; its message.
async fn refused(base: &str, name: &str, wasm: Vec<u8>) -> String {
    let (s, b) = upload(base, name, wasm).await;
    assert_eq!(
        (s, &b["error"]["code"]),
        (400, &json!("invalid_plugin")),
        "{name}: {b}"
    );
    b["error"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_component_asking_for_too_many_instances_or_memories_is_refused_at_upload_and_others_run()
{
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let base = r.url.as_str();
    // within the limits (32 core instances, 4 memories): it runs
    let (s, b) = upload(base, "modest", greedy_component(10, 2)).await;
    assert_eq!(s, 201, "{b}");
    // 1 + 40 core instances; 1 + 8 memories: refused at upload, naming what it asked for
    for (name, wasm, what) in [
        (
            "many-instances",
            greedy_component(40, 0),
            "41 core module instances",
        ),
        (
            "many-memories",
            greedy_component(0, 8),
            "9 Wasm linear memories",
        ),
    ] {
        let msg = refused(base, name, wasm).await;
        assert!(
            msg.starts_with("the component asks for more than a plugin may have")
                && msg.contains(what),
            "{name}: {msg}"
        );
    }
    let due = now_ms();
    let mut specs = vec![json!({"plugin": "modest", "id": "modest"})];
    specs.extend((0..20).map(|i| {
        json!({"plugin": "coupon-expiry", "id": format!("c{i}"), "run_at": due,
               "payload": {"coupon_id": format!("c{i}"), "user_id": "u1", "expires_at": due + 7_200_000}})
    }));
    schedule(base, json!(specs)).await;
    let t = wait_state(base, "modest", "done", T).await;
    assert_eq!(t["attempts"], 1, "{t}");
    // the other plugin's tasks ran, once each, on their first attempt
    for i in 0..20 {
        let t = wait_state(base, &format!("c{i}"), "done", T).await;
        assert_eq!(t["attempts"], 1, "{t}");
    }
    // and the modest one still runs after the greedy ones failed
    schedule(base, json!({"plugin": "modest", "id": "modest-again"})).await;
    wait_state(base, "modest-again", "done", T).await;
}

/// A component whose start code traps, or runs past the time limit, is refused at upload saying
/// so: it is instantiated once before it is stored (and that instance serves its first task).
#[tokio::test]
async fn a_component_whose_start_code_traps_or_never_ends_is_refused_at_upload() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--plugin-timeout", "500ms"]);
    let base = r.url.as_str();
    for (name, start_code, what) in [
        ("traps", "unreachable", "unreachable"),
        ("loops", "(loop $again (br $again))", "interrupt"),
    ] {
        let more = format!(
            "  (core module $start (func $s {start_code}) (start $s))\n  (core instance (instantiate $start))\n"
        );
        let msg = refused(base, name, component(&more)).await;
        assert!(
            msg.starts_with("the plugin can't start: instantiating the plugin failed")
                && msg.contains(what),
            "{name}: {msg}"
        );
        let (s, _) = eggtimer_tests::call("GET", &format!("{base}/v1/plugins/{name}"), None).await;
        assert_eq!(s, 404, "{name} was stored");
    }
    // a component whose start code ends is stored, and its first task runs
    let more =
        "  (core module $start (func $s nop) (start $s))\n  (core instance (instantiate $start))\n";
    let (s, b) = upload(base, "starts", component(more)).await;
    assert_eq!(s, 201, "{b}");
    schedule(base, json!({"plugin": "starts", "id": "first"})).await;
    let t = wait_state(base, "first", "done", T).await;
    assert_eq!(t["attempts"], 1, "{t}");
}

/// A plugin that takes longer to compile than `--plugin-compile-timeout`, or more memory than
/// `--plugin-compile-memory`, is refused at upload naming the limit: the compile runs in a child
/// process, which is stopped; it is not stored, and another plugin's tasks run meanwhile.
#[tokio::test]
async fn a_plugin_too_costly_to_compile_is_stopped_and_refused_and_others_run() {
    // the Python sample takes seconds and hundreds of MiB to compile; the small component
    // milliseconds and a few MiB
    let python = plugin_wasm("coupon-expiry-py");
    for (flag, value, what) in [
        (
            "--plugin-compile-timeout",
            "1s",
            "compiling the plugin took longer than 1s (the runner's --plugin-compile-timeout), so it was stopped",
        ),
        (
            "--plugin-compile-memory",
            "67108864",
            "compiling the plugin needed more than 64 MiB of memory (the runner's --plugin-compile-memory)",
        ),
    ] {
        let redis = RedisServer::start();
        let cache = temp_dir("plugin-cache");
        let r = RunnerProcess::start(
            &redis.url(),
            &[flag, value, "--plugin-cache", cache.to_str().unwrap()],
        );
        let base = r.url.as_str();
        let (s, b) = upload(base, "small", component("")).await;
        assert_eq!(s, 201, "{flag}: {b}");
        // tasks of the small plugin due while the Python sample compiles
        let due = now_ms() + 300;
        schedule(
            base,
            json!(
                (0..10)
                    .map(|i| json!({"plugin": "small", "id": format!("s{i}"), "run_at": due}))
                    .collect::<Vec<_>>()
            ),
        )
        .await;
        let msg = refused(base, "python", python.clone()).await;
        assert!(msg.starts_with(what), "{flag}: {msg}");
        let (s, _) = eggtimer_tests::call("GET", &format!("{base}/v1/plugins/python"), None).await;
        assert_eq!(s, 404, "{flag}: the plugin was stored");
        // the compile is gone: the runner has no child process compiling
        assert_eq!(
            compilers_of(r.pid()),
            0,
            "{flag}: a compile is still running"
        );
        for i in 0..10 {
            let t = wait_state(base, &format!("s{i}"), "done", T).await;
            assert_eq!(t["attempts"], 1, "{t}");
        }
        assert_eq!(metric(base, "eggtimer_plugin_compiles").await, Some(0.0));
    }
}

/// Child processes of `pid` running `compile-plugin`.
fn compilers_of(pid: u32) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let stat = std::fs::read_to_string(e.ok()?.path().join("stat")).ok()?;
            // pid (comm) state ppid ...: the parent is the field after the closing parenthesis
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(stat)
        })
        .filter(|stat| stat.contains("(eggtimer)") || stat.contains("(exe)"))
        .count()
}
