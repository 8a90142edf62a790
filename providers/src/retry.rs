//! Retries of cloud API calls, for every provider: throttling and transient failures are
//! retried with jittered exponential backoff, a bounded number of times. The clients' own
//! retries are off (the AWS SDK's in `AwsProvider::new`), so this is the only place that
//! decides, and every attempt is logged. Each provider makes its retried calls safe to repeat
//! (EC2's client token, GCE's `requestId`, looking the instance up by its tag first).

use crate::failure::Failure;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::time::Duration;

/// Throttling and transient failures are retried with jittered exponential backoff. The SDK's
/// own retries are off, so every attempt is counted here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    /// Attempts per API call, the first included.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    #[serde(default = "default_base_delay_ms")]
    pub base_delay_ms: u64,
    #[serde(default = "default_max_delay_ms")]
    pub max_delay_ms: u64,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            max_attempts: default_max_attempts(),
            base_delay_ms: default_base_delay_ms(),
            max_delay_ms: default_max_delay_ms(),
        }
    }
}

fn default_max_attempts() -> u32 {
    4
}
fn default_base_delay_ms() -> u64 {
    200
}
fn default_max_delay_ms() -> u64 {
    5_000
}

#[derive(Clone, Debug)]
pub struct Backoff {
    max_attempts: u32,
    base: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(settings: &RetrySettings) -> Backoff {
        Backoff {
            max_attempts: settings.max_attempts.max(1),
            base: Duration::from_millis(settings.base_delay_ms),
            max: Duration::from_millis(settings.max_delay_ms),
        }
    }

    /// The ceiling of the delay after failed attempt `attempt` (1-based): `base × 2^(attempt-1)`,
    /// capped at `max`.
    fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// "Equal jitter": half the ceiling plus a random part of the other half, so that many
    /// callers throttled together spread out but none retries at once.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let half = ceiling / 2;
        let spread = u64::try_from((ceiling - half).as_micros()).unwrap_or(u64::MAX);
        half + Duration::from_micros(rand::rng().random_range(0..=spread))
    }

    /// Runs `call` until it succeeds, fails in a way a retry cannot help, or runs out of
    /// attempts; returns the last failure.
    pub async fn run<T, F, Fut>(&self, operation: &'static str, mut call: F) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let mut attempt = 1;
        loop {
            match call().await {
                Ok(value) => return Ok(value),
                Err(failure) if failure.retryable() && attempt < self.max_attempts => {
                    let delay = self.delay(attempt);
                    tracing::warn!(
                        provider.operation = operation,
                        attempt,
                        max_attempts = self.max_attempts,
                        delay_ms = delay.as_millis() as u64,
                        error = %failure.detail(),
                        "cloud API call failed, retrying"
                    );
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(failure) => return Err(failure),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::Class;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn backoff(max_attempts: u32) -> Backoff {
        Backoff::new(&RetrySettings {
            max_attempts,
            base_delay_ms: 1,
            max_delay_ms: 4,
        })
    }

    #[test]
    fn delays_grow_exponentially_within_their_cap() {
        let b = Backoff::new(&RetrySettings {
            max_attempts: 10,
            base_delay_ms: 100,
            max_delay_ms: 1_000,
        });
        let ceilings: Vec<u64> = (1..=6).map(|a| b.ceiling(a).as_millis() as u64).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1_000, 1_000]);
        for attempt in 1..=40 {
            let d = b.delay(attempt);
            assert!(
                d >= b.ceiling(attempt) / 2 && d <= b.ceiling(attempt),
                "{d:?}"
            );
        }
    }

    #[tokio::test]
    async fn retries_throttling_until_it_passes() {
        let calls = AtomicU32::new(0);
        let result = backoff(4)
            .run("Test", || async {
                if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    Err(Failure::new(Class::Throttled, "slow down"))
                } else {
                    Ok(7)
                }
            })
            .await;
        assert_eq!(result, Ok(7));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn gives_up_after_max_attempts_and_never_retries_capacity() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = backoff(3)
            .run("Test", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(Failure::new(Class::Transient, "down"))
            })
            .await;
        assert_eq!(result.map_err(|f| f.class), Err(Class::Transient));
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        calls.store(0, Ordering::SeqCst);
        let result: Result<(), _> = backoff(3)
            .run("Test", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(Failure::new(Class::Capacity, "none"))
            })
            .await;
        assert_eq!(result.map_err(|f| f.class), Err(Class::Capacity));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
