//! Retry of retryable attempts with exponential backoff, full jitter and a retry budget.
//!
//! Built on `tower::retry::Retry` with a [`RetryPolicy`]:
//!
//! * Only retryable outcomes are retried: transport errors, `UNAVAILABLE`,
//!   `DEADLINE_EXCEEDED` (from a trailers-only response) and per-attempt timeouts. Business
//!   codes and the stack's own breaker/bulkhead rejections are returned as they are.
//! * Retry `n` (from 0) first sleeps `random(0, min(max_backoff, base * 2^n))`
//!   ([`Backoff`]: "full jitter", so synchronized callers spread out instead of
//!   retrying in waves).
//! * `tower::retry::budget::TpsBudget` caps retries to a fraction of recent calls plus a
//!   small per-second floor, shared by all callers of the downstream, so a failing
//!   downstream sees at most `1 + ratio` times its normal load instead of `max_attempts`.
//!
//! The request must be cloneable, so the layer works on `http::Request<Bytes>` (the body
//! is buffered further out); every mutating call carries an idempotency key, so any unary
//! call may be sent again.

use crate::backoff::Backoff;
use crate::outcome::Outcome;
use crate::{BoxError, RetrySettings};
use bytes::Bytes;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tower::retry::budget::{Budget, TpsBudget};

/// Decides, per call, whether and when to send another attempt.
#[derive(Debug, Clone)]
pub(crate) struct RetryPolicy {
    downstream: &'static str,
    max_attempts: u32,
    backoff: Backoff,
    budget: Arc<TpsBudget>,
    /// Attempts finished so far by the call this clone belongs to.
    attempts: u32,
}

impl RetryPolicy {
    /// `settings` must have passed `ClientSettings::validate` (TpsBudget asserts ranges).
    pub(crate) fn new(downstream: &'static str, settings: &RetrySettings) -> Self {
        let budget = TpsBudget::new(
            Duration::from_millis(settings.budget_ttl_ms),
            settings.budget_min_per_sec,
            settings.budget_ratio,
        );
        Self {
            downstream,
            max_attempts: settings.max_attempts,
            backoff: Backoff::new(
                Duration::from_millis(settings.base_backoff_ms),
                Duration::from_millis(settings.max_backoff_ms),
            ),
            budget: Arc::new(budget),
            attempts: 0,
        }
    }
}

impl<B> tower::retry::Policy<http::Request<Bytes>, http::Response<B>, BoxError> for RetryPolicy {
    type Future = Pin<Box<tokio::time::Sleep>>;

    fn retry(
        &mut self,
        _req: &mut http::Request<Bytes>,
        result: &mut Result<http::Response<B>, BoxError>,
    ) -> Option<Self::Future> {
        if self.attempts == 0 {
            // Every call (not attempt) earns budget for later retries.
            self.budget.deposit();
        }
        self.attempts += 1;
        if self.attempts >= self.max_attempts || !Outcome::of(result).is_retryable() {
            return None;
        }
        let downstream = self.downstream;
        if !self.budget.withdraw() {
            metrics::counter!("resilience_retry_budget_exhausted_total", "downstream" => downstream)
                .increment(1);
            tracing::debug!(downstream, "retry budget exhausted, not retrying");
            return None;
        }
        metrics::counter!("resilience_retries_total", "downstream" => downstream).increment(1);
        let delay = self.backoff.delay(self.attempts - 1);
        tracing::debug!(
            downstream,
            attempt = self.attempts + 1,
            delay_ms = delay.as_millis() as u64,
            "retrying"
        );
        Some(Box::pin(tokio::time::sleep(delay)))
    }

    fn clone_request(&mut self, req: &http::Request<Bytes>) -> Option<http::Request<Bytes>> {
        Some(req.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rejection;
    use crate::testing::{Svc, TestFuture, grpc_response, path};
    use std::sync::Mutex;
    use tokio::time::Instant;
    use tower::Layer;
    use tower::ServiceExt;
    use tower::retry::RetryLayer;

    const UNAVAILABLE: i32 = 14;

    fn settings(max_attempts: u32) -> RetrySettings {
        RetrySettings { max_attempts, base_backoff_ms: 100, max_backoff_ms: 1_000, ..Default::default() }
    }

    /// Answers `codes[i]` to attempt `i` (the last repeats) and logs when each came in.
    fn scripted(codes: Vec<i32>, log: Arc<Mutex<Vec<Instant>>>) -> impl Svc<Bytes> {
        let codes = Arc::new(codes);
        tower::service_fn(move |req: http::Request<Bytes>| -> TestFuture {
            assert_eq!(req.body().as_ref(), b"payload", "every attempt carries the full body");
            let mut log = log.lock().unwrap();
            log.push(Instant::now());
            let code = codes[(log.len() - 1).min(codes.len() - 1)];
            Box::pin(async move { Ok(grpc_response(code)) })
        })
    }

    fn request() -> http::Request<Bytes> {
        let mut req = path::<Bytes>("ReserveStock");
        *req.body_mut() = Bytes::from_static(b"payload");
        req
    }

    async fn call(policy: &RetryPolicy, codes: Vec<i32>) -> (Option<tonic::Code>, Vec<Instant>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let svc = RetryLayer::new(policy.clone()).layer(scripted(codes, Arc::clone(&log)));
        let resp = svc.oneshot(request()).await.unwrap();
        let code = resp.headers().get("grpc-status").map(|v| tonic::Code::from_bytes(v.as_bytes()));
        let log = log.lock().unwrap().clone();
        (code, log)
    }

    #[tokio::test(start_paused = true)]
    async fn retries_unavailable_until_success() {
        let policy = RetryPolicy::new("inventory", &settings(3));
        let (code, attempts) = call(&policy, vec![UNAVAILABLE, UNAVAILABLE, 0]).await;
        assert_eq!(code, None, "third attempt succeeded");
        assert_eq!(attempts.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_max_attempts() {
        let policy = RetryPolicy::new("inventory", &settings(3));
        let (code, attempts) = call(&policy, vec![UNAVAILABLE]).await;
        assert_eq!(code, Some(tonic::Code::Unavailable));
        assert_eq!(attempts.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn business_codes_are_not_retried() {
        let policy = RetryPolicy::new("inventory", &settings(3));
        for code in [
            tonic::Code::FailedPrecondition,
            tonic::Code::InvalidArgument,
            tonic::Code::NotFound,
            tonic::Code::Aborted,
        ] {
            let (got, attempts) = call(&policy, vec![code as i32, 0]).await;
            assert_eq!(got, Some(code));
            assert_eq!(attempts.len(), 1, "{code:?} must not be retried");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_timeouts_and_transport_errors_but_not_rejections() {
        let outcomes: Vec<(BoxError, usize)> = vec![
            (Box::new(Rejection::Timeout.to_status("inventory")), 3),
            (Box::new(std::io::Error::other("connection refused")), 3),
            (Box::new(Rejection::BulkheadFull.to_status("inventory")), 1),
            (
                Box::new(
                    Rejection::CircuitOpen { retry_after: Duration::from_secs(1) }.to_status("inventory"),
                ),
                1,
            ),
        ];
        for (err, expected) in outcomes {
            let label = err.to_string();
            let err = Arc::new(Mutex::new(Some(err)));
            let attempts = Arc::new(Mutex::new(0));
            let (e, a) = (Arc::clone(&err), Arc::clone(&attempts));
            let inner = tower::service_fn(move |_req: http::Request<Bytes>| -> TestFuture {
                *a.lock().unwrap() += 1;
                // Same error each time: rebuild it from the first one's status or message.
                let first = e.lock().unwrap().take();
                let again: BoxError = match first {
                    Some(err) => {
                        let status =
                            err.downcast_ref::<tonic::Status>().map(|s| (s.code(), s.metadata().clone()));
                        *e.lock().unwrap() = Some(match &status {
                            Some((code, md)) => {
                                Box::new(tonic::Status::with_metadata(*code, "again", md.clone()))
                            }
                            None => Box::new(std::io::Error::other("again")),
                        });
                        err
                    }
                    None => Box::new(std::io::Error::other("unreachable")),
                };
                Box::pin(async move { Err(again) })
            });
            let svc = RetryLayer::new(RetryPolicy::new("inventory", &settings(3))).layer(inner);
            assert!(svc.oneshot(request()).await.is_err());
            assert_eq!(*attempts.lock().unwrap(), expected, "{label}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_sleeps_lie_within_the_growing_jitter_bounds() {
        let policy = RetryPolicy::new("inventory", &settings(4));
        let (_, attempts) = call(&policy, vec![UNAVAILABLE]).await;
        assert_eq!(attempts.len(), 4);
        for (n, pair) in attempts.windows(2).enumerate() {
            let slept = pair[1] - pair[0];
            assert!(slept <= Duration::from_millis(100 << n), "retry {n} slept {slept:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_stops_retries_once_exhausted_and_refills_over_time() {
        // No ratio: only the floor of 2 retries per 1 s window is available.
        let s =
            RetrySettings { budget_ttl_ms: 1_000, budget_min_per_sec: 2, budget_ratio: 0.0, ..settings(2) };
        let policy = RetryPolicy::new("inventory", &s);
        let mut attempts = Vec::new();
        for _ in 0..4 {
            attempts.push(call(&policy, vec![UNAVAILABLE]).await.1.len());
        }
        assert_eq!(attempts, [2, 2, 1, 1], "two retries, then the budget is spent");
        tokio::time::advance(Duration::from_millis(1_100)).await;
        assert_eq!(call(&policy, vec![UNAVAILABLE]).await.1.len(), 2, "budget back after the ttl");
    }

    #[tokio::test(start_paused = true)]
    async fn successful_calls_earn_retries() {
        // No floor; 50%: every call deposits half a retry.
        let s = RetrySettings { budget_min_per_sec: 0, budget_ratio: 0.5, ..settings(2) };
        let policy = RetryPolicy::new("inventory", &s);
        assert_eq!(call(&policy, vec![UNAVAILABLE]).await.1.len(), 1, "nothing earned yet");
        for _ in 0..3 {
            call(&policy, vec![0]).await;
        }
        assert_eq!(call(&policy, vec![UNAVAILABLE]).await.1.len(), 2, "earned by the successes");
    }
}
