//! Delays between attempts of a retried step.

use crate::SagaSettings;
use rand::Rng;
use std::time::Duration;

/// Exponential backoff with full jitter: a uniformly random delay in
/// `[0, min(retry_max_ms, retry_base_ms * 2^attempts)]`.
pub(crate) fn delay(settings: &SagaSettings, attempts: u32) -> Duration {
    let cap = settings.retry_base_ms.saturating_mul(1u64 << attempts.min(20)).min(settings.retry_max_ms);
    Duration::from_millis(rand::rng().random_range(0..=cap.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_the_cap() {
        let s = SagaSettings { retry_base_ms: 100, retry_max_ms: 1000, ..Default::default() };
        for attempt in 0..30 {
            assert!(delay(&s, attempt) <= Duration::from_millis(1000));
        }
    }
}
