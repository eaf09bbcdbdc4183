//! The runner's clock: milliseconds since the Unix epoch, following Redis's clock.
//!
//! What decides when a task fires reads Redis `TIME` inside the scripts. The rest of the runner
//! reads [`Clock::now_ms`]: `delay_ms` relative to the request, a plugin's `now()`, a recurring
//! schedule's next time, the dedup window check, done-task visibility, logs and metrics. It is
//! this process's own clock corrected by the offset to Redis's that membership measures at every
//! heartbeat (and `serve` once before it listens), so runners whose clocks are wrong still agree
//! with Redis and with each other. An offset within [`FOLLOW_BEYOND_MS`] is taken as none: on
//! one machine the clocks are the same, and a reading's own jitter is below that.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// An offset to Redis's clock larger than this is followed; a smaller one is taken as none.
pub const FOLLOW_BEYOND_MS: i64 = 5;

/// This machine's clock, ms since the Unix epoch, corrected by nothing (for tools beside a
/// runner, such as the benchmark, on the machine of its Redis).
pub fn system_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The runner's clock. `serve` makes one and hands it to the store (in its `StoreOptions`) and
/// the plugin host (in its `PluginOptions`); every clone reads and corrects the same clock. A
/// test makes its own, off by a skew or moved on by [`Clock::advance`], without touching any
/// other runner in the process.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    inner: Arc<Offsets>,
}

#[derive(Debug, Default)]
struct Offsets {
    /// Added to this process's own clock: a runner whose clock is wrong
    /// (`EGGTIMER_TEST_CLOCK_SKEW_MS`), or time moved on by a test.
    skew_ms: AtomicI64,
    /// Redis's clock minus this process's own, as last measured (0 within
    /// [`FOLLOW_BEYOND_MS`]).
    redis_offset_ms: AtomicI64,
}

impl Clock {
    /// This machine's clock off by `skew_ms`.
    pub fn skewed(skew_ms: i64) -> Clock {
        let clock = Clock::default();
        clock.advance(skew_ms);
        clock
    }

    /// Moves this clock on by `ms` (back, when negative).
    pub fn advance(&self, ms: i64) {
        self.inner.skew_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// This process's own clock (plus its skew), not corrected to Redis's.
    pub fn own_ms(&self) -> i64 {
        system_ms() + self.inner.skew_ms.load(Ordering::Relaxed)
    }

    /// Milliseconds since the Unix epoch by Redis's clock, as this clock follows it.
    pub fn now_ms(&self) -> i64 {
        self.own_ms() + self.inner.redis_offset_ms.load(Ordering::Relaxed)
    }

    /// How far this clock is ahead of Redis's (ms; negative: behind), as last measured.
    pub fn own_ahead_of_redis_ms(&self) -> i64 {
        -self.inner.redis_offset_ms.load(Ordering::Relaxed)
    }

    /// Records a reading of Redis's clock (`redis_ms`) requested at `sent` and answered at
    /// `received` (both [`Clock::own_ms`]).
    pub fn observe_redis(&self, redis_ms: i64, sent: i64, received: i64) {
        self.inner.redis_offset_ms.store(
            offset_to_follow(redis_ms, sent, received),
            Ordering::Relaxed,
        );
    }
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

    #[test]
    fn a_clock_moves_on_alone_and_its_clones_follow_it() {
        let (a, b) = (Clock::default(), Clock::default());
        let a2 = a.clone();
        let before = b.now_ms();
        a.advance(3_600_000);
        let ahead = a2.now_ms() - b.now_ms();
        assert!((3_599_000..=3_601_000).contains(&ahead), "ahead {ahead}");
        assert!(b.now_ms() - before < 60_000, "the other clock did not move");
        a.observe_redis(1_060_001, 1_000_000, 1_000_002);
        assert_eq!(a2.own_ahead_of_redis_ms(), -60_000);
        assert_eq!(b.own_ahead_of_redis_ms(), 0);
        assert_eq!(Clock::skewed(-5_000).own_ahead_of_redis_ms(), 0);
    }
}
