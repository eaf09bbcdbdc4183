//! The task record as the scripts store it (see `lua/lib/record.lua`) and the types built from it.

use serde::Serialize;

use super::extras::{Extras, Listener, Window};

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Scheduled,
    Running,
    Done,
    Dead,
}

/// A task as a reader sees it (the API's task object).
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct TaskRecord {
    /// The task's id (unique within its plugin).
    pub id: String,
    /// The key it is stored under ([`task_key`](super::task_key), or a 0.1.0 record's id).
    #[serde(skip)]
    pub key: String,
    pub plugin: String,
    /// The payload, raw JSON text exactly as scheduled.
    #[serde(serialize_with = "raw_json")]
    #[schema(value_type = serde_json::Value)]
    pub payload: String,
    pub run_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub max_attempts: u32,
    pub state: TaskState,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    /// The W3C trace context the task was scheduled with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The latest time (ms) the task may start: not started by then, it is dead with the error
    /// `expired` instead of running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_by: Option<i64>,
    /// The events it listens for (until one of them arrives or it ends).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on: Vec<Listener>,
    /// How long before the task was scheduled an event still matched (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lookback_ms: Option<u64>,
    /// The event that made it run (`{id, topic, key, at, data}`), handed to the plugin.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "raw_json_opt"
    )]
    #[schema(value_type = Option<serde_json::Value>)]
    pub event: Option<String>,
    /// A debounced task's window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debounce: Option<Window>,
    /// A debounced task's payloads, oldest first (at most 1,000 and 1 MiB; more are only
    /// counted in `batch_dropped`). A task read by id, and a run, carry them; a page of a
    /// search does not.
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "raw_json_list"
    )]
    #[schema(value_type = Vec<serde_json::Value>)]
    pub batch: Vec<String>,
    /// How many of `batch`'s payloads are held in a list beside the record (read into `batch`
    /// by the store where a whole task is read: a claim, a get).
    #[serde(skip)]
    pub window: u64,
    /// How many more payloads came than `batch` keeps.
    #[serde(skip_serializing_if = "is_zero")]
    pub batch_dropped: u64,
    /// Payloads that came while it ran: its next window's.
    #[serde(skip_serializing_if = "is_zero")]
    pub next_batch: u64,
    /// 1 to 9: among its plugin's due tasks, the higher starts first (absent: 0).
    #[serde(skip_serializing_if = "is_zero_u8")]
    #[schema(minimum = 0, maximum = 9)]
    pub priority: u8,
    /// The plugin's log lines of the task's last three attempts, oldest first, at most 8 KiB in
    /// all (only `GET /v1/tasks/{id}` reads them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub log: Vec<LogLine>,
}

/// One line a plugin logged (or printed) during a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct LogLine {
    /// The attempt it was logged in.
    pub attempt: u32,
    /// `debug`, `info`, `warn` or `error` (`log`), `stdout` or `stderr` (printed).
    pub level: String,
    /// When (ms since the Unix epoch).
    pub time: i64,
    pub message: String,
}

/// Marks a trace context at the start of a record's last field: `\x1e<traceparent>\x1e<payload>`.
/// A JSON text never starts with this byte, so a record without one (every record written before
/// traces existed) reads as before, and the scripts, which never look into the payload, need no
/// change.
const TRACE_MARK: char = '\x1e';

/// Marks a task's `start_by` (ms) after the trace context, if any: `\x1d<ms>\x1d<payload>`.
const START_BY_MARK: char = '\x1d';

/// Marks a task's extras after the start_by mark, if any: `\x1c<entries>\x1c<payload>` (see
/// [`Extras`]).
const EXTRAS_MARK: char = '\x1c';

/// What a record's last field holds: the payload and what was scheduled with it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LastField<'a> {
    pub traceparent: Option<&'a str>,
    pub start_by: Option<i64>,
    /// The extras' entries, as stored (see [`Extras`]).
    pub extras: Option<&'a str>,
    pub payload: &'a str,
}

impl<'a> LastField<'a> {
    /// Reads a record's last field.
    pub fn split(field: &'a str) -> LastField<'a> {
        let mut rest = field;
        let mut marked = |mark: char| {
            let (value, after) = rest.strip_prefix(mark)?.split_once(mark)?;
            rest = after;
            Some(value)
        };
        let traceparent = marked(TRACE_MARK);
        let start_by = marked(START_BY_MARK).and_then(|v| v.parse().ok());
        let extras = marked(EXTRAS_MARK);
        LastField {
            traceparent,
            start_by,
            extras,
            payload: rest,
        }
    }

    /// The last field of a record (the payload alone when nothing else was scheduled with it).
    pub fn join(&self) -> std::borrow::Cow<'a, str> {
        let mut field = String::new();
        if let Some(tp) = self.traceparent {
            field.push_str(&format!("{TRACE_MARK}{tp}{TRACE_MARK}"));
        }
        if let Some(by) = self.start_by {
            field.push_str(&format!("{START_BY_MARK}{by}{START_BY_MARK}"));
        }
        if let Some(ex) = self.extras {
            field.push_str(&format!("{EXTRAS_MARK}{ex}{EXTRAS_MARK}"));
        }
        if field.is_empty() {
            return self.payload.into();
        }
        field.push_str(self.payload);
        field.into()
    }
}

/// Separates the attempts of a task's stored log (`lua/lib/logs.lua`).
const ATTEMPT_MARK: char = '\x1e';

/// The log lines of one attempt as its task keeps them: `<attempt>` then a line
/// `<level>\t<time>\t<message>` each, at most [`MAX_LOG_BYTES`](eggtimer_base::limits::MAX_LOG_BYTES);
/// the lines past that are counted, and a last line says how many were not kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttemptLog {
    lines: String,
    last_time: i64,
    dropped: usize,
}

/// Room kept at the end of an attempt's log for the line saying what was not kept.
const DROPPED_NOTE_BYTES: usize = 96;

impl AttemptLog {
    /// Adds a line (its tabs and line breaks made spaces; a message over 2 KiB cut).
    pub fn push(&mut self, level: &str, time: i64, message: &str) {
        let message = eggtimer_base::limits::cut(message.to_owned(), 2048);
        let message: String = message
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let line = format!("\n{level}\t{time}\t{message}");
        let room = eggtimer_base::limits::MAX_LOG_BYTES - 16 - DROPPED_NOTE_BYTES;
        if self.dropped > 0 || self.lines.len() + line.len() > room {
            self.dropped += 1;
        } else {
            self.lines.push_str(&line);
        }
        self.last_time = time;
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty() && self.dropped == 0
    }

    /// What the task keeps of attempt `attempt` (None: nothing was logged).
    pub fn stored(&self, attempt: u32) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let mut text = format!("{attempt}{}", self.lines);
        if self.dropped > 0 {
            text.push_str(&format!(
                "\nwarn\t{}\t{} more lines not kept (a task keeps {} bytes of log)",
                self.last_time,
                self.dropped,
                eggtimer_base::limits::MAX_LOG_BYTES
            ));
        }
        Some(text)
    }
}

/// Reads a task's stored log (the attempts `lua/lib/logs.lua` kept, oldest first).
pub fn decode_log(text: &str) -> Vec<LogLine> {
    let mut out = Vec::new();
    for part in text.split(ATTEMPT_MARK) {
        let mut lines = part.split('\n');
        let Some(attempt) = lines.next().and_then(|a| a.parse().ok()) else {
            continue;
        };
        for line in lines {
            let mut f = line.splitn(3, '\t');
            if let (Some(level), Some(Ok(time)), Some(message)) =
                (f.next(), f.next().map(str::parse), f.next())
            {
                out.push(LogLine {
                    attempt,
                    level: level.to_owned(),
                    time,
                    message: message.to_owned(),
                });
            }
        }
    }
    out
}

fn raw_json<S: serde::Serializer>(payload: &str, s: S) -> Result<S::Ok, S::Error> {
    match serde_json::value::RawValue::from_string(payload.to_owned()) {
        Ok(raw) => raw.serialize(s),
        Err(_) => s.serialize_str(payload),
    }
}

impl TaskRecord {
    /// Decodes the record stored under `key` (ten tab-separated fields, the payload last).
    pub fn decode(key: &str, rec: &str) -> Option<TaskRecord> {
        let mut f = rec.splitn(10, '\t');
        let state = match f.next()? {
            "s" => TaskState::Scheduled,
            "r" => TaskState::Running,
            "d" => TaskState::Done,
            "x" => TaskState::Dead,
            _ => return None,
        };
        let run_at = f.next()?.parse().ok()?;
        let attempts = f.next()?.parse().ok()?;
        let max_attempts = f.next()?.parse().ok()?;
        let created_at = f.next()?.parse().ok()?;
        // `fin`: the finish time of a done or dead task; the claim token of a running one.
        let fin = f.next()?;
        let finished_at = match state {
            TaskState::Done | TaskState::Dead => fin.parse().ok(),
            TaskState::Scheduled | TaskState::Running => None,
        };
        let plugin = f.next()?.to_owned();
        let owner = Some(f.next()?).filter(|o| !o.is_empty()).map(str::to_owned);
        let last_error = Some(f.next()?).filter(|e| !e.is_empty()).map(str::to_owned);
        let last = LastField::split(f.next()?);
        let x = last.extras.map(Extras::decode).unwrap_or_default();
        Some(TaskRecord {
            id: super::public_id(key).to_owned(),
            key: key.to_owned(),
            plugin,
            payload: last.payload.to_owned(),
            run_at,
            owner,
            max_attempts,
            state,
            attempts,
            last_error,
            created_at,
            finished_at,
            traceparent: last.traceparent.map(str::to_owned),
            start_by: last.start_by,
            on: x.on,
            lookback_ms: x.lookback_ms,
            event: x.event,
            debounce: x.debounce,
            batch: x.batch,
            window: x.window,
            batch_dropped: x.batch_dropped,
            next_batch: x.next_batch,
            priority: x.priority,
            log: Vec::new(),
        })
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u8(n: &u8) -> bool {
    *n == 0
}

fn raw_json_opt<S: serde::Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(p) => raw_json(p, s),
        None => s.serialize_none(),
    }
}

fn raw_json_list<S: serde::Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for p in v {
        match serde_json::value::RawValue::from_string(p.clone()) {
            Ok(raw) => seq.serialize_element(&raw)?,
            Err(_) => seq.serialize_element(p)?,
        }
    }
    seq.end()
}

/// Makes a text safe for a record field that is not the last: no tabs or line breaks.
pub fn field_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == '\t' || c == '\n' || c == '\r' || c == '\0' {
                ' '
            } else {
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extras::Then;
    use proptest::prelude::*;

    /// The record as `lib/record.lua`'s `encode` writes it (its ten fields, in order).
    #[allow(clippy::too_many_arguments)]
    fn encode(
        st: char,
        due: i64,
        att: u32,
        max: u32,
        created: i64,
        fin: &str,
        plugin: &str,
        owner: &str,
        err: &str,
        payload: &str,
    ) -> String {
        format!("{st}\t{due}\t{att}\t{max}\t{created}\t{fin}\t{plugin}\t{owner}\t{err}\t{payload}")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        /// Any stored text decodes or is refused; it never panics.
        #[test]
        fn decoding_never_panics(rec in "\\PC{0,200}", tabs in "[a-z0-9\t-]{0,60}") {
            let _ = TaskRecord::decode("id", &rec);
            let _ = TaskRecord::decode("id", &tabs);
        }

        /// What the scripts write decodes to the same fields (the payload may hold tabs).
        #[test]
        fn records_round_trip(
            st in prop::sample::select(vec!['s', 'r', 'd', 'x']),
            due in 0i64..=eggtimer_base::limits::MAX_TIME_MS,
            att in 0u32..1000, max in 1u32..1000,
            created in 0i64..=eggtimer_base::limits::MAX_TIME_MS,
            fin in 0i64..=eggtimer_base::limits::MAX_TIME_MS,
            plugin in "[a-z0-9][a-z0-9-]{0,20}",
            owner in "[^\t\n\r\x00]{0,30}",
            err in "[^\t\n\r\x00]{0,30}",
            payload in "\\PC{0,60}",
        ) {
            let fin_text = fin.to_string();
            let rec = encode(st, due, att, max, created, &fin_text, &plugin, &owner, &err, &payload);
            let r = TaskRecord::decode("id", &rec).expect("decodes");
            prop_assert_eq!(r.run_at, due);
            prop_assert_eq!((r.attempts, r.max_attempts, r.created_at), (att, max, created));
            prop_assert_eq!(r.plugin, plugin);
            prop_assert_eq!(r.owner, Some(owner).filter(|o| !o.is_empty()));
            prop_assert_eq!(r.last_error, Some(err).filter(|e| !e.is_empty()));
            prop_assert_eq!(r.payload, payload);
            let finished = matches!(st, 'd' | 'x');
            prop_assert_eq!(r.finished_at, finished.then_some(fin));
        }
    }

    #[test]
    fn reads_what_a_task_carries_beyond_its_payload() {
        let on = [
            Listener {
                topic: "payments".into(),
                key: "o 1".into(),
                then: Then::Cancel,
            },
            Listener {
                topic: "refunds".into(),
                key: "o1".into(),
                then: Then::Run,
            },
        ];
        // as the scripts store it: a stamp first, an event that reached it last
        let ex = format!(
            "s7\x1f{}\x1fe{{\"id\":\"1-1\"}}",
            Extras::of_new(&on, 500, 0).unwrap()
        );
        let last = LastField {
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            start_by: Some(9),
            extras: Some(&ex),
            payload: "{\"a\":1}",
        };
        let rec = encode('s', 5, 0, 3, 1, "", "p", "", "", &last.join());
        let r = TaskRecord::decode("t", &rec).unwrap();
        assert_eq!((r.payload.as_str(), r.start_by), ("{\"a\":1}", Some(9)));
        assert_eq!(r.on, on);
        assert_eq!(r.lookback_ms, Some(500));
        assert_eq!(r.event.as_deref(), Some("{\"id\":\"1-1\"}"));
        // a debounced task's window and payloads
        let x = Extras::decode("q300\x1e5000\x1e17\x1fb1\x1fb{\"n\":2}\x1fm3\x1fn4\x1fM2");
        assert_eq!(
            x.debounce,
            Some(Window {
                quiet_ms: 300,
                max_wait_ms: 5000,
                first_at: 17
            })
        );
        assert_eq!(x.batch, ["1", "{\"n\":2}"]);
        assert_eq!((x.batch_dropped, x.next_batch), (3, 3));
    }

    #[test]
    fn reads_a_trace_context_and_a_start_by_before_the_payload() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        for (traceparent, start_by) in [(Some(tp), None), (None, Some(77)), (Some(tp), Some(0))] {
            let last = LastField {
                traceparent,
                start_by,
                extras: None,
                payload: "{\"a\":1}",
            };
            let rec = encode('s', 5, 0, 3, 1, "", "p", "", "", &last.join());
            let r = TaskRecord::decode("t", &rec).unwrap();
            assert_eq!(
                (r.traceparent.as_deref(), r.start_by, r.payload.as_str()),
                (traceparent, start_by, "{\"a\":1}")
            );
        }
        // a record without either (as 0.1.0 wrote most) reads as before
        let r = TaskRecord::decode("t", &encode('s', 5, 0, 3, 1, "", "p", "", "", "[1]")).unwrap();
        assert_eq!(
            (r.traceparent, r.start_by, r.payload.as_str()),
            (None, None, "[1]")
        );
        assert_eq!(LastField::split("[1]").join(), "[1]");
    }

    #[test]
    fn an_attempts_log_is_kept_within_its_bytes_and_reads_back() {
        let mut log = AttemptLog::default();
        assert_eq!(log.stored(1), None);
        log.push("info", 10, "first\tline\nwith breaks");
        log.push("stderr", 11, "second");
        let one = log.stored(2).unwrap();
        let lines = decode_log(&format!("{one}\x1e{}", log.stored(3).unwrap()));
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[0],
            LogLine {
                attempt: 2,
                level: "info".into(),
                time: 10,
                message: "first line with breaks".into()
            }
        );
        assert_eq!((lines[3].attempt, lines[3].level.as_str()), (3, "stderr"));
        // a flood: kept up to the cap, the rest counted
        let mut big = AttemptLog::default();
        for i in 0..1000 {
            big.push("debug", i, &"x".repeat(100));
        }
        let stored = big.stored(1).unwrap();
        assert!(
            stored.len() <= eggtimer_base::limits::MAX_LOG_BYTES,
            "{}",
            stored.len()
        );
        let lines = decode_log(&stored);
        let note = &lines.last().unwrap().message;
        assert!(
            note.ends_with("more lines not kept (a task keeps 8192 bytes of log)"),
            "{note}"
        );
        assert_eq!(
            lines.len() - 1 + note.split(' ').next().unwrap().parse::<usize>().unwrap(),
            1000
        );
    }

    #[test]
    fn decodes_a_record_whose_payload_has_tabs() {
        let r = TaskRecord::decode("a", "x\t100\t2\t5\t50\t120\tnoop\tu1\tboom\t{\"a\":\"\t\"}")
            .unwrap();
        assert_eq!(r.state, TaskState::Dead);
        assert_eq!(r.run_at, 100);
        assert_eq!(r.attempts, 2);
        assert_eq!(r.finished_at, Some(120));
        assert_eq!(r.owner.as_deref(), Some("u1"));
        assert_eq!(r.last_error.as_deref(), Some("boom"));
        assert_eq!(r.payload, "{\"a\":\"\t\"}");
    }

    #[test]
    fn empty_optional_fields_are_none() {
        let r = TaskRecord::decode("a", "s\t100\t0\t5\t50\t\tnoop\t\t\tnull").unwrap();
        assert_eq!(r.owner, None);
        assert_eq!(r.finished_at, None);
        assert_eq!(r.last_error, None);
        assert!(TaskRecord::decode("a", "garbage").is_none());
    }

    #[test]
    fn a_running_record_carries_its_claim_token_not_a_finish_time() {
        let r = TaskRecord::decode("a", "r\t100\t1\t5\t50\t77\tnoop\t\t\tnull").unwrap();
        assert_eq!(r.state, TaskState::Running);
        assert_eq!(r.finished_at, None);
    }

    #[test]
    fn serializes_payload_as_json() {
        let r = TaskRecord::decode(
            "a",
            "s\t100\t0\t5\t50\t\tnoop\t\t\t{\"n\":12345678901234567890}",
        )
        .unwrap();
        let j = serde_json::to_string(&r).unwrap();
        assert!(
            j.contains("\"payload\":{\"n\":12345678901234567890}"),
            "{j}"
        );
    }
}
