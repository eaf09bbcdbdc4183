//! Plugins in TypeScript (`plugins/<name>/index.ts`) and Python (`plugins/<name>/app.py`): their
//! pinned toolchains, installed inside the repository's target/ (nothing outside the clone), and
//! their builds into target/plugins/<name>.wasm.
//!
//! - TypeScript/JavaScript: type-checked by `tsc --strict` (a type error fails the build), bundled
//!   by `rolldown` (types stripped, `@eggtimer/sdk` from sdk/js
//!   linked into a staging directory's node_modules, the host interface left external), then
//!   `jco componentize --backend qjs --backend-qjs-disable-async` (QuickJS, ~1.6 MB components,
//!   no async component model). jco 1.35's own `--bundle` can't read the WIT path afterwards, so
//!   the bundle is made first.
//! - Python: `componentize-py` with sdk/python on its path (~18 MB components).
//!
//! Without node/npm or python3 these are skipped with a one-line note; the tests that need them
//! fail saying what to install.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::{Context, Result, bail};

use super::on_path;

/// The npm packages of the TypeScript toolchain, pinned.
pub const NPM_TOOLS: &[&str] = &[
    "@bytecodealliance/jco@1.35.0",
    "rolldown@1.3.2",
    "typescript@5.9.3",
];

/// The staged plugin's tsconfig: the SDK's strict settings for plugins (no output: rolldown
/// bundles), as a plugin's own project uses them.
const TSCONFIG: &str =
    r#"{ "extends": "@eggtimer/sdk/tsconfig.plugin.json", "files": ["index.ts"] }"#;

/// The PyPI packages of the Python toolchain (and the SDK's tests), pinned.
pub const PY_TOOLS: &[&str] = &["componentize-py==0.25.1", "pytest==8.3.5"];

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// The newest modification time of the files under `dirs` (recursively).
fn newest(dirs: &[&Path]) -> SystemTime {
    fn walk(p: &Path, acc: &mut SystemTime) {
        if let Ok(m) = std::fs::metadata(p) {
            if let Ok(t) = m.modified() {
                *acc = (*acc).max(t);
            }
            if m.is_dir()
                && let Ok(rd) = std::fs::read_dir(p)
            {
                for e in rd.flatten() {
                    let name = e.file_name();
                    if name != "node_modules" && name != "__pycache__" {
                        walk(&e.path(), acc);
                    }
                }
            }
        }
    }
    let mut t = SystemTime::UNIX_EPOCH;
    for d in dirs {
        walk(d, &mut t);
    }
    t
}

/// Whether `out` is newer than everything it is built from.
fn fresh(out: &Path, inputs: &[&Path]) -> bool {
    std::fs::metadata(out)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t > newest(inputs))
}

/// The plugin directories holding `file` (e.g. index.ts), sorted.
fn sources(root: &Path, file: &str) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root.join("plugins"))? {
        let e = e?;
        if e.path().join(file).is_file() {
            out.push((e.file_name().to_string_lossy().into_owned(), e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The jco binary in target/js-tools, installed there when missing.
fn jco(root: &Path) -> Result<PathBuf> {
    let tools = root.join("target/js-tools");
    let bin = tools.join("node_modules/.bin/jco");
    // every tool of the list: a target/js-tools of an older list gains the new ones
    if !bin.is_file() || !tools.join("node_modules/.bin/tsc").is_file() {
        eprintln!(
            "xtask: installing {} into target/js-tools",
            NPM_TOOLS.join(" ")
        );
        std::fs::create_dir_all(&tools)?;
        run(
            Command::new("npm")
                .args(["install", "--prefix"])
                .arg(&tools)
                .args(["--no-audit", "--no-fund", "--loglevel=error"])
                .args(NPM_TOOLS),
            "npm install",
        )?;
    }
    Ok(bin)
}

/// The Python virtualenv in target/py-tools (componentize-py, pytest), made when missing.
fn py_tools(root: &Path) -> Result<PathBuf> {
    let venv = root.join("target/py-tools");
    let bin = venv.join("bin");
    if !bin.join("componentize-py").is_file() || !bin.join("pytest").is_file() {
        eprintln!(
            "xtask: installing {} into target/py-tools",
            PY_TOOLS.join(" ")
        );
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv (Debian/Ubuntu: sudo apt-get install -y python3-venv)",
        )?;
        run(
            Command::new(bin.join("pip"))
                .args(["install", "-q"])
                .args(PY_TOOLS),
            "pip install",
        )?;
    }
    Ok(bin)
}

/// Builds every TypeScript and Python plugin into `out`.
pub fn build(root: &Path, out: &Path) -> Result<()> {
    build_language(
        root,
        out,
        Language {
            source: "index.ts",
            sdk: "sdk/js",
            programs: &["node", "npm"],
            what: "TypeScript",
            install: "install Node.js 20+",
        },
        jco,
        build_ts,
    )?;
    build_language(
        root,
        out,
        Language {
            source: "app.py",
            sdk: "sdk/python",
            programs: &["python3"],
            what: "Python",
            install: "install Python 3.11+",
        },
        py_tools,
        build_py,
    )
}

/// How one language's plugins are found and what they need.
struct Language {
    /// The file that makes a plugin directory one of this language's.
    source: &'static str,
    /// The SDK directory (a change rebuilds the plugins).
    sdk: &'static str,
    /// What must be on PATH to build them.
    programs: &'static [&'static str],
    what: &'static str,
    install: &'static str,
}

/// Builds the plugins of one language whose output is older than their sources: `tools` sets
/// up the toolchain (once, only when there is something to build), `build_one` builds a plugin.
fn build_language(
    root: &Path,
    out: &Path,
    lang: Language,
    tools: fn(&Path) -> Result<PathBuf>,
    build_one: fn(&Path, &Path, &str, &Path, &Path) -> Result<()>,
) -> Result<()> {
    let found = sources(root, lang.source)?;
    if found.is_empty() {
        return Ok(());
    }
    if !lang.programs.iter().all(|p| on_path(p)) {
        eprintln!(
            "xtask: {} not found: skipped the {} plugins ({}); {} to build them",
            lang.programs.join("/"),
            lang.what,
            found
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            lang.install
        );
        return Ok(());
    }
    let tool = tools(root)?;
    let (wit, sdk) = (root.join("wit/plugin.wit"), root.join(lang.sdk));
    for (name, dir) in &found {
        let wasm = out.join(format!("{name}.wasm"));
        if !fresh(&wasm, &[dir, &sdk, &wit]) {
            build_one(root, &tool, name, dir, &wasm)?;
        }
    }
    Ok(())
}

/// One TypeScript plugin: staged with the SDK linked as `@eggtimer/sdk`, bundled, componentized.
fn build_ts(root: &Path, jco: &Path, name: &str, dir: &Path, wasm: &Path) -> Result<()> {
    eprintln!("xtask: building {name} (jco componentize, QuickJS)");
    let stage = root.join("target/js-build").join(name);
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(stage.join("node_modules/@eggtimer"))?;
    std::fs::copy(dir.join("index.ts"), stage.join("index.ts"))?;
    std::os::unix::fs::symlink(
        root.join("sdk/js"),
        stage.join("node_modules/@eggtimer/sdk"),
    )?;
    std::fs::write(stage.join("tsconfig.json"), TSCONFIG)?;
    run(
        Command::new(jco.with_file_name("tsc"))
            .current_dir(&stage)
            .args(["-p", "tsconfig.json", "--pretty", "false"]),
        &format!("tsc (type check) for {name}"),
    )?;
    let rolldown = jco.with_file_name("rolldown");
    run(
        Command::new(rolldown)
            .current_dir(&stage)
            .args([
                "index.ts",
                "--format",
                "esm",
                "--platform",
                "neutral",
                "--file",
                "bundle.js",
            ])
            .args(["--external", "eggtimer:plugin/host@0.1.0"]),
        &format!("rolldown for {name}"),
    )?;
    // a plugin that exports `check` (`export const check = handle.check`) is of the `checked`
    // world
    let bundle = std::fs::read_to_string(stage.join("bundle.js"))?;
    let world = if exports_check(&bundle) {
        "checked"
    } else {
        "plugin"
    };
    run(
        Command::new(jco)
            .current_dir(&stage)
            .args(["componentize", "bundle.js", "--wit"])
            .arg(root.join("wit/plugin.wit"))
            .args([
                "--world-name",
                world,
                "--backend",
                "qjs",
                "--backend-qjs-disable-async",
                "-o",
            ])
            .arg(wasm),
        &format!("jco componentize for {name}"),
    )
}

/// Whether an ES module bundle exports `check` (`export { check, handle }`, `export { x as
/// check }`, `export const check`, `export function check`).
fn exports_check(bundle: &str) -> bool {
    bundle.lines().any(|l| {
        let l = l.trim();
        if let Some(names) = l.strip_prefix("export {") {
            names
                .trim_end_matches([';', ' ', '}'])
                .split(',')
                .any(|n| n.split_whitespace().last() == Some("check"))
        } else {
            [
                "export const check",
                "export function check",
                "export let check",
            ]
            .iter()
            .any(|p| {
                l.strip_prefix(p)
                    .is_some_and(|r| r.starts_with([' ', '=', '(']))
            })
        }
    })
}

/// One Python plugin: staged with the SDK beside it (componentize-py imports both, which writes
/// `__pycache__` next to them: never in the source tree), then componentized.
fn build_py(root: &Path, bin: &Path, name: &str, dir: &Path, wasm: &Path) -> Result<()> {
    eprintln!("xtask: building {name} (componentize-py)");
    let stage = root.join("target/py-build").join(name);
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(stage.join("eggtimer_sdk"))?;
    std::fs::copy(dir.join("app.py"), stage.join("app.py"))?;
    for e in std::fs::read_dir(root.join("sdk/python/eggtimer_sdk"))? {
        let e = e?;
        if e.path().extension().is_some_and(|x| x == "py") {
            std::fs::copy(e.path(), stage.join("eggtimer_sdk").join(e.file_name()))?;
        }
    }
    run(
        Command::new(bin.join("componentize-py"))
            .current_dir(&stage)
            .arg("-d")
            .arg(root.join("wit/plugin.wit"))
            .args(["-w", "checked", "componentize", "app", "-p", ".", "-o"])
            .arg(wasm),
        &format!("componentize-py for {name}"),
    )
}

#[cfg(test)]
mod tests {
    use super::exports_check;

    #[test]
    fn a_bundle_exports_check_when_it_names_it() {
        assert!(exports_check("const a = 1;\nexport { check, handle };\n"));
        assert!(exports_check("export { h as handle, c as check };"));
        assert!(exports_check("export const check = handle.check;"));
        assert!(!exports_check("export { handle };\nconst check = 1;"));
        assert!(!exports_check("export { handle, checkout };"));
        assert!(!exports_check("export const checked = 1;"));
    }
}
