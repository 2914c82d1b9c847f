//! Per-client rate limiting: one GCRA bucket per client key (governor's
//! keyed limiter), `burst` requests at once, refilled at `per_second`.
//!
//! The key is the verified token subject, else the client's IP address
//! (see [`crate::auth::guard`]). Buckets of clients that have been quiet long
//! enough to be full again are dropped every few thousand requests, so the
//! map stays as large as the set of recently active clients.

use crate::config::RateLimitSettings;
use crate::error::ApiError;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

/// Checks between two sweeps of idle buckets.
const SWEEP_EVERY: u64 = 4096;

#[derive(Debug, thiserror::Error)]
#[error("rate_limit.{0} must be at least 1 (or set rate_limit.enabled = false)")]
pub struct RateLimitError(&'static str);

pub struct Limiter {
    buckets: DefaultKeyedRateLimiter<String>,
    clock: DefaultClock,
    checks: AtomicU64,
}

impl Limiter {
    /// `None` when rate limiting is disabled.
    pub fn new(settings: &RateLimitSettings) -> Result<Option<Self>, RateLimitError> {
        if !settings.enabled {
            return Ok(None);
        }
        let per_second = NonZeroU32::new(settings.per_second).ok_or(RateLimitError("per_second"))?;
        let burst = NonZeroU32::new(settings.burst).ok_or(RateLimitError("burst"))?;
        let quota = Quota::per_second(per_second).allow_burst(burst);
        Ok(Some(Self {
            buckets: DefaultKeyedRateLimiter::keyed(quota),
            clock: DefaultClock::default(),
            checks: 0.into(),
        }))
    }

    /// Takes one request from `key`'s bucket, or says when the next one fits.
    pub fn check(&self, key: &str) -> Result<(), ApiError> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.buckets.retain_recent();
        }
        self.buckets.check_key(&key.to_string()).map_err(|not_until| ApiError::RateLimited {
            retry_after: not_until.wait_time_from(self.clock.now()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limiter(per_second: u32, burst: u32) -> Limiter {
        Limiter::new(&RateLimitSettings { enabled: true, per_second, burst }).unwrap().unwrap()
    }

    #[test]
    fn burst_then_refusal_with_the_wait_then_refill() {
        let l = limiter(10, 3);
        for _ in 0..3 {
            l.check("a").unwrap();
        }
        match l.check("a") {
            Err(ApiError::RateLimited { retry_after }) => {
                assert!(
                    retry_after > Duration::ZERO && retry_after <= Duration::from_millis(100),
                    "{retry_after:?}"
                )
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        // Another client has its own bucket.
        l.check("b").unwrap();
        std::thread::sleep(Duration::from_millis(120));
        l.check("a").unwrap();
    }

    #[test]
    fn zero_rates_are_refused_and_disabled_means_none() {
        assert!(Limiter::new(&RateLimitSettings { enabled: true, per_second: 0, burst: 1 }).is_err());
        assert!(Limiter::new(&RateLimitSettings { enabled: true, per_second: 1, burst: 0 }).is_err());
        assert!(
            Limiter::new(&RateLimitSettings { enabled: false, per_second: 0, burst: 0 }).unwrap().is_none()
        );
    }
}
