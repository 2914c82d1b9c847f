//! Exponential backoff with full jitter (the AWS "full jitter" variant):
//! attempt `n` sleeps a uniformly random time in `[0, min(max, base * 2^n)]`,
//! which spreads retries of many clients instead of synchronising them.

use rand::Rng;
use std::time::Duration;

/// Backoff state: call [`Backoff::next_delay`] after each failure and
/// [`Backoff::reset`] after a success.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    base_ms: u64,
    max_ms: u64,
    failures: u32,
}

impl Backoff {
    pub(crate) fn new(base_ms: u64, max_ms: u64) -> Self {
        Self { base_ms: base_ms.max(1), max_ms: max_ms.max(base_ms.max(1)), failures: 0 }
    }

    /// The ceiling for the current failure count (before jitter).
    pub(crate) fn ceiling(&self) -> Duration {
        let exp = self.base_ms.saturating_mul(1u64 << self.failures.min(32));
        Duration::from_millis(exp.min(self.max_ms))
    }

    /// Records a failure and returns how long to wait before the next try.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling().as_millis() as u64;
        self.failures = self.failures.saturating_add(1);
        Duration::from_millis(rand::rng().random_range(0..=ceiling))
    }

    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// No failure since the last reset.
    pub(crate) fn is_reset(&self) -> bool {
        self.failures == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(100, 1_000);
        let mut ceilings = Vec::new();
        for _ in 0..6 {
            ceilings.push(b.ceiling().as_millis());
            let d = b.next_delay();
            assert!(d <= Duration::from_millis(1_000));
        }
        assert_eq!(ceilings, vec![100, 200, 400, 800, 1_000, 1_000]);
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_millis(100));
    }

    #[test]
    fn delays_are_jittered_within_the_ceiling() {
        let mut b = Backoff::new(1_000, 1_000);
        let delays: std::collections::HashSet<_> = (0..50).map(|_| b.next_delay()).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(1_000)));
        assert!(delays.len() > 1, "full jitter gives different delays");
    }
}
