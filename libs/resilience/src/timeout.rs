//! Per-attempt timeout, chosen per route, also announced to the server via `grpc-timeout`.
//!
//! The timeout is looked up from the request path (`/package.Service/Method`) in the
//! client's `routes` (full path, then method name), else the default `timeout_ms`. A
//! shorter deadline the caller already set (tonic's `Request::set_timeout` writes
//! `grpc-timeout`) is kept. The layer sits below the retry, so each attempt gets the
//! full budget, and below the breaker, so an expired attempt is recorded as a failure.
//! Expiry fails the attempt with `DEADLINE_EXCEEDED` marked `timeout`. tonic's own
//! `Channel` and server also enforce the `grpc-timeout` we send and can win the race at
//! the deadline (`TimeoutExpired` from the channel, `CANCELLED` from a tonic server);
//! those answers are turned into the same marked timeout, so callers see one outcome.

use crate::outcome::Outcome;
use crate::rejection::{Rejection, reject};
use crate::{BoxError, ClientSettings};
use futures::future::BoxFuture;
use http::{HeaderValue, Request};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tonic::Code;

const GRPC_TIMEOUT: &str = "grpc-timeout";

/// Timeouts of one downstream.
#[derive(Debug, Clone)]
pub(crate) struct TimeoutLayer {
    downstream: &'static str,
    settings: Arc<ClientSettings>,
}

impl TimeoutLayer {
    pub(crate) fn new(downstream: &'static str, settings: Arc<ClientSettings>) -> Self {
        Self { downstream, settings }
    }
}

impl<S> tower::Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;
    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout { inner, layer: self.clone() }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Timeout<S> {
    inner: S,
    layer: TimeoutLayer,
}

impl<S, B, R> tower::Service<Request<B>> for Timeout<S>
where
    S: tower::Service<Request<B>, Response = http::Response<R>, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let mut timeout = self.layer.settings.timeout_for(req.uri().path());
        if let Some(caller) = req.headers().get(GRPC_TIMEOUT).and_then(parse_grpc_timeout) {
            timeout = timeout.min(caller);
        }
        req.headers_mut().insert(GRPC_TIMEOUT, encode_grpc_timeout(timeout));
        let downstream = self.layer.downstream;
        let started = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout(timeout, fut).await {
                Ok(Err(err)) if is_timeout_expired(err.as_ref()) => {
                    Err(reject(downstream, Rejection::Timeout))
                }
                Ok(result) if started.elapsed() >= timeout && server_deadline_expired(&result) => {
                    Err(reject(downstream, Rejection::Timeout))
                }
                Ok(result) => result,
                Err(_) => Err(reject(downstream, Rejection::Timeout)),
            }
        })
    }
}

/// tonic's `Channel` enforces the `grpc-timeout` we set with its own timer, which fires
/// at the same instant as ours and reports `tonic::TimeoutExpired`.
fn is_timeout_expired(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// The server's own deadline (from our `grpc-timeout`) fired: it started later than ours,
/// so its answer arrives just after our timer and wins the race. tonic servers answer
/// `CANCELLED` then (the spec says `DEADLINE_EXCEEDED`); either way it is our timeout.
fn server_deadline_expired<B>(result: &Result<http::Response<B>, BoxError>) -> bool {
    matches!(Outcome::of(result), Outcome::Code(Code::Cancelled | Code::DeadlineExceeded))
}

/// `grpc-timeout` value in milliseconds (the spec allows at most 8 digits).
fn encode_grpc_timeout(timeout: Duration) -> HeaderValue {
    let ms = timeout.as_millis().clamp(1, 99_999_999);
    // Digits and `m` are always a valid header value; the fallback is unreachable.
    HeaderValue::try_from(format!("{ms}m")).unwrap_or_else(|_| HeaderValue::from_static("99999999m"))
}

/// Parses `grpc-timeout` (`<1-8 digits><H|M|S|m|u|n>`).
fn parse_grpc_timeout(value: &HeaderValue) -> Option<Duration> {
    let s = value.to_str().ok()?;
    let (digits, unit) = s.split_at_checked(s.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Svc, TestFuture, grpc_response, path};
    use tower::{Layer, ServiceExt};

    fn layer(settings: ClientSettings) -> TimeoutLayer {
        TimeoutLayer::new("inventory", Arc::new(settings))
    }

    /// An inner service that answers after `delay`, echoing the `grpc-timeout` it got.
    fn slow(delay: Duration) -> impl Svc<()> {
        tower::service_fn(move |req: Request<()>| -> TestFuture {
            let seen = req.headers().get(GRPC_TIMEOUT).cloned();
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                let mut resp = grpc_response(0);
                if let Some(v) = seen {
                    resp.headers_mut().insert("x-seen-timeout", v);
                }
                Ok(resp)
            })
        })
    }

    #[tokio::test(start_paused = true)]
    async fn fires_after_the_default_timeout_with_a_marked_deadline_exceeded() {
        let svc = layer(ClientSettings { timeout_ms: 100, ..Default::default() })
            .layer(slow(Duration::from_millis(150)));
        let started = tokio::time::Instant::now();
        let err = svc.oneshot(path("GetStock")).await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_millis(100));
        let status = err.downcast::<tonic::Status>().unwrap();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(crate::rejection(&status), Some(Rejection::Timeout));
    }

    #[tokio::test(start_paused = true)]
    async fn a_route_overrides_the_default_and_the_server_is_told_the_deadline() {
        let mut settings = ClientSettings { timeout_ms: 100, ..Default::default() };
        settings.routes.insert("ReserveStock".into(), 500);
        let svc = layer(settings).layer(slow(Duration::from_millis(150)));
        let resp = svc.clone().oneshot(path("ReserveStock")).await.unwrap();
        assert_eq!(resp.headers()["x-seen-timeout"], "500m");
        assert!(svc.oneshot(path("GetStock")).await.is_err(), "other routes keep the 100 ms default");
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_caller_deadline_is_kept() {
        let svc = layer(ClientSettings { timeout_ms: 1_000, ..Default::default() })
            .layer(slow(Duration::from_millis(150)));
        let mut req = path("GetStock");
        req.headers_mut().insert(GRPC_TIMEOUT, HeaderValue::from_static("50m"));
        let started = tokio::time::Instant::now();
        assert!(svc.oneshot(req).await.is_err());
        assert_eq!(started.elapsed(), Duration::from_millis(50));
    }

    #[tokio::test(start_paused = true)]
    async fn the_servers_deadline_answer_at_our_deadline_counts_as_our_timeout() {
        let answer_after = |delay: Duration| {
            tower::service_fn(move |_req: Request<()>| -> TestFuture {
                Box::pin(async move {
                    tokio::time::sleep(delay).await;
                    Ok(grpc_response(Code::Cancelled as i32))
                })
            })
        };
        let settings = || ClientSettings { timeout_ms: 100, ..Default::default() };
        let late = layer(settings()).layer(answer_after(Duration::from_millis(100)));
        let err = late.oneshot(path("GetStock")).await.unwrap_err();
        let status = err.downcast::<tonic::Status>().unwrap();
        assert_eq!(crate::rejection(&status), Some(Rejection::Timeout));

        let early = layer(settings()).layer(answer_after(Duration::from_millis(10)));
        let resp = early.oneshot(path("GetStock")).await.unwrap();
        assert_eq!(resp.headers()["grpc-status"], "1", "a CANCELLED before the deadline is passed on");

        let ok_at_the_deadline = layer(settings()).layer(slow(Duration::from_millis(100)));
        let answer = ok_at_the_deadline.oneshot(path("GetStock")).await;
        assert!(answer.is_ok(), "a success at the deadline is passed on");
    }

    #[tokio::test]
    async fn the_channels_own_deadline_error_becomes_our_timeout() {
        let inner = tower::service_fn(|_req: Request<()>| -> TestFuture {
            Box::pin(async { Err(Box::new(tonic::TimeoutExpired(())) as BoxError) })
        });
        let err = layer(ClientSettings::default()).layer(inner).oneshot(path("GetStock")).await.unwrap_err();
        let status = err.downcast::<tonic::Status>().unwrap();
        assert_eq!(crate::rejection(&status), Some(Rejection::Timeout));
    }

    #[test]
    fn grpc_timeout_values_parse_and_encode() {
        assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("2S")), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("300u")), Some(Duration::from_micros(300)));
        assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("1H")), Some(Duration::from_secs(3_600)));
        assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("2M")), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("500n")), Some(Duration::from_nanos(500)));
        assert_eq!(
            parse_grpc_timeout(&HeaderValue::from_static("99999999m")),
            Some(Duration::from_millis(99_999_999)),
            "8 digits, the most the spec allows"
        );
        assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("m")), None);
        assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("123456789m")), None);
        assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("5x")), None);
        assert_eq!(encode_grpc_timeout(Duration::from_millis(1500)), "1500m");
    }
}
