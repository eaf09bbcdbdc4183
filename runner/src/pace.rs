//! How fast something has lately happened in one shard (tasks claimed, outcomes to record), so
//! work that costs Redis a script call whatever its size can wait for a batch under a steady
//! stream and go at once when the shard is quiet: a poller claims ahead by it, the finisher
//! waits for a group by it.

use std::time::Duration;

use tokio::time::Instant;

/// How often the pace is measured again.
const WINDOW: Duration = Duration::from_millis(100);

/// Events counted over windows of [`WINDOW`]; the pace is the last whole window's.
pub(crate) struct Pace {
    since: Instant,
    count: u64,
    /// Events per ms in the last whole window.
    per_ms: f64,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            since: Instant::now(),
            count: 0,
            per_ms: 0.0,
        }
    }
}

impl Pace {
    /// `n` more happened now.
    pub(crate) fn note(&mut self, n: usize) {
        self.count += n as u64;
        let took = self.since.elapsed();
        if took >= WINDOW {
            self.per_ms = self.count as f64 / took.as_secs_f64() / 1000.0;
            self.count = 0;
            self.since = Instant::now();
        }
    }

    /// How long (whole ms, at least 1) until about `batch` more come at this pace, at most
    /// `most`; None while fewer than two would come in `most` (quiet: nothing to wait for).
    pub(crate) fn window_ms(&self, batch: f64, most: Duration) -> Option<u64> {
        let most = most.as_millis() as f64;
        if self.per_ms * most < 2.0 {
            return None;
        }
        Some((batch / self.per_ms).clamp(1.0, most).ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_pace_has_no_window_and_a_steady_one_a_window_for_a_batch() {
        let mut p = Pace::default();
        let most = Duration::from_millis(20);
        assert_eq!(p.window_ms(16.0, most), None, "nothing counted yet");
        p.per_ms = 0.05; // 50 a second: one in 20 ms
        assert_eq!(p.window_ms(16.0, most), None);
        p.per_ms = 0.625; // W1's 10,000 a second over 16 shards
        assert_eq!(p.window_ms(16.0, most), Some(20), "capped at the most");
        p.per_ms = 4.0;
        assert_eq!(p.window_ms(16.0, most), Some(4));
        p.per_ms = 1000.0;
        assert_eq!(p.window_ms(16.0, most), Some(1), "at least a ms");
    }
}
