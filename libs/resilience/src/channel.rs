//! [`ResilientChannel`]: the composed stack for one downstream, and [`channel`] to build it.
//!
//! The channel itself is the outermost layer: it counts every logical call
//! (`resilience_calls_total{downstream,outcome}`) and times it
//! (`resilience_call_duration_seconds{downstream}`), retries and backoff included, and
//! marks a failed call with whether it may have been sent (see `sent`).

use crate::body::{BufferBodyLayer, to_tonic_body};
use crate::breaker::{Breaker, BreakerLayer, CircuitState};
use crate::bulkhead::BulkheadLayer;
use crate::outcome::Outcome;
use crate::replicas::Replicas;
use crate::retry::RetryPolicy;
use crate::sent::{self, AttemptLayer};
use crate::timeout::TimeoutLayer;
use crate::{BoxError, ClientSettings, ResilienceError};
use futures::future::BoxFuture;
use http::{Request, Response};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::body::Body;
use tower::ServiceBuilder;
use tower::retry::RetryLayer;
use tower::util::BoxCloneSyncService;

/// A cloneable gRPC channel to one downstream with the resilience stack applied.
///
/// Clones share the connection, the breaker, the bulkhead and the retry budget: build one
/// per downstream at startup and clone it into every client.
#[derive(Clone)]
pub struct ResilientChannel {
    downstream: &'static str,
    inner: BoxCloneSyncService<Request<Body>, Response<Body>, BoxError>,
    breaker: Arc<Breaker>,
}

impl fmt::Debug for ResilientChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResilientChannel")
            .field("downstream", &self.downstream)
            .field("breaker", &self.breaker_state())
            .finish_non_exhaustive()
    }
}

impl ResilientChannel {
    /// Name of the downstream (the `downstream` label of the metrics).
    pub fn downstream(&self) -> &'static str {
        self.downstream
    }

    /// Current state of this downstream's circuit breaker.
    pub fn breaker_state(&self) -> CircuitState {
        self.breaker.state()
    }
}

impl tower::Service<Request<Body>> for ResilientChannel {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let downstream = self.downstream;
        let started = tokio::time::Instant::now();
        let maybe_sent = sent::track(&mut req);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            let outcome = Outcome::of(&result).label();
            metrics::counter!("resilience_calls_total", "downstream" => downstream, "outcome" => outcome)
                .increment(1);
            metrics::histogram!("resilience_call_duration_seconds", "downstream" => downstream)
                .record(started.elapsed().as_secs_f64());
            sent::mark(result, maybe_sent.get())
        })
    }
}

/// Builds the channel for downstream `name` (used in metrics and logs). Connects lazily.
///
/// With `tls` (this service's identity), every connection is mutual TLS: the URLs must be
/// `https://`, the server must show a certificate of the CA for the DNS name `name`, and
/// this service shows its own; each new connection uses the identity's certificate and
/// CA bundle of the moment ([`sagaworks_mtls::TlsConnector`]). Without, the URLs must be `http://` (development only).
///
/// With several URLs (replicas of the downstream), each attempt picks a replica:
/// power of two choices, leaving out those that could not be connected to lately
/// ([`crate::replicas`]). The stack above (breaker, bulkhead, retry budget) is the
/// downstream's, shared by its replicas; a retried attempt picks again.
pub fn channel(
    name: &'static str,
    settings: &ClientSettings,
    tls: Option<&sagaworks_mtls::Identity>,
) -> Result<ResilientChannel, ResilienceError> {
    settings.validate()?;
    let scheme = if tls.is_some() { "https://" } else { "http://" };
    let endpoints = settings
        .urls()
        .into_iter()
        .map(|url| {
            let invalid = |reason: String| ResilienceError::InvalidUrl { url: url.to_owned(), reason };
            if !url.starts_with(scheme) {
                return Err(invalid(format!(
                    "must start with {scheme} (TLS is {})",
                    if tls.is_some() { "on" } else { "off" }
                )));
            }
            // With TLS, the connector makes it (tonic takes an http:// URI with a connector).
            let transport_url =
                if tls.is_some() { url.replacen("https://", "http://", 1) } else { url.to_owned() };
            let endpoint = tonic::transport::Endpoint::from_shared(transport_url)
                .map_err(|e| invalid(e.to_string()))?
                // No `Endpoint::timeout`: the stack's timeout layer bounds every attempt.
                .connect_timeout(Duration::from_millis(settings.connect_timeout_ms));
            let channel = match tls {
                Some(identity) => {
                    let connector = identity.connector(name).map_err(|e| invalid(e.to_string()))?;
                    endpoint.connect_with_connector_lazy(connector)
                }
                None => endpoint.connect_lazy(),
            };
            // The replica's label, as tonic spells the URI.
            let label = url.parse::<http::Uri>().map_or_else(|_| url.to_owned(), |uri| uri.to_string());
            Ok((label, channel))
        })
        .collect::<Result<Vec<_>, _>>()?;
    match endpoints.len() {
        0 => Err(ResilienceError::InvalidUrl { url: settings.url.clone(), reason: "no URL".into() }),
        1 => {
            let (_, channel) = endpoints.into_iter().next().expect("one endpoint");
            Ok(stack(name, settings, channel))
        }
        _ => Ok(stack(name, settings, Replicas::new(name, endpoints))),
    }
}

/// Creates, at 0, every counter series the stack of `downstream` may record
/// later, so dashboards and alerts find them before the first failure and a
/// `rate()` sees the first increment.
fn register_metrics(downstream: &'static str) {
    for reason in crate::rejection::REASONS {
        metrics::counter!("resilience_rejections_total", "downstream" => downstream, "reason" => reason)
            .absolute(0);
    }
    metrics::counter!("resilience_retries_total", "downstream" => downstream).absolute(0);
    metrics::counter!("resilience_retry_budget_exhausted_total", "downstream" => downstream).absolute(0);
    crate::breaker::register_metrics(downstream);
}

/// Wraps `transport` in the stack, outermost first:
/// metrics + sent mark -> buffer body -> bulkhead -> retry -> breaker -> attempt
/// (records "maybe sent") -> timeout -> transport.
/// `settings` must be valid.
pub(crate) fn stack<T>(name: &'static str, settings: &ClientSettings, transport: T) -> ResilientChannel
where
    T: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + Sync + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send + 'static,
{
    register_metrics(name);
    let breaker = Breaker::new(name, settings.breaker.clone());
    let inner = ServiceBuilder::new()
        .layer(BufferBodyLayer)
        .layer(BulkheadLayer::new(name, settings.bulkhead.max_concurrent_calls))
        .layer(RetryLayer::new(RetryPolicy::new(name, &settings.retry)))
        .layer(BreakerLayer::new(Arc::clone(&breaker)))
        .layer(AttemptLayer)
        .layer(TimeoutLayer::new(name, Arc::new(settings.clone())))
        .map_request(to_tonic_body)
        .map_err(Into::<BoxError>::into)
        .service(transport);
    ResilientChannel { downstream: name, inner: BoxCloneSyncService::new(inner), breaker }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BreakerSettings, Rejection, RetrySettings};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;

    fn unavailable_transport(
        calls: Arc<AtomicUsize>,
    ) -> impl tower::Service<
        Request<Body>,
        Response = Response<Body>,
        Error = BoxError,
        Future = BoxFuture<'static, Result<Response<Body>, BoxError>>,
    > + Clone
    + Send
    + Sync
    + 'static {
        tower::service_fn(
            move |_req: Request<Body>| -> BoxFuture<'static, Result<Response<Body>, BoxError>> {
                calls.fetch_add(1, Ordering::SeqCst);
                Box::pin(async {
                    Ok(Response::builder()
                        .header("grpc-status", "14")
                        .body(Body::empty())
                        .expect("valid response"))
                })
            },
        )
    }

    #[tokio::test(start_paused = true)]
    async fn every_attempt_is_recorded_by_the_breaker_and_its_rejection_is_not_retried() {
        let settings = ClientSettings {
            retry: RetrySettings { max_attempts: 3, ..Default::default() },
            breaker: BreakerSettings { sliding_window_size: 4, minimum_calls: 4, ..Default::default() },
            ..Default::default()
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let channel = stack("inventory", &settings, unavailable_transport(Arc::clone(&calls)));
        let req = || Request::builder().uri("http://x/svc/GetStock").body(Body::empty()).unwrap();

        let first = channel.clone().oneshot(req()).await.unwrap();
        assert_eq!(first.headers()["grpc-status"], "14");
        assert_eq!(calls.load(Ordering::SeqCst), 3, "three attempts, three failures recorded");
        assert_eq!(channel.breaker_state(), CircuitState::Closed);

        let err = channel.clone().oneshot(req()).await.unwrap_err();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            4,
            "4th failure opened it; the retry was rejected, not sent"
        );
        assert_eq!(channel.breaker_state(), CircuitState::Open);
        let status = tonic::Status::from_error(err);
        assert!(matches!(crate::rejection(&status), Some(Rejection::CircuitOpen { .. })), "{status:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn calls_retries_rejections_and_breaker_transitions_are_exported() {
        // A unique downstream name keeps this test's series apart even in a shared process.
        const NAME: &str = "metrics-test";
        let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder().unwrap();
        let settings = ClientSettings {
            retry: RetrySettings { max_attempts: 3, ..Default::default() },
            breaker: BreakerSettings { sliding_window_size: 4, minimum_calls: 4, ..Default::default() },
            ..Default::default()
        };
        let channel = stack(NAME, &settings, unavailable_transport(Arc::new(AtomicUsize::new(0))));
        let req = || Request::builder().uri("http://x/svc/GetStock").body(Body::empty()).unwrap();
        let _ = channel.clone().oneshot(req()).await;
        let _ = channel.clone().oneshot(req()).await;

        let text = prometheus.render();
        let d = format!("downstream=\"{NAME}\"");
        for series in [
            format!("resilience_calls_total{{{d},outcome=\"unavailable\"}} 1"),
            format!("resilience_calls_total{{{d},outcome=\"circuit_open\"}} 1"),
            format!("resilience_retries_total{{{d}}} 3"),
            format!("resilience_rejections_total{{{d},reason=\"circuit_open\"}} 1"),
            format!("resilience_breaker_transitions_total{{{d},from=\"closed\",to=\"open\"}} 1"),
            format!("resilience_breaker_state{{{d}}} 1"),
            format!("resilience_call_duration_seconds_count{{{d}}} 2"),
        ] {
            assert!(text.contains(&series), "missing {series} in\n{text}");
        }
    }

    type Transport = BoxCloneSyncService<Request<Body>, Response<Body>, BoxError>;

    /// A transport whose every attempt runs `attempt` (after `delay`), counting attempts.
    fn transport(
        calls: Arc<AtomicUsize>,
        delay: Duration,
        attempt: fn() -> Result<Response<Body>, BoxError>,
    ) -> Transport {
        BoxCloneSyncService::new(tower::service_fn(move |_req: Request<Body>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(delay).await;
                attempt()
            }
        }))
    }

    fn refused() -> Result<Response<Body>, BoxError> {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        Err(Box::new(tonic::ConnectError(Box::new(io))))
    }

    fn answered() -> Result<Response<Body>, BoxError> {
        Ok(Response::new(Body::empty()))
    }

    async fn status_of(channel: &ResilientChannel) -> tonic::Status {
        let req = Request::builder().uri("http://x/svc/Charge").body(Body::empty()).unwrap();
        tonic::Status::from_error(channel.clone().oneshot(req).await.unwrap_err())
    }

    #[tokio::test(start_paused = true)]
    async fn refused_connections_are_unavailable_and_never_sent_even_once_the_breaker_opens() {
        let settings = ClientSettings {
            retry: RetrySettings { max_attempts: 3, ..Default::default() },
            breaker: BreakerSettings { sliding_window_size: 4, minimum_calls: 4, ..Default::default() },
            ..Default::default()
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let channel = stack("payment", &settings, transport(Arc::clone(&calls), Duration::ZERO, refused));

        let status = status_of(&channel).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert_eq!(crate::rejection(&status), None);
        assert!(crate::never_sent(&status), "{status:?}");

        // 4th refused attempt opens it; the retry is rejected: still nothing sent.
        let status = status_of(&channel).await;
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert!(matches!(crate::rejection(&status), Some(Rejection::CircuitOpen { .. })), "{status:?}");
        assert!(crate::never_sent(&status), "{status:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_out_attempt_may_have_been_sent_even_if_the_breaker_then_cuts_the_retries() {
        let settings = ClientSettings {
            timeout_ms: 100,
            retry: RetrySettings { max_attempts: 3, ..Default::default() },
            breaker: BreakerSettings { sliding_window_size: 1, minimum_calls: 1, ..Default::default() },
            ..Default::default()
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let slow = transport(Arc::clone(&calls), Duration::from_millis(200), answered);
        let channel = stack("payment", &settings, slow);

        let status = status_of(&channel).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the timeout opened it, the retry was rejected");
        assert!(matches!(crate::rejection(&status), Some(Rejection::CircuitOpen { .. })), "{status:?}");
        assert!(!crate::never_sent(&status), "the timed-out attempt may have reached it: {status:?}");

        let status = status_of(&channel).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(crate::never_sent(&status), "rejected before any attempt: {status:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_and_an_answer_of_the_downstream_may_have_been_sent() {
        let settings = ClientSettings {
            timeout_ms: 100,
            retry: RetrySettings { max_attempts: 2, ..Default::default() },
            ..Default::default()
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let slow = transport(Arc::clone(&calls), Duration::from_millis(200), answered);
        let status = status_of(&stack("payment", &settings, slow)).await;
        assert_eq!(crate::rejection(&status), Some(Rejection::Timeout));
        assert!(!crate::never_sent(&status), "{status:?}");

        let unavailable = stack("payment", &settings, unavailable_transport(Arc::new(AtomicUsize::new(0))));
        let req = Request::builder().uri("http://x/svc/Charge").body(Body::empty()).unwrap();
        let response = unavailable.oneshot(req).await.unwrap();
        let status = tonic::Status::from_header_map(response.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(!crate::never_sent(&status), "{status:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_shed_by_the_bulkhead_was_never_sent() {
        let settings = ClientSettings {
            bulkhead: crate::BulkheadSettings { max_concurrent_calls: 1 },
            ..Default::default()
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let channel =
            stack("payment", &settings, transport(Arc::clone(&calls), Duration::from_secs(1), answered));
        let req = Request::builder().uri("http://x/svc/Charge").body(Body::empty()).unwrap();
        let busy = tokio::spawn(channel.clone().oneshot(req));
        while calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let status = status_of(&channel).await;
        assert_eq!(crate::rejection(&status), Some(Rejection::BulkheadFull));
        assert!(crate::never_sent(&status), "{status:?}");
        assert!(busy.await.unwrap().is_ok());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn invalid_settings_and_urls_are_typed_errors() {
        let bad = ClientSettings { timeout_ms: 0, ..Default::default() };
        assert!(matches!(
            channel("inventory", &bad, None),
            Err(ResilienceError::InvalidSetting { key: "timeout_ms", .. })
        ));
        let bad = ClientSettings::with_url("not a url");
        assert!(matches!(channel("inventory", &bad, None), Err(ResilienceError::InvalidUrl { .. })));
        // Without TLS an https URL, with TLS an http one, would not be what the operator meant.
        let https = ClientSettings::with_url("https://127.0.0.1:7082");
        let err = channel("inventory", &https, None).unwrap_err();
        assert!(err.to_string().contains("must start with http://"), "{err}");
    }

    #[test]
    fn every_counter_series_exists_at_zero_before_the_first_call() {
        // A local recorder: only this test's series, whatever else runs in the process.
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let prometheus = recorder.handle();
        let channel = metrics::with_local_recorder(&recorder, || {
            stack(
                "zero-test",
                &ClientSettings::default(),
                unavailable_transport(Arc::new(AtomicUsize::new(0))),
            )
        });
        assert_eq!(channel.downstream(), "zero-test");
        let text = prometheus.render();
        let d = "downstream=\"zero-test\"";
        let mut series = vec![
            format!("resilience_retries_total{{{d}}} 0"),
            format!("resilience_retry_budget_exhausted_total{{{d}}} 0"),
            format!("resilience_breaker_transitions_total{{{d},from=\"closed\",to=\"open\"}} 0"),
            format!("resilience_breaker_state{{{d}}} 0"),
        ];
        series.extend(
            crate::rejection::REASONS
                .map(|reason| format!("resilience_rejections_total{{{d},reason=\"{reason}\"}} 0")),
        );
        for series in series {
            assert!(text.contains(&series), "missing {series} in\n{text}");
        }
    }
}
