//! The task record as the scripts store it (see `lua/prelude.lua`) and the types built from it.

use serde::Serialize;

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Scheduled,
    Running,
    Done,
    Dead,
}

/// A task as a reader sees it (the API's task object).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TaskRecord {
    pub id: String,
    pub plugin: String,
    /// The payload, raw JSON text exactly as scheduled.
    #[serde(serialize_with = "raw_json")]
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
        let payload = f.next()?.to_owned();
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
