//! A run of failures and the wait before the next try, on the workspace's one
//! backoff policy ([`sagaworks_resilience::Backoff`]: exponential, full
//! jitter, capped).

use sagaworks_resilience::Backoff as Policy;
use std::time::Duration;

/// Call [`Backoff::next_delay`] after each failure and [`Backoff::reset`]
/// after a success.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    policy: Policy,
    failures: u32,
}

impl Backoff {
    pub(crate) fn new(base_ms: u64, max_ms: u64) -> Self {
        Self { policy: Policy::from_millis(base_ms, max_ms), failures: 0 }
    }

    /// Records a failure and returns how long to wait before the next try.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.policy.delay(self.failures);
        self.failures = self.failures.saturating_add(1);
        delay
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
    fn each_failure_raises_the_ceiling_up_to_the_cap_and_a_reset_starts_over() {
        let mut b = Backoff::new(100, 1_000);
        let mut ceilings = Vec::new();
        for _ in 0..6 {
            ceilings.push(b.policy.ceiling(b.failures).as_millis());
            assert!(b.next_delay() <= Duration::from_millis(1_000));
        }
        assert_eq!(ceilings, vec![100, 200, 400, 800, 1_000, 1_000]);
        assert!(!b.is_reset());
        b.reset();
        assert!(b.is_reset());
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
