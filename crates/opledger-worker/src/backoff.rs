//! When a transient failure is tried again: capped exponential backoff with jitter.
//!
//! The jitter is derived from the operation id and the attempt rather than a random number
//! generator, so the delay is reproducible in tests and audits while operations that failed
//! together still spread out.

use std::time::Duration;

use sha2::{Digest, Sha256};

/// The backoff's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failed attempt (before jitter).
    pub base: Duration,
    /// No delay exceeds this.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The delay before trying `operation_id` again after its `attempt`-th claim failed: "full
    /// jitter" between half and all of `min(cap, base * 2^(attempt-1))`, and never less than
    /// what the service asked for (`retry_after`), which is capped too.
    pub fn delay(
        &self,
        operation_id: &str,
        attempt: u32,
        retry_after: Option<Duration>,
    ) -> Duration {
        let exponent = attempt.saturating_sub(1).min(30);
        let ceiling = self.base.saturating_mul(1u32 << exponent).min(self.cap);
        let digest = Sha256::new()
            .chain_update(operation_id.as_bytes())
            .chain_update(attempt.to_be_bytes())
            .finalize();
        let unit = f64::from(u32::from_be_bytes([
            digest[0], digest[1], digest[2], digest[3],
        ])) / f64::from(u32::MAX);
        let jittered = ceiling.mul_f64(0.5 + 0.5 * unit);
        match retry_after {
            Some(asked) => jittered.max(asked.min(self.cap)),
            None => jittered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_exponentially_within_jitter_and_stop_at_the_cap() {
        let backoff = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        };
        for attempt in 1..=12 {
            let ceiling = Duration::from_secs(1u64 << (attempt - 1)).min(Duration::from_secs(60));
            let delay = backoff.delay("op", attempt, None);
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "attempt {attempt}: {delay:?}"
            );
        }
        assert!(backoff.delay("op", u32::MAX, None) <= Duration::from_secs(60));
    }

    #[test]
    fn jitter_spreads_operations_and_is_reproducible() {
        let backoff = Backoff::default();
        let a = backoff.delay("op-a", 3, None);
        assert_eq!(a, backoff.delay("op-a", 3, None));
        let distinct: std::collections::HashSet<Duration> = (0..50)
            .map(|i| backoff.delay(&format!("op-{i}"), 3, None))
            .collect();
        assert!(distinct.len() > 40, "{} distinct delays", distinct.len());
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let backoff = Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_secs(30),
        };
        assert_eq!(
            backoff.delay("op", 1, Some(Duration::from_secs(7))),
            Duration::from_secs(7)
        );
        assert_eq!(
            backoff.delay("op", 1, Some(Duration::from_secs(3600))),
            Duration::from_secs(30)
        );
    }
}
