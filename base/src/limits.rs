//! The bounds every input keeps (API.md, "Limits every route keeps"): times, durations, ids and
//! owners, attempts, plugin names, payloads. The API, the CLI, the plugin host (a follow-up task is
//! held to the rules of one scheduled over HTTP, with the same messages) and the executor all
//! check against these, so no stored time can leave the range and no arithmetic on one can
//! overflow, in Rust or in Lua (whose numbers are doubles: every value here is far below 2^53).

/// The latest time anything may be due: 9999-12-31T23:59:59.999Z, in ms since the Unix epoch.
pub const MAX_TIME_MS: i64 = 253_402_300_799_999;
/// The longest duration or shift: 10 years, in ms.
pub const MAX_DURATION_MS: i64 = 315_360_000_000;
/// Most attempts a task or a schedule's firing may be given.
pub const MAX_ATTEMPTS: u32 = 1000;
/// The longest id or owner, in bytes.
pub use crate::names::MAX_ID_BYTES;

/// Most bytes of an error message kept with a task (a plugin's or the host's); a longer one is
/// cut, saying how long it was.
pub const MAX_ERROR_BYTES: usize = 4096;

/// Most bytes of a task's log kept with it: the lines of its last three attempts together, and of
/// one attempt alone.
pub const MAX_LOG_BYTES: usize = 8192;

/// `message` cut to [`MAX_ERROR_BYTES`] (on a character boundary), saying how long it was.
pub fn error_message(message: String) -> String {
    cut(message, MAX_ERROR_BYTES)
}

/// `message` cut to `max` bytes (on a character boundary), saying how long it was.
pub fn cut(mut message: String, max: usize) -> String {
    if message.len() <= max {
        return message;
    }
    let total = message.len();
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    message.push_str(&format!("… (cut: {total} bytes in all)"));
    message
}

/// Why a value is out of bounds; the message names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OutOfBounds(pub String);

/// A time: an integer in [0, MAX_TIME_MS].
pub fn time(field: &str, v: i64) -> Result<i64, OutOfBounds> {
    if (0..=MAX_TIME_MS).contains(&v) {
        Ok(v)
    } else {
        Err(OutOfBounds(format!(
            "{field} must be a time from 0 to {MAX_TIME_MS} (ms since the Unix epoch), got {v}"
        )))
    }
}

/// A duration that may be negative (a shift): |v| ≤ MAX_DURATION_MS.
pub fn shift(field: &str, v: i64) -> Result<i64, OutOfBounds> {
    if v.checked_abs().is_some_and(|a| a <= MAX_DURATION_MS) {
        Ok(v)
    } else {
        Err(OutOfBounds(format!(
            "{field} must be from -{MAX_DURATION_MS} to {MAX_DURATION_MS} ms (10 years), got {v}"
        )))
    }
}

/// A non-negative duration: 0 ≤ v ≤ MAX_DURATION_MS.
pub fn duration(field: &str, v: i64) -> Result<i64, OutOfBounds> {
    if (0..=MAX_DURATION_MS).contains(&v) {
        Ok(v)
    } else {
        Err(OutOfBounds(format!(
            "{field} must be from 0 to {MAX_DURATION_MS} ms (10 years), got {v}"
        )))
    }
}

/// `base + d`, which must stay a time.
pub fn shifted(field: &str, base: i64, d: i64) -> Result<i64, OutOfBounds> {
    let t = base.checked_add(d).unwrap_or(i64::MAX);
    time(field, t).map_err(|_| {
        OutOfBounds(format!(
            "{field}: {base} {} {} ms is outside 0 to {MAX_TIME_MS}",
            if d < 0 { '-' } else { '+' },
            d.unsigned_abs()
        ))
    })
}

pub use crate::names::id_like;

/// [`id_like`] with a message naming the field (the rule and its message are `names`').
pub fn id(field: &str, s: &str) -> Result<(), OutOfBounds> {
    crate::names::id_in(field, s).map_err(|e| OutOfBounds(e.0))
}

/// A number of attempts: 1 to [`MAX_ATTEMPTS`].
pub fn attempts(field: &str, n: i64) -> Result<u32, OutOfBounds> {
    match u32::try_from(n) {
        Ok(n) if (1..=MAX_ATTEMPTS).contains(&n) => Ok(n),
        _ => Err(OutOfBounds(format!(
            "{field} must be an integer from 1 to {MAX_ATTEMPTS}"
        ))),
    }
}

/// The highest priority a task may have (0, the default, the lowest).
pub const MAX_PRIORITY: u8 = 9;

/// A task's priority: 0 to MAX_PRIORITY.
pub fn priority(field: &str, n: i64) -> Result<u8, OutOfBounds> {
    match u8::try_from(n) {
        Ok(n) if n <= MAX_PRIORITY => Ok(n),
        _ => Err(OutOfBounds(format!(
            "{field} must be an integer from 0 to {MAX_PRIORITY}"
        ))),
    }
}

/// A plugin's name (`[a-z0-9][a-z0-9-]{0,63}`), given in `field`.
pub fn plugin(field: &str, name: &str) -> Result<(), OutOfBounds> {
    crate::names::plugin_name_in(field, name).map_err(|e| OutOfBounds(e.0))
}

/// A task's payload: at most `max` bytes (`--max-payload-bytes`).
pub fn payload(field: &str, payload: &str, max: usize) -> Result<(), OutOfBounds> {
    if payload.len() <= max {
        Ok(())
    } else {
        Err(OutOfBounds(format!(
            "{field} is {} bytes; the limit is {max}",
            payload.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_error_is_cut_saying_how_long_it_was() {
        assert_eq!(error_message("short".into()), "short");
        let long = "é".repeat(5000); // 10,000 bytes, two per character
        let cut = error_message(long);
        assert!(cut.starts_with(&"é".repeat(2048)), "{cut}");
        assert!(cut.ends_with("… (cut: 10000 bytes in all)"), "{cut}");
        assert!(cut.len() < MAX_ERROR_BYTES + 40);
    }

    #[test]
    fn times_and_shifts_stay_in_range() {
        assert!(time("t", 0).is_ok());
        assert!(time("t", MAX_TIME_MS).is_ok());
        assert!(time("t", -1).is_err());
        assert!(time("t", i64::MAX).unwrap_err().0.contains("t must be"));
        assert!(shift("s", -MAX_DURATION_MS).is_ok());
        assert!(shift("s", i64::MIN).is_err());
        assert!(shift("s", i64::MAX).is_err());
        assert!(duration("d", -1).is_err());
        assert_eq!(shifted("run_at", 100, -50), Ok(50));
        assert!(shifted("run_at", 100, -101).is_err());
        assert!(shifted("run_at", MAX_TIME_MS, 1).is_err());
        assert!(shifted("run_at", i64::MAX, i64::MAX).is_err());
    }

    #[test]
    fn attempts_plugins_and_payloads() {
        assert_eq!(attempts("max_attempts", 1), Ok(1));
        assert_eq!(attempts("max_attempts", 1000), Ok(1000));
        for n in [0, -1, 1001, i64::MAX, i64::from(u32::MAX) + 1] {
            assert_eq!(
                attempts("max_attempts", n).unwrap_err().0,
                "max_attempts must be an integer from 1 to 1000"
            );
        }
        assert!(plugin("plugin", "auto-feed").is_ok());
        assert_eq!(
            plugin("[2].plugin", "Auto").unwrap_err().0,
            "[2].plugin \"Auto\" is not a plugin name ([a-z0-9][a-z0-9-]{0,63})"
        );
        assert!(payload("payload", "{}", 2).is_ok());
        assert_eq!(
            payload("payload", "[1,2]", 4).unwrap_err().0,
            "payload is 5 bytes; the limit is 4"
        );
    }

    #[test]
    fn ids() {
        assert!(id_like("order 42"));
        assert!(id_like(&"é".repeat(100)));
        assert!(!id_like(&"é".repeat(101)));
        assert!(!id_like(""));
        assert!(!id_like("a\0b"));
        assert!(!id_like("a\tb"));
        assert!(
            id("id", &"x".repeat(5000))
                .unwrap_err()
                .0
                .contains("5000 bytes")
        );
    }
}
