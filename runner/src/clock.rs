//! This process's clock: milliseconds since the Unix epoch, and a skew that tests set.
//!
//! Nothing that decides when a task fires reads it: that is Redis `TIME`, inside the scripts.
//! It serves what a person expects of the runner's own clock: `delay_ms` relative to the runner
//! that received the request, a plugin's `now()`, logs and metrics.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A skew added to this process's clock (`EGGTIMER_TEST_CLOCK_SKEW_MS`, read by `config`), so
/// that tests can run a runner whose clock is wrong.
static SKEW_MS: AtomicI64 = AtomicI64::new(0);

/// Sets the clock skew (tests only; `serve` calls it with the hidden flag's value).
pub fn set_skew_ms(ms: i64) {
    SKEW_MS.store(ms, Ordering::Relaxed);
}

/// Milliseconds since the Unix epoch, by this process's clock (plus the test skew, if any).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
        + SKEW_MS.load(Ordering::Relaxed)
}
