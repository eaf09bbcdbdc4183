//! The runner's clock: milliseconds since the Unix epoch, following Redis's clock.
//!
//! What decides when a task fires reads Redis `TIME` inside the scripts. The rest of the runner
//! reads [`now_ms`]: `delay_ms` relative to the request, a plugin's `now()`, a recurring
//! schedule's next time, the dedup window check, done-task visibility, logs and metrics. It is
//! this process's own clock corrected by the offset to Redis's that membership measures at every
//! heartbeat (and `serve` once before it listens), so runners whose clocks are wrong still agree
//! with Redis and with each other. An offset within [`FOLLOW_BEYOND_MS`] is taken as none: on
//! one machine the clocks are the same, and a reading's own jitter is below that.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A skew added to this process's own clock (`EGGTIMER_TEST_CLOCK_SKEW_MS`, read by `config`),
/// so that tests can run a runner whose clock is wrong.
static SKEW_MS: AtomicI64 = AtomicI64::new(0);

/// Redis's clock minus this process's own, as last measured (0 within [`FOLLOW_BEYOND_MS`]).
static REDIS_OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// An offset to Redis's clock larger than this is followed; a smaller one is taken as none.
pub const FOLLOW_BEYOND_MS: i64 = 5;

/// Sets the clock skew (tests only; `serve` calls it with the hidden flag's value).
pub fn set_skew_ms(ms: i64) {
    SKEW_MS.store(ms, Ordering::Relaxed);
}

/// This process's own clock (plus the test skew), not corrected to Redis's.
pub fn own_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
        + SKEW_MS.load(Ordering::Relaxed)
}

/// Milliseconds since the Unix epoch by Redis's clock, as this process follows it.
pub fn now_ms() -> i64 {
    own_ms() + REDIS_OFFSET_MS.load(Ordering::Relaxed)
}

/// How far this process's own clock is ahead of Redis's (ms; negative: behind), as last measured.
pub fn own_ahead_of_redis_ms() -> i64 {
    -REDIS_OFFSET_MS.load(Ordering::Relaxed)
}

/// Records a reading of Redis's clock (`redis_ms`) requested at `sent` and answered at
/// `received` (both [`own_ms`]).
pub fn observe_redis(redis_ms: i64, sent: i64, received: i64) {
    REDIS_OFFSET_MS.store(
        offset_to_follow(redis_ms, sent, received),
        Ordering::Relaxed,
    );
}

/// The offset a reading gives: Redis read its clock somewhere between `sent` and `received`, so
/// the offset to its midpoint is known to within half the round trip. An offset that half a
/// round trip plus [`FOLLOW_BEYOND_MS`] explains is taken as none: a slow answer on a loaded
/// machine does not move the clock.
fn offset_to_follow(redis_ms: i64, sent: i64, received: i64) -> i64 {
    let offset = redis_ms - (sent + received) / 2;
    if offset.abs() > FOLLOW_BEYOND_MS + (received - sent).max(0) / 2 {
        offset
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_follows_redis_only_past_a_few_ms() {
        assert_eq!(offset_to_follow(1_000_003, 1_000_000, 1_000_002), 0);
        assert_eq!(offset_to_follow(1_060_001, 1_000_000, 1_000_002), 60_000);
        assert_eq!(offset_to_follow(940_001, 1_000_000, 1_000_002), -60_000);
        // answered after 300 ms, read by Redis at the start: the same clock, a slow answer
        assert_eq!(offset_to_follow(1_000_001, 1_000_000, 1_000_300), 0);
        assert_eq!(offset_to_follow(1_060_001, 1_000_000, 1_000_300), 59_851);
    }
}
