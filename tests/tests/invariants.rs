//! ARCHITECTURE.md's "one owner per outside system" invariants, checked rather than hoped: only
//! the store crate depends on redis, only `plugins` names wasmtime, only `api` names axum, and
//! only `config` reads the environment; only the task service admits and writes new tasks; and
//! the codemap names every module of `runner/src`, `store/src` and `base/src`.

use std::path::{Path, PathBuf};

use eggtimer_tests::workspace;

/// Every .rs file under runner/src, as (path relative to runner/src, text).
fn sources() -> Vec<(String, String)> {
    crate_sources("runner")
}

/// Every .rs file under `krate`/src (a folder of the workspace), as (path relative to that src,
/// with `/` between folders, text).
fn crate_sources(krate: &str) -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = workspace().join(krate).join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            (rel, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// Whether `text` names `krate` as a path (`krate::`), not as the tail of another name.
fn names(text: &str, krate: &str) -> bool {
    let needle = format!("{krate}::");
    text.match_indices(&needle).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

fn offenders(krate: &str, owner: &str, allowed: &[&str]) -> Vec<String> {
    sources()
        .into_iter()
        .filter(|(rel, text)| {
            !rel.starts_with(owner) && !allowed.contains(&rel.as_str()) && names(text, krate)
        })
        .map(|(rel, _)| rel)
        .collect()
}

/// The packages a crate's manifest lists under `[dependencies]` and `[dev-dependencies]`.
fn dependencies(krate: &str) -> Vec<String> {
    let manifest = std::fs::read_to_string(workspace().join(krate).join("Cargo.toml")).unwrap();
    let mut out = Vec::new();
    let mut listing = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            listing = line.ends_with("dependencies]");
        } else if listing
            && !line.starts_with('#')
            && let Some((name, _)) = line.split_once(['=', '.'])
        {
            out.push(name.trim().to_owned());
        }
    }
    out
}

/// Only the store crate talks to Redis: the runner and the ground floor don't depend on the
/// redis crate, so naming it anywhere else is a compile error (checked here in the sources too,
/// for the message).
#[test]
fn only_store_talks_to_redis() {
    assert!(dependencies("store").contains(&"redis".to_owned()));
    for krate in ["runner", "base"] {
        assert!(
            !dependencies(krate).contains(&"redis".to_owned()),
            "{krate}/Cargo.toml depends on redis: only the store talks to Redis"
        );
    }
    assert_eq!(offenders("redis", "store/", &[]), Vec::<String>::new());
}

/// The ground floor depends on no other eggtimer crate, and the store only on it: a room that
/// imports one above it does not compile.
#[test]
fn the_ground_floor_and_the_store_import_nothing_above_them() {
    let ours = |krate: &str| -> Vec<String> {
        dependencies(krate)
            .into_iter()
            .filter(|d| d.starts_with("eggtimer"))
            .collect()
    };
    assert_eq!(ours("base"), Vec::<String>::new());
    assert_eq!(ours("store"), vec!["eggtimer-base".to_owned()]);
    for krate in ["base", "store"] {
        for outside in ["wasmtime", "axum"] {
            assert!(
                !dependencies(krate).iter().any(|d| d.starts_with(outside)),
                "{krate}/Cargo.toml depends on {outside}"
            );
        }
    }
}

/// The store's public items (functions, fields, re-exports) as written: each `pub` declaration
/// up to its body. `pub(super)` and `pub(crate)` ones are the store's own business.
fn store_public_items() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (rel, text) in crate_sources("store") {
        for (i, _) in text.match_indices("pub ") {
            let line_start = text[..i].rfind('\n').map_or(0, |n| n + 1);
            if !text[line_start..i].trim().is_empty() {
                continue; // not at the start of a line: `pub` inside another word or a string
            }
            let end = text[i..].find(['{', ';']).map_or(text.len(), |n| i + n);
            out.push((rel.clone(), text[i..end].to_owned()));
        }
    }
    out
}

/// No Redis type leaves the store: nothing it makes public names the redis crate, so no other
/// module can hold a Redis connection, client or reply, even without naming `redis::` itself.
#[test]
fn no_redis_type_leaves_the_store() {
    let leaks: Vec<String> = store_public_items()
        .into_iter()
        .filter(|(_, item)| names(item, "redis"))
        .map(|(rel, item)| format!("store/src/{rel}: {item}"))
        .collect();
    assert_eq!(leaks, Vec::<String>::new());
}

#[test]
fn only_plugins_imports_wasmtime() {
    assert_eq!(offenders("wasmtime", "plugins/", &[]), Vec::<String>::new());
    assert_eq!(
        offenders("wasmtime_wasi", "plugins/", &[]),
        Vec::<String>::new()
    );
}

#[test]
fn only_api_imports_axum() {
    assert_eq!(offenders("axum", "api/", &[]), Vec::<String>::new());
}

#[test]
fn only_config_reads_the_environment() {
    let readers: Vec<String> = ["runner", "store", "base"]
        .into_iter()
        .flat_map(|krate| {
            crate_sources(krate)
                .into_iter()
                .map(move |(rel, text)| (format!("{krate}/src/{rel}"), text))
        })
        .filter(|(rel, text)| {
            rel != "runner/src/config.rs"
                && (text.contains("env::var(") || text.contains("env::var_os("))
        })
        .map(|(rel, _)| rel)
        .collect();
    assert_eq!(readers, Vec::<String>::new());
}

#[test]
fn the_check_itself_tells_a_path_from_a_longer_name() {
    assert!(names("use redis::Value;", "redis"));
    assert!(!names("use crate::local_redis::LocalRedis;", "redis"));
}

/// ARCHITECTURE.md owns the map of `runner/src` and `base/src`: a top-level module has a bullet
/// of its own under its crate's (or is named as one inside another's: `` `local_redis` — ``), a
/// module of a folder is named in a bullet about that folder, and every module a bullet is about
/// exists. The store's bullet names each of its modules. A module added, moved or removed
/// without the map fails here.
#[test]
fn the_codemap_names_every_module_and_each_module_it_names_exists() {
    let doc = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap();
    let map = &doc[doc.find("\n## Codemap").expect("a Codemap section")..];
    let map = &map[..map[1..].find("\n## ").map_or(map.len(), |i| i + 1)];
    check_crate_map(map, "runner");
    check_crate_map(map, "base");
    let store = crate_bullet(map, "store");
    for (rel, _) in crate_sources("store") {
        let name = rel.trim_end_matches(".rs");
        let named = if name == "lib" {
            store.contains("`lib.rs`")
        } else {
            store.contains(&format!("`{name}`")) || store.contains(&format!("`{name}.rs`"))
        };
        assert!(
            named,
            "store/src/{rel} is not named in ARCHITECTURE.md's codemap (the store/ bullet)"
        );
    }
}

/// The codemap's bullet of the crate in the folder `krate`, with its own bullets.
fn crate_bullet<'a>(map: &'a str, krate: &str) -> &'a str {
    let bullet = &map[map
        .find(&format!("\n- `{krate}/`"))
        .unwrap_or_else(|| panic!("a {krate}/ bullet"))..];
    &bullet[..bullet[1..].find("\n- `").map_or(bullet.len(), |i| i + 1)]
}

/// A crate whose top-level modules each have a bullet of their own under the crate's.
fn check_crate_map(map: &str, krate: &str) {
    let crate_map = crate_bullet(map, krate);
    let ticked =
        |s: &str| -> Vec<String> { s.split('`').skip(1).step_by(2).map(str::to_owned).collect() };
    // the crate's bullets: what each is about (its first name, and any `name` — inside it)
    let bullets: Vec<(Vec<String>, Vec<String>)> = crate_map
        .split("\n  - ")
        .skip(1)
        .map(|b| {
            let names = ticked(b);
            let mut about: Vec<String> = names.iter().take(1).cloned().collect();
            about.extend(
                b.split('`')
                    .collect::<Vec<_>>()
                    .windows(2)
                    .filter(|w| w[1].starts_with(" —"))
                    .map(|w| w[0].to_owned()),
            );
            (about, names)
        })
        .collect();
    assert!(bullets.len() > 5, "the {krate}/ bullets were not found");
    let src = workspace().join(krate).join("src");
    let module = |name: &str| {
        name.trim_end_matches('/')
            .trim_end_matches(".rs")
            .to_owned()
    };
    for (about, _) in &bullets {
        for a in about {
            let m = module(a);
            assert!(
                src.join(format!("{m}.rs")).is_file() || src.join(&m).is_dir(),
                "ARCHITECTURE.md's codemap has a bullet about `{a}`, which is no module of {krate}/src"
            );
        }
    }
    for (rel, _) in crate_sources(krate) {
        let (folder, file) = match rel.rsplit_once('/') {
            Some((d, f)) => (Some(d.to_owned()), f.trim_end_matches(".rs").to_owned()),
            None => (None, rel.trim_end_matches(".rs").to_owned()),
        };
        let named = match &folder {
            // lib.rs and main.rs are the crate bullet's own
            None if file == "lib" || file == "main" => {
                file == "lib" && krate != "runner" || crate_map.contains(&format!("`{file}.rs`"))
            }
            None => bullets
                .iter()
                .any(|(about, _)| about.iter().any(|a| module(a) == file)),
            Some(d) if file == "mod" => bullets
                .iter()
                .any(|(about, _)| about.iter().any(|a| module(a) == *d)),
            Some(d) => bullets.iter().any(|(about, names)| {
                about.iter().any(|a| module(a).split('/').next() == Some(d))
                    && names.iter().any(|n| {
                        let n = module(n);
                        n == file || n == format!("{d}/{file}")
                    })
            }),
        };
        assert!(
            named,
            "{krate}/src/{rel} is not named in ARCHITECTURE.md's codemap (a top-level module by a \
             bullet of its own, a folder's module in its folder's bullet)"
        );
    }
}

/// One door for every task: outside the store, only the task service (`tasks.rs`) admits new
/// tasks or writes them (a batch, a debounced spec, follow-ups, a firing), so a new way in can't
/// skip a budget.
#[test]
fn only_the_task_service_admits_writes_or_changes_tasks() {
    let writes = [
        // new tasks
        "store.admit(",
        "store.landed(",
        "store.schedule(",
        "store.schedule_all_or_none(",
        "store.debounce(",
        "store.fire(",
        "ScheduleMode::",
        // changes to tasks that exist, and which task an id names
        "store.tasks_of_id(",
        "store.move_task(",
        "store.cancel(",
        "store.cancel_for_plugin(",
        "store.revive(",
        "store.drop_dead(",
        "store.shift_owner(",
        "store.cancel_owner(",
        "store.set_owner_paused(",
        "store.dead_all(",
        "store.cancel_plugin(",
        // events that make listening tasks act
        "store.publish(",
        "store.charge_events(",
    ];
    for (rel, text) in sources() {
        if rel.starts_with("tasks/") {
            continue;
        }
        for w in writes {
            assert!(
                !text.contains(w),
                "runner/src/{rel} calls `{w}`: tasks are admitted, written and changed by the \
                 task service (runner/src/tasks/) only"
            );
        }
    }
}
