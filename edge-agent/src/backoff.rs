//! Retry pacing for calls to the broker: capped exponential backoff with jitter, and a failure
//! streak that logs one warning when the broker becomes unreachable and one line when it is
//! back, instead of a line per try.

use std::fmt::Display;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Capped exponential backoff: `min`, `2·min`, … up to `max`, each with ±20 % jitter so that a
/// fleet of agents does not retry in lockstep after a broker restart.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            next: min,
        }
    }

    /// The delay before the next try; each call doubles the following one, up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        // Jitter from the clock's sub-second part: good enough to spread retries, no RNG needed.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let factor = 0.8 + 0.4 * (f64::from(nanos % 1000) / 1000.0);
        base.mul_f64(factor).min(self.max)
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Counts consecutive failures of one kind of call and logs the start and end of a streak.
#[derive(Debug)]
pub struct Streak {
    what: &'static str,
    failures: u32,
}

impl Streak {
    pub fn new(what: &'static str) -> Self {
        Streak { what, failures: 0 }
    }

    pub fn failed(&mut self, error: &dyn Display) {
        self.failures += 1;
        if self.failures == 1 {
            tracing::warn!(call = self.what, error = %error, "broker call failed; retrying with backoff");
        } else {
            tracing::debug!(call = self.what, error = %error, failures = self.failures, "broker call failed again");
        }
    }

    pub fn succeeded(&mut self) {
        if self.failures > 0 {
            tracing::info!(
                call = self.what,
                failures = self.failures,
                "broker call succeeded again"
            );
        }
        self.failures = 0;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let delays: Vec<Duration> = (0..10).map(|_| b.next_delay()).collect();
        assert!(delays[0] >= Duration::from_millis(160) && delays[0] <= Duration::from_millis(240));
        assert!(delays[1] >= Duration::from_millis(320), "{delays:?}");
        assert!(
            delays.iter().all(|d| *d <= Duration::from_secs(5)),
            "{delays:?}"
        );
        assert!(delays[9] >= Duration::from_secs(4), "{delays:?}");
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(240));
    }

    #[test]
    fn streak_counts_and_clears() {
        let mut s = Streak::new("work");
        s.failed(&"down");
        s.failed(&"down");
        assert_eq!(s.failures(), 2);
        s.succeeded();
        assert_eq!(s.failures(), 0);
    }
}
