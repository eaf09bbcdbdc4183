//! The last release's runner, built from git history, for the upgrade tests.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::workspace;

#[path = "../../xtask/src/cargo_command.rs"]
mod cargo_command;

/// The last release (the newest commit whose subject starts with "Release "): its subject and
/// its `eggtimer` binary, built on first use into target/released/<commit>/ (the source from
/// `git archive`, the dependencies from the workspace's target dir, so only the release's own
/// crates are compiled).
pub fn released_eggtimer() -> (String, PathBuf) {
    static BUILT: OnceLock<(String, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(build_release).clone()
}

fn git(args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .current_dir(workspace())
        .args(args)
        .output()
        .expect("running git (the upgrade tests build the last release from the history)");
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn build_release() -> (String, PathBuf) {
    let log = String::from_utf8(git(&["log", "--format=%H %s"])).unwrap();
    let (commit, subject) = log
        .lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(_, s)| s.starts_with("Release "))
        .expect(
            "no commit whose subject starts with \"Release \": the upgrade tests need the \
             repository's history (a full clone, or `git fetch --unshallow`)",
        );
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace().join("target"));
    let dir = target.join("released").join(commit);
    let bin = dir.join("eggtimer");
    if bin.is_file() {
        return (subject.to_owned(), bin);
    }
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).unwrap();
    let tar = dir.join("src.tar");
    git(&["archive", "-o", tar.to_str().unwrap(), commit]);
    let status = Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .status()
        .expect("running tar");
    assert!(status.success(), "unpacking the release's source failed");
    // its runner as a package of another name (its library still `eggtimer`, its binary
    // `eggtimer-released`): cargo names a path package's artifacts by its name and its path in
    // the workspace, which are this build's, so under its own name the release shares no
    // artifact or fingerprint with this build, only the registry dependencies
    edit(
        &src.join("runner/Cargo.toml"),
        &[
            (
                "[package]\nname = \"eggtimer\"",
                "[package]\nname = \"eggtimer-released\"",
            ),
            ("[lib]\n", "[lib]\nname = \"eggtimer\"\n"),
            (
                "[[bin]]\nname = \"eggtimer\"",
                "[[bin]]\nname = \"eggtimer-released\"",
            ),
        ],
    );
    edit(
        &src.join("Cargo.toml"),
        &[(
            "eggtimer = { path = \"runner\" }",
            "eggtimer = { path = \"runner\", package = \"eggtimer-released\" }",
        )],
    );
    // The dependencies' features as `cargo xtask test` built them (xtask's `RUN_BUILD`: every
    // package with its tests; a test target turns on the dev-dependencies, and their features
    // reach shared dependencies), so every dependency is found built. Built alone, the release's
    // runner would compile wasmtime and most of its dependencies again with other features
    // (4.5 min cold, and their disk). One test target of the release stands for all of them: its
    // smallest.
    let test = smallest_test(&src.join("tests/tests"));
    // (without the variables cargo set for this test process: see `cargo_command`)
    let status = cargo_command::cargo_command()
        .current_dir(&src)
        .args([
            "build",
            "--quiet",
            "--workspace",
            "--bin",
            "eggtimer-released",
            "--test",
            &test,
        ])
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("running cargo");
    assert!(status.success(), "building the release {commit} failed");
    std::fs::copy(target.join("debug").join("eggtimer-released"), &bin).unwrap();
    (subject.to_owned(), bin)
}

/// The name of the smallest test file in `dir` (a release's tests/tests).
fn smallest_test(dir: &std::path::Path) -> String {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().to_str()?.strip_suffix(".rs")?.to_owned();
            Some((e.metadata().ok()?.len(), name))
        })
        .min()
        .map(|(_, name)| name)
        .unwrap_or_else(|| panic!("{} has no test file", dir.display()))
}

/// Replaces each `(from, to)` once in the file at `path`; each `from` must be there.
fn edit(path: &std::path::Path, changes: &[(&str, &str)]) {
    let mut text = std::fs::read_to_string(path).unwrap();
    for (from, to) in changes {
        assert!(text.contains(from), "{} has no {from:?}", path.display());
        text = text.replacen(from, to, 1);
    }
    std::fs::write(path, text).unwrap();
}
