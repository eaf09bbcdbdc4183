//! What Redis did, read from its own logs: every command with its time and arguments (the slow
//! log at a threshold of 0), and the keys a namespace holds (its listeners, say), for tests that
//! check what one request may cost Redis or leave behind.

use crate::RedisServer;

/// How many commands the slow log keeps while a test logs every call.
pub const LOGGED: u64 = 50_000;

/// From now on Redis logs every command it runs, with its time and its arguments (the first 31
/// of them, and how many more).
pub fn log_every_call(conn: &mut redis::Connection) {
    for (name, value) in [("slowlog-log-slower-than", 0), ("slowlog-max-len", LOGGED)] {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(conn)
            .unwrap();
    }
    let () = redis::cmd("SLOWLOG").arg("RESET").query(conn).unwrap();
}

/// One command Redis logged: how long it held Redis, its first arguments as logged (at most
/// 31, each cut to 128 bytes), the length of each of those, and how many arguments it had.
#[derive(Debug)]
pub struct Logged {
    pub micros: i64,
    pub shown: Vec<String>,
    pub lens: Vec<usize>,
    pub args: usize,
}

/// The commands Redis logged since [`log_every_call`], oldest first; then the log starts
/// again. Fails if the log overflowed.
pub fn logged(conn: &mut redis::Connection) -> Vec<Logged> {
    use redis::Value;
    let logged: u64 = redis::cmd("SLOWLOG").arg("LEN").query(conn).unwrap();
    assert!(logged < LOGGED, "the slow log overflowed ({logged} calls)");
    let entries: Vec<Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(LOGGED)
        .query(conn)
        .unwrap();
    let () = redis::cmd("SLOWLOG").arg("RESET").query(conn).unwrap();
    // "<128 bytes>... (N more bytes)" stands for an argument of 128 + N bytes
    let arg = |v: &Value| -> (String, usize) {
        let Value::BulkString(b) = v else {
            panic!("a slow log argument {v:?}")
        };
        let text = String::from_utf8_lossy(b).into_owned();
        let more = (b.len() > 128)
            .then(|| std::str::from_utf8(&b[128..]).ok())
            .flatten()
            .and_then(|t| t.strip_prefix("... ("))
            .and_then(|t| t.strip_suffix(" more bytes)"))
            .map(|n| n.parse::<usize>().unwrap());
        match more {
            Some(n) => (text, 128 + n),
            None => (text, b.len()),
        }
    };
    let mut out = Vec::new();
    for entry in entries.iter().rev() {
        let Value::Array(fields) = entry else {
            panic!("a slow log entry {entry:?}")
        };
        let (Value::Int(micros), Value::Array(args)) = (&fields[2], &fields[3]) else {
            panic!("a slow log entry {entry:?}")
        };
        let (mut shown, mut lens): (Vec<String>, Vec<usize>) = args.iter().map(arg).unzip();
        // past 32 arguments Redis logs 31 and "... (N more arguments)"
        let more = shown
            .last()
            .and_then(|a| a.strip_prefix("... ("))
            .and_then(|a| a.strip_suffix(" more arguments)"))
            .map(|n| n.parse::<usize>().unwrap());
        let args = match more {
            Some(n) => {
                shown.pop();
                lens.pop();
                shown.len() + n
            }
            None => shown.len(),
        };
        out.push(Logged {
            micros: *micros,
            shown,
            lens,
            args,
        });
    }
    out
}

/// One call of a script Redis logged: how long it held Redis, and how many arguments it took.
#[derive(Debug)]
pub struct ScriptCall {
    pub micros: i64,
    pub args: usize,
}

/// The calls among `calls` of the eggtimer function whose name starts with `function`.
pub fn calls_of<'a>(calls: &'a [Logged], function: &str) -> Vec<&'a Logged> {
    calls
        .iter()
        .filter(|c| {
            c.shown.len() >= 2
                && c.shown[0].eq_ignore_ascii_case("FCALL")
                && c.shown[1].starts_with(function)
        })
        .collect()
}

/// The calls of the eggtimer function whose name starts with `function` that Redis logged
/// since [`log_every_call`] (see [`logged`]).
pub fn script_calls(conn: &mut redis::Connection, function: &str) -> Vec<ScriptCall> {
    calls_of(&logged(conn), function)
        .into_iter()
        .map(|c| ScriptCall {
            micros: c.micros,
            args: c.args,
        })
        .collect()
}

/// Redis answers everyone `BUSY` once a script has run this long (`busy-reply-threshold`'s
/// default is 5 s); no call of the tests that read this log comes near it.
pub const FAR_FROM_BUSY_MICROS: i64 = 1_000_000;

/// Every key of the namespace matching `pattern` (`{eggtimer:*}:…`).
pub fn keys(redis: &RedisServer, pattern: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(pattern)
        .query(&mut redis.conn())
        .unwrap()
}

/// How many listeners the shards hold: those kept in a `listeners` field (topic and key -> up
/// to eight, \x1d-separated), those in the hash of a topic and key with more, those taken aside
/// for an event and the events still being handed to them.
pub fn listener_entries(redis: &RedisServer) -> u64 {
    let mut conn = redis.conn();
    let mut n = 0;
    for k in keys(redis, "{eggtimer:*}:listeners") {
        let lists: Vec<String> = redis::cmd("HVALS").arg(&k).query(&mut conn).unwrap();
        n += lists
            .iter()
            .map(|l| l.split('\x1d').count() as u64)
            .sum::<u64>();
    }
    for k in keys(redis, "{eggtimer:*}:listeners:*") {
        let len = if k.ends_with(":drains") {
            "ZCARD"
        } else {
            "HLEN"
        };
        n += redis::cmd(len).arg(&k).query::<u64>(&mut conn).unwrap();
    }
    n
}
