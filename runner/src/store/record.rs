//! The task record as the scripts store it (see `lua/prelude.lua`) and the types built from it.

use serde::Serialize;

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
    pub id: String,
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
}

/// Marks a trace context at the start of a record's last field: `\x1e<traceparent>\x1e<payload>`.
/// A JSON text never starts with this byte, so a record without one (every record written before
/// traces existed) reads as before, and the scripts, which never look into the payload, need no
/// change.
const TRACE_MARK: char = '\x1e';

/// Splits a record's last field into its trace context (if any) and the payload.
pub fn split_trace(field: &str) -> (Option<&str>, &str) {
    if let Some(rest) = field.strip_prefix(TRACE_MARK)
        && let Some((tp, payload)) = rest.split_once(TRACE_MARK)
    {
        return (Some(tp), payload);
    }
    (None, field)
}

/// The last field of a record for a payload and its trace context (if any).
pub fn join_trace<'a>(traceparent: Option<&str>, payload: &'a str) -> std::borrow::Cow<'a, str> {
    match traceparent {
        Some(tp) => format!("{TRACE_MARK}{tp}{TRACE_MARK}{payload}").into(),
        None => payload.into(),
    }
}

fn raw_json<S: serde::Serializer>(payload: &str, s: S) -> Result<S::Ok, S::Error> {
    match serde_json::value::RawValue::from_string(payload.to_owned()) {
        Ok(raw) => raw.serialize(s),
        Err(_) => s.serialize_str(payload),
    }
}

impl TaskRecord {
    /// Decodes a stored record (ten tab-separated fields, the payload last).
    pub fn decode(id: &str, rec: &str) -> Option<TaskRecord> {
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
        let (traceparent, payload) = split_trace(f.next()?);
        let (traceparent, payload) = (traceparent.map(str::to_owned), payload.to_owned());
        Some(TaskRecord {
            id: id.to_owned(),
            plugin,
            payload,
            run_at,
            owner,
            max_attempts,
            state,
            attempts,
            last_error,
            created_at,
            finished_at,
            traceparent,
        })
    }
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
    use proptest::prelude::*;

    /// The record as `prelude.lua`'s `encode` writes it (its ten fields, in order).
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
            due in 0i64..=crate::limits::MAX_TIME_MS,
            att in 0u32..1000, max in 1u32..1000,
            created in 0i64..=crate::limits::MAX_TIME_MS,
            fin in 0i64..=crate::limits::MAX_TIME_MS,
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
    fn reads_a_trace_context_before_the_payload() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let last = join_trace(Some(tp), "{\"a\":1}");
        let rec = encode('s', 5, 0, 3, 1, "", "p", "", "", &last);
        let r = TaskRecord::decode("t", &rec).unwrap();
        assert_eq!(
            (r.traceparent.as_deref(), r.payload.as_str()),
            (Some(tp), "{\"a\":1}")
        );
        // a record without one (as every earlier build wrote it) reads as before
        let r = TaskRecord::decode("t", &encode('s', 5, 0, 3, 1, "", "p", "", "", "[1]")).unwrap();
        assert_eq!((r.traceparent, r.payload.as_str()), (None, "[1]"));
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
