//! The Lua scripts. Each is its own file under `lua/`, preceded at load time by the parts of
//! `lua/lib/` it names on its first line (`--! needs indexes walk`) and the parts those need, in
//! the order of `PARTS`: a script carries only what it calls.
//!
//! Each script runs as a Redis function: its text becomes a function library (`FUNCTION LOAD`,
//! once per Redis, which keeps it with the data) whose top level defines the parts once, and one
//! function (`FCALL`) that runs the script's own text. A script run with `EVALSHA` or `EVAL`
//! defines every function of its parts again at each call, which costs Redis more than a small
//! claim's own work. `connection` turns our `EVALSHA` into `FCALL`, loads a library a Redis lacks
//! and runs the text with `EVAL` where it cannot load it. So the top level of a part runs once per
//! load: what a part keeps for one run is reset at each run's start (`start` in `shard`).
//!
//! Each script's first line tells Redis how it treats a Redis out of memory (`maxmemory` reached
//! under `noeviction`), and Redis decides before the script runs, so no script stops half done:
//! - `#!lua`: refused whole with `OOM` (what adds data: schedule, claim, firings, uploads);
//! - `#!lua flags=allow-oom`: runs anyway (what keeps claimed runs alive and records their
//!   outcomes, and what changes data in place or deletes it: cancel, pause, move, drop dead);
//! - `#!lua flags=no-writes`: reads only.
//!
//! The same flags go to the function.

use std::collections::HashMap;

use redis::Script;

/// The shared parts, each after every part it needs.
const PARTS: [(&str, &str); 14] = [
    ("shard", include_str!("lua/lib/shard.lua")),
    ("record", include_str!("lua/lib/record.lua")),
    ("buckets", include_str!("lua/lib/buckets.lua")),
    ("priority", include_str!("lua/lib/priority.lua")),
    ("logs", include_str!("lua/lib/logs.lua")),
    ("indexes", include_str!("lua/lib/indexes.lua")),
    ("claims", include_str!("lua/lib/claims.lua")),
    ("share", include_str!("lua/lib/share.lua")),
    ("owners", include_str!("lua/lib/owners.lua")),
    ("finished", include_str!("lua/lib/finished.lua")),
    ("walk", include_str!("lua/lib/walk.lua")),
    ("blobs", include_str!("lua/lib/blobs.lua")),
    ("extras", include_str!("lua/lib/extras.lua")),
    ("far", include_str!("lua/lib/far.lua")),
];

/// Declares every script once: its field, its file and its name in metrics.
macro_rules! scripts {
    ($($field:ident: $file:literal,)*) => {
        pub struct Scripts {
            $(pub $field: Script,)*
        }

        /// Every script's name and source text (with its parts), in declaration order.
        #[cfg(test)]
        fn sources() -> Vec<(&'static str, String)> {
            vec![$(($file, assemble(include_str!(concat!("lua/", $file, ".lua"))).text()),)*]
        }

        /// Every script's name and its function library's text.
        pub fn libraries() -> Vec<(&'static str, String)> {
            [$(($file, assemble(include_str!(concat!("lua/", $file, ".lua")))),)*]
                .into_iter()
                .map(|(name, a)| (name, a.library(name)))
                .collect()
        }

        impl Scripts {
            fn build() -> Self {
                Scripts { $($field: Script::new(&assemble(include_str!(concat!("lua/", $file, ".lua"))).text()),)* }
            }

            /// Every script by the SHA1 of its text: its name (for the Redis round-trip metric),
            /// its function and library, and its text (to run it with EVAL where Redis cannot
            /// load the library).
            fn by_sha() -> HashMap<String, super::connection::ScriptText> {
                [$(($file, assemble(include_str!(concat!("lua/", $file, ".lua")))),)*]
                    .into_iter()
                    .map(|(name, a)| {
                        let text = a.text();
                        let sha = Script::new(&text).get_hash().to_owned();
                        let library = a.library(name);
                        let function = function_name(name, &sha);
                        (sha, super::connection::ScriptText { name, function, library, text })
                    })
                    .collect()
            }
        }
    };
}

scripts! {
    schedule: "schedule",
    debounce: "debounce",
    publish: "publish",
    listen: "listen",
    deliver: "deliver",
    unlisten: "unlisten",
    drain: "drain",
    claim: "claim",
    renew: "renew",
    finish: "finish",
    move_task: "move",
    cancel: "cancel",
    revoke: "revoke",
    revive: "revive",
    shift_owner: "shift_owner",
    pause: "pause",
    owner_pause: "owner_pause",
    owner_stats: "owner_stats",
    owner_backlog: "owner_backlog",
    owner_heads: "owner_heads",
    bulk: "bulk",
    fire: "fire",
    range: "range",
    due_range: "due_range",
    due_count: "due_count",
    recurring: "recurring",
    recurring_due: "recurring_due",
    slots: "slots",
    rate: "rate",
    admit: "admit",
    effects: "effects",
    plugin_put: "plugin_put",
    plugin_promote: "plugin_promote",
    plugin_delete: "plugin_delete",
    plugin_purge: "plugin_purge",
    plugin_setting: "plugin_setting",
    shard_lease: "shard_lease",
    heartbeat: "heartbeat",
    writable: "writable",
    audit: "audit",
    key_replace: "key_replace",
    event_budget: "event_budget",
    far_promote: "far_promote",
    far_compact: "far_compact",
    far_get: "far_get",
}

impl Scripts {
    pub fn load() -> Self {
        let s = Self::build();
        super::connection::SCRIPTS.get_or_init(Self::by_sha);
        s
    }
}

/// The parts a file's `--! needs a b` line names (none without one).
fn needs(text: &str) -> Vec<&str> {
    text.lines()
        .take(3)
        .find_map(|l| l.strip_prefix("--! needs "))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default()
}

/// A script with the parts it needs.
struct Assembled {
    /// Its first line (`#!lua`, with its flags).
    shebang: &'static str,
    /// The parts it needs, in `PARTS` order.
    parts: String,
    /// Whether those include `shard`, whose `start` each run calls first.
    shard: bool,
    /// The rest of its own text.
    body: &'static str,
}

impl Assembled {
    /// What a run does first: `start` with its keys, where the script has the `shard` part.
    fn prologue(&self) -> &'static str {
        if self.shard { "start(KEYS)\n" } else { "" }
    }

    /// The script's text, to run with `EVAL`: the `#!lua` line, the parts, the run.
    fn text(&self) -> String {
        format!(
            "{}\n{}{}{}",
            self.shebang,
            self.parts,
            self.prologue(),
            self.body
        )
    }

    /// The script `script` as a function library of one function, both named by
    /// `function_name`: the parts at its top level (run once, at load), the run in the function,
    /// with the script's flags.
    fn library(&self, script: &str) -> String {
        let name = function_name(script, Script::new(&self.text()).get_hash());
        let flags = self
            .shebang
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("flags="))
            .flat_map(|f| f.split(','))
            .map(|f| format!("'{f}'"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "#!lua name={name}\n{}redis.register_function{{function_name = '{name}', flags = {{{flags}}}, \
             callback = function(KEYS, ARGV)\n{}{}\nend}}\n",
            self.parts,
            self.prologue(),
            self.body
        )
    }
}

/// The name of a script's function (and library): `eggtimer_<script>_<its text's SHA1, 16 hex
/// digits>`, so that runners of two releases each call their own.
fn function_name(script: &str, sha: &str) -> String {
    format!("eggtimer_{script}_{}", &sha[..16])
}

/// A script's parts: those its first lines name (and theirs), in `PARTS` order.
fn assemble(script: &'static str) -> Assembled {
    let (shebang, body) = script.split_once('\n').unwrap_or((script, ""));
    let mut want = vec![false; PARTS.len()];
    let mut todo = needs(body);
    while let Some(name) = todo.pop() {
        let i = PARTS
            .iter()
            .position(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("a Lua script needs the unknown part {name:?}"));
        if !want[i] {
            want[i] = true;
            todo.extend(needs(PARTS[i].1));
        }
    }
    let mut parts = String::new();
    for (i, (_, text)) in PARTS.iter().enumerate() {
        if want[i] {
            parts.push_str(text);
            parts.push('\n');
        }
    }
    Assembled {
        shebang,
        parts,
        shard: want[PARTS.iter().position(|(n, _)| *n == "shard").unwrap()],
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The functions a Lua text defines as `local function name(`.
    fn defined(text: &str) -> Vec<&str> {
        text.split("local function ")
            .skip(1)
            .filter_map(|s| s.split('(').next())
            .collect()
    }

    /// Whether `text` calls the function `f` (not a method or a longer name ending in it).
    fn calls(text: &str, f: &str) -> bool {
        let call = format!("{f}(");
        text.match_indices(&call).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            !before.is_some_and(|c| c.is_alphanumeric() || "_.:".contains(c))
        })
    }

    #[test]
    fn every_script_says_first_how_it_treats_a_full_redis() {
        for (file, text) in sources() {
            let first = text.lines().next().unwrap();
            assert!(
                ["#!lua", "#!lua flags=allow-oom", "#!lua flags=no-writes"].contains(&first),
                "{file}.lua starts with {first:?}"
            );
            assert_eq!(text.matches("#!lua").count(), 1, "{file}.lua");
        }
    }

    #[test]
    fn every_part_comes_after_the_parts_it_needs() {
        for (i, (name, text)) in PARTS.iter().enumerate() {
            assert!(text.starts_with(&format!("--! part {name}\n")), "{name}");
            for need in needs(text) {
                let j = PARTS.iter().position(|(n, _)| *n == need).unwrap();
                assert!(j < i, "{name} needs {need}, which comes after it");
            }
        }
    }

    #[test]
    fn every_script_carries_each_shared_function_it_calls() {
        let shared: Vec<(&str, &str)> = PARTS
            .iter()
            .flat_map(|(part, text)| defined(text).into_iter().map(move |f| (f, *part)))
            .collect();
        for (file, text) in sources() {
            let own = defined(&text);
            for (f, part) in &shared {
                let called = calls(&text, f);
                assert!(
                    !called || own.contains(f),
                    "{file}.lua calls {f} of the part {part:?} without needing it"
                );
            }
        }
    }

    #[test]
    fn every_script_has_a_header_saying_its_keys_argv_and_reply() {
        for (file, text) in sources() {
            let body = text.rsplit("\n--! needs").next().unwrap();
            for word in ["KEYS", "Returns"] {
                assert!(
                    body.contains(word),
                    "{file}.lua's header does not say its {word}"
                );
            }
        }
    }

    /// Each script's header says what bounds the work of one call (`-- Bound:`): what the call
    /// brings and the caller cuts, or, where stored data still counts, which.
    #[test]
    fn every_script_says_what_bounds_one_call() {
        for (file, text) in sources() {
            assert!(
                text.contains("\n-- Bound: "),
                "{file}.lua's header does not say what bounds one call (`-- Bound:`)"
            );
        }
    }
}
