//! What Redis shows of the scripts a runner called: the functions it loaded and the calls its
//! slow log kept, per script.

use std::collections::BTreeMap;

use eggtimer_tests::redis_log::{Logged, logged};

/// Every script's name: the files of the store's `lua/` folder (its `lib/` holds parts).
pub fn every_script() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../store/src/lua");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".lua").map(str::to_owned)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 40, "the scripts of {dir:?}: {names:?}");
    names
}

/// The script of a function's name (`eggtimer_<script>_<16 hex digits>`).
fn script_named(function: &str) -> Option<String> {
    let name = function.strip_prefix("eggtimer_")?;
    let (script, sha) = name.rsplit_once('_')?;
    (sha.len() == 16).then(|| script.to_owned())
}

/// The script a logged call ran (`FCALL <function> …`), if it ran one.
fn script_of(call: &Logged) -> Option<String> {
    if call.shown.len() < 2 || !call.shown[0].eq_ignore_ascii_case("FCALL") {
        return None;
    }
    script_named(&call.shown[1])
}

/// The scripts whose functions Redis holds: those a runner called.
pub fn loaded(conn: &mut redis::Connection) -> Vec<String> {
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query(conn).unwrap();
    let mut out = Vec::new();
    for library in &libraries {
        let redis::Value::Array(fields) = library else {
            panic!("a library {library:?}")
        };
        for pair in fields.chunks(2) {
            if let [redis::Value::BulkString(k), redis::Value::BulkString(v)] = pair
                && k == b"library_name"
            {
                out.extend(script_named(&String::from_utf8_lossy(v)));
            }
        }
    }
    out
}

/// The calls of 1 ms or more the slow log showed of each script: how many, and the slowest
/// (µs, and the phase that made it).
#[derive(Default)]
pub struct Seen {
    pub scripts: BTreeMap<String, (usize, i64, &'static str)>,
}

impl Seen {
    /// Takes in what Redis logged since the last read, as made by `phase`.
    pub fn read(&mut self, conn: &mut redis::Connection, phase: &'static str) {
        for call in logged(conn) {
            if let Some(script) = script_of(&call) {
                let e = self.scripts.entry(script).or_insert((0, 0, phase));
                e.0 += 1;
                if call.micros > e.1 {
                    e.1 = call.micros;
                    e.2 = phase;
                }
            }
        }
    }
}
