//! A tower layer that traces incoming HTTP requests (the axum gateway).
//!
//! ```ignore
//! let app = Router::new()
//!     .route("/orders/{id}", get(get_order))
//!     .layer(sagaworks_telemetry::http::ServerTraceLayer::new("gateway", CallerTrace::Link));
//! ```
//!
//! Each request gets a server span named `{method} {http.route}` with `http.request.method`,
//! `url.path`, `http.route` and `http.response.status_code`; 5xx responses and
//! service errors mark it as an error. Added with `Router::layer`, the layer sees
//! axum's [`MatchedPath`]; wrapped around the whole router (no matched path yet) the
//! span is named by the method alone, as the conventions ask for.
//!
//! What the span makes of the caller's W3C `traceparent`/`tracestate` is the layer's
//! [`CallerTrace`]: a caller inside the system is continued, a public client is only
//! linked to, so it chooses neither the trace id nor the sampling decision.
//!
//! Each request is also counted in the histogram [`HTTP_SERVER_DURATION`] (RED: rate,
//! errors, duration), labelled `service`, `method`, `route` (the matched template,
//! never the raw path, so ids do not explode the series; `unmatched` for a request no
//! route took) and `status`.

use crate::propagation::{self, HeaderExtractor};
use axum::extract::MatchedPath;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use pin_project_lite::pin_project;
use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;
use tower::{Layer, Service};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Histogram: seconds per request, until its response head.
pub const HTTP_SERVER_DURATION: &str = "http_server_request_duration_seconds";

/// What a request's server span makes of the W3C context (`traceparent`,
/// `tracestate`) its caller sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerTrace {
    /// The span is the child of the caller's span: the request is part of the caller's
    /// trace and follows its sampling decision. For callers inside the system.
    Continue,
    /// The span is the root of a trace of its own (a new trace id, sampled as the
    /// configured sampler decides for a root) and carries a span link to the caller's
    /// span, when the caller sent a valid context. For the public edge: a client picks
    /// neither the trace id stored with what it creates nor whether it is sampled.
    Link,
}

/// Traces every request passing through it.
#[derive(Debug, Clone, Copy)]
pub struct ServerTraceLayer {
    service: &'static str,
    caller: CallerTrace,
}

impl ServerTraceLayer {
    /// For the requests `service` serves (the `service` label of [`HTTP_SERVER_DURATION`]),
    /// treating the caller's trace context as `caller` says.
    pub fn new(service: &'static str, caller: CallerTrace) -> Self {
        Self { service, caller }
    }
}

impl<S> Layer<S> for ServerTraceLayer {
    type Service = ServerTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerTrace { inner, service: self.service, caller: self.caller }
    }
}

/// The service made by [`ServerTraceLayer`].
#[derive(Debug, Clone)]
pub struct ServerTrace<S> {
    inner: S,
    service: &'static str,
    caller: CallerTrace,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for ServerTrace<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Error: Display,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let span = request_span(&request);
        adopt_caller_context(&span, self.caller, request.headers());
        let labels = Labels {
            service: self.service,
            method: method_label(request.method()),
            route: request.extensions().get::<MatchedPath>().map(|r| r.as_str().to_owned()),
            started: Instant::now(),
        };
        let inner = span.in_scope(|| self.inner.call(request));
        ResponseFuture { inner, span, labels: Some(labels) }
    }
}

/// What a request's duration is recorded under.
struct Labels {
    service: &'static str,
    method: &'static str,
    route: Option<String>,
    started: Instant,
}

impl Labels {
    fn record(self, status: String) {
        let route = self.route.unwrap_or_else(|| "unmatched".to_owned());
        metrics::histogram!(HTTP_SERVER_DURATION, "service" => self.service,
            "method" => self.method, "route" => route, "status" => status)
        .record(self.started.elapsed().as_secs_f64());
    }
}

/// The request method as a label or attribute value: one of the methods of RFC 9110 and
/// PATCH, or `_OTHER` (OpenTelemetry's semantic conventions). The method is the client's
/// choice and arrives before authentication: taken as it is, every invented method
/// would make new metric series, without bound.
pub(crate) fn method_label(method: &http::Method) -> &'static str {
    use http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => "_OTHER",
    }
}

/// Places `span` in the caller's trace, or at the root of a new one linked to it, as
/// `caller` says. Without a valid `traceparent` the span starts a new trace, with no
/// link. Call it before `span` is first entered.
fn adopt_caller_context(span: &Span, caller: CallerTrace, headers: &http::HeaderMap) {
    match caller {
        CallerTrace::Continue => {
            let _ = span.set_parent(propagation::extract(&HeaderExtractor(headers)));
        }
        CallerTrace::Link => {
            // An empty parent: never the caller's trace, nor an ambient one.
            let _ = span.set_parent(opentelemetry::Context::new());
            if let Some(linked) = linked_context(headers) {
                span.add_link(linked);
            }
        }
    }
}

/// The span context a public client sent, when its `traceparent` is well-formed
/// to the letter ([`propagation::is_well_formed_traceparent`]).
fn linked_context(headers: &http::HeaderMap) -> Option<SpanContext> {
    let traceparent = headers.get(propagation::TRACEPARENT)?.to_str().ok()?;
    if !propagation::is_well_formed_traceparent(traceparent) {
        return None;
    }
    let remote = propagation::extract(&HeaderExtractor(headers));
    let linked = remote.span().span_context().clone();
    linked.is_valid().then_some(linked)
}

fn request_span<B>(request: &http::Request<B>) -> Span {
    let method = method_label(request.method());
    let route = request.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
    // An unknown method names the span `HTTP` (the conventions' choice for `_OTHER`).
    let verb = if method == "_OTHER" { "HTTP" } else { method };
    let name = match route {
        Some(route) => format!("{verb} {route}"),
        None => verb.to_owned(),
    };
    let span = tracing::info_span!(
        "http.server",
        otel.name = %name,
        otel.kind = "server",
        http.request.method = %method,
        url.path = %request.uri().path(),
        http.route = Empty,
        http.request.header.x_request_id = Empty,
        http.response.status_code = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    );
    if let Some(route) = route {
        span.record("http.route", route);
    }
    if let Some(id) = request.headers().get("x-request-id").and_then(|v| v.to_str().ok()) {
        span.record("http.request.header.x_request_id", id);
    }
    span
}

pin_project! {
    /// The response future of [`ServerTrace`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        span: Span,
        labels: Option<Labels>,
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    E: Display,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = {
            let _entered = this.span.enter();
            ready!(this.inner.poll(cx))
        };
        let labels = this.labels.take();
        match &result {
            Ok(response) => {
                let status = response.status();
                this.span.record("http.response.status_code", status.as_u16());
                if status.is_server_error() {
                    this.span.record("otel.status_code", "ERROR");
                }
                if let Some(labels) = labels {
                    labels.record(status.as_u16().to_string());
                }
            }
            Err(error) => {
                this.span.record("otel.status_code", "ERROR");
                this.span.record("otel.status_description", error.to_string());
                if let Some(labels) = labels {
                    labels.record("error".to_owned());
                }
            }
        }
        Poll::Ready(result)
    }
}

#[cfg(test)]
mod tests {
    use super::method_label;
    use http::Method;

    #[test]
    fn known_methods_are_their_own_label_and_any_other_is_other() {
        for (method, label) in [(Method::GET, "GET"), (Method::POST, "POST"), (Method::PATCH, "PATCH")] {
            assert_eq!(method_label(&method), label);
        }
        for invented in ["FOO", "PROPFIND", "get"] {
            assert_eq!(
                method_label(&Method::from_bytes(invented.as_bytes()).unwrap()),
                "_OTHER",
                "{invented}"
            );
        }
    }
}
