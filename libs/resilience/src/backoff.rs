//! Exponential backoff with full jitter, the one used everywhere: gRPC call
//! retries ([`crate::retry`]), the outbox relay and consumers, and saga steps.
//!
//! Retry `n` (from 0) sleeps a uniformly random time in
//! `[0, min(cap, base * 2^n)]` (the AWS "full jitter" variant): callers that
//! failed together spread out instead of retrying in waves, and the expected
//! wait still doubles per attempt up to the cap.

use rand::Rng;
use std::time::Duration;

/// A backoff policy: a base and a cap. Stateless: the caller counts attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
}

impl Backoff {
    /// `base` is the ceiling of the first retry; `cap` bounds every one (a
    /// cap below the base is raised to it).
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self { base, cap: cap.max(base) }
    }

    /// [`Backoff::new`] in milliseconds, with a base of at least 1 ms.
    pub fn from_millis(base_ms: u64, cap_ms: u64) -> Self {
        Self::new(Duration::from_millis(base_ms.max(1)), Duration::from_millis(cap_ms))
    }

    /// Upper bound of the sleep before retry `n` (0-based): `min(cap, base * 2^n)`.
    pub fn ceiling(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n).unwrap_or(u32::MAX);
        self.base.checked_mul(factor).map_or(self.cap, |d| d.min(self.cap))
    }

    /// A sleep before retry `n`, drawn uniformly from `[0, ceiling(n)]`.
    pub fn delay(&self, n: u32) -> Duration {
        self.delay_with(n, &mut rand::rng())
    }

    /// [`Backoff::delay`] with the caller's random number generator.
    fn delay_with(&self, n: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(n).as_micros() as u64;
        Duration::from_micros(rng.random_range(0..=ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_is_uniform_below_a_capped_exponential_ceiling() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1_000));
        let ceilings: Vec<_> = (0..6).map(|n| b.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(b.ceiling(200), Duration::from_millis(1_000), "no overflow");
        let mut rng = rand::rng();
        let mut previous_mean = Duration::ZERO;
        for n in 0..4 {
            let samples: Vec<_> = (0..2_000).map(|_| b.delay_with(n, &mut rng)).collect();
            assert!(samples.iter().all(|d| *d <= b.ceiling(n)));
            let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
            // Uniform on [0, c]: mean c/2; 2 000 samples put it within a few % of that.
            let expected = b.ceiling(n) / 2;
            assert!(mean > expected.mul_f64(0.9) && mean < expected.mul_f64(1.1), "n={n} mean {mean:?}");
            assert!(mean > previous_mean, "delays grow with the attempt");
            assert!(samples.iter().any(|d| *d < expected / 4), "jitter reaches down towards 0");
            previous_mean = mean;
        }
    }

    #[test]
    fn a_cap_below_the_base_and_a_zero_base_stay_sane() {
        let b = Backoff::new(Duration::from_millis(500), Duration::from_millis(100));
        assert_eq!(b.ceiling(0), Duration::from_millis(500), "the cap is raised to the base");
        assert_eq!(b.ceiling(3), Duration::from_millis(500));
        let b = Backoff::from_millis(0, 0);
        assert_eq!(b.ceiling(0), Duration::from_millis(1), "a base of at least 1 ms");
        assert!(b.delay(10) <= Duration::from_millis(1));
    }
}
