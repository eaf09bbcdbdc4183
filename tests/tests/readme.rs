//! The README's walkthrough run as written, as a new user pastes it into a shell: its shell
//! blocks ("Five minutes with eggtimer" with curl, then with the CLI, then "Recurring
//! schedules, ...", then "Tasks that react to events") against a real runner started as `cargo xtask run` starts one (a private
//! redis-server under `./eggtimer-data`), once with an admin token set and once without one.
//!
//! The blocks run from a fresh directory that holds only `target` (a link to the built plugins)
//! and the runner's `eggtimer-data`; the only changes made to them are the runner's address and
//! the webhook receiver's port (both free ports here), and a wait for the receiver's two lines
//! before it is stopped.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, req};
use eggtimer_tests::{
    RunnerProcess, eggtimer_bin, eventually, free_port, plugins_dir, temp_dir, workspace,
};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// The `n`th (from 0) ```sh block after the line `heading`.
fn block(readme: &str, heading: &str, n: usize) -> String {
    let after = &readme[readme
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("README has no heading {heading:?}"))..];
    let start = after
        .match_indices("\n```sh\n")
        .nth(n)
        .unwrap_or_else(|| panic!("no sh block {n} after {heading:?}"))
        .0
        + "\n```sh\n".len();
    let len = after[start..].find("\n```").expect("a closed block");
    after[start..start + len].to_owned()
}

/// Runs `script` with bash in `dir` (its output into `dir/out`), stdin `input`: (exit code,
/// output).
fn bash(dir: &Path, script: &str, env: &[(&str, &str)], input: &str) -> (Option<i32>, String) {
    let out = dir.join("out");
    let path = format!(
        "{}:{}",
        eggtimer_bin().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .args(["-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .env("OUT", &out)
        .env_remove("EGGTIMER_TOKEN")
        .env_remove("EGGTIMER_URL")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::options().append(true).open(&out).unwrap())
        .spawn()
        .expect("bash");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let status = child.wait().unwrap();
    (status.code(), std::fs::read_to_string(&out).unwrap())
}

/// The walkthrough with `token` (None: a runner without one), asserting what each step says
/// happens.
async fn walkthrough(token: Option<&str>) {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let dir = temp_dir("readme");
    std::os::unix::fs::symlink(workspace().join("target"), dir.join("target")).unwrap();
    let plugins = plugins_dir();
    let mut args = vec!["--plugins-dir", plugins.to_str().unwrap()];
    if let Some(t) = token {
        args.extend(["--token", t]);
    }
    let runner = RunnerProcess::start_private(&dir.join("eggtimer-data"), &args);
    let addr = runner.url.trim_start_matches("http://").to_owned();
    let port = free_port();
    let receiver = format!("127.0.0.1:{port}");
    let mut env = vec![("EGGTIMER_URL", runner.url.as_str())];
    if let Some(t) = token {
        env.push(("EGGTIMER_TOKEN", t));
    }
    let as_written = |b: String| {
        b.replace("localhost:8080", &addr)
            .replace("127.0.0.1:9000", &receiver)
            .replace(
                r#"("127.0.0.1", 9000)"#,
                &format!(r#"("127.0.0.1", {port})"#),
            )
    };

    // one terminal: the walkthrough with curl, then with the CLI, then the next section's; from
    // the CLI on, bash -e stops at the first command that fails
    let curl = as_written(block(&readme, "## Five minutes with eggtimer", 0)).replace(
        "\nkill %1",
        "\ntimeout 30 bash -c 'until [ \"$(grep -c sha256= \"$OUT\")\" -ge 2 ]; do sleep 0.1; done'\nkill %1",
    );
    let cli = as_written(block(&readme, "## Five minutes with eggtimer", 1));
    let sections = as_written(block(
        &readme,
        "### Recurring schedules, pausing, finding, bulk actions, limits, dedup",
        0,
    ));
    let events = as_written(block(&readme, "## Tasks that react to events", 0));
    let script = format!("{curl}\nset -e\n{cli}\n{sections}\n{events}");
    let (code, out) = bash(&dir, &script, &env, "whsec-demo\n");
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("unauthorized"), "{out}");
    // with curl: every step answers as its comment says
    for said in [
        r#""code":"invalid_payload""#,
        r#""code":"incompatible_payloads""#,
        "cancel-o3",
        "missing field `reason`",
        r#""previous":2"#,
    ] {
        assert!(out.contains(said), "{said} missing from:\n{out}");
    }
    assert_eq!(out.matches("sha256=").count(), 2, "two webhooks: {out}");
    let bearer = token.or(Some(""));
    for id in ["hook-o0", "hook-o1"] {
        let t = eventually(T, &format!("{id} to be done"), || async {
            let (_, t) = req(
                "GET",
                &format!("{}/v1/tasks/{id}", runner.url),
                bearer,
                None,
            )
            .await;
            (t["state"] == "done").then_some(t)
        })
        .await;
        assert!(
            t["last_error"].is_null(),
            "done after a retry, without the error of before: {t}"
        );
    }
    let (_, p) = req(
        "GET",
        &format!("{}/v1/plugins/order-cancel", runner.url),
        bearer,
        None,
    )
    .await;
    assert_eq!(
        (&p["version"], &p["previous"]),
        (&Value::from(1), &Value::from(2)),
        "rolled back to v1, from v2: {p}"
    );

    // the CLI's secret list, the last curl of the next section, and the events
    assert!(out.contains("signing_key"), "{out}");
    assert!(out.contains(r#"{"id":"cancel-o9""#), "{out}");
    assert!(out.contains(r#"{"published":1,"matched":2}"#), "{out}");
    assert!(out.contains(r#""then": "cancel""#), "{out}");
}

#[tokio::test]
async fn the_readme_walkthrough_works_as_written_with_a_token() {
    walkthrough(Some(ADMIN)).await;
}

#[tokio::test]
async fn the_readme_walkthrough_works_as_written_without_a_token() {
    walkthrough(None).await;
}
