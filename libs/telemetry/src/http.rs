//! A tower layer that traces incoming HTTP requests (the axum gateway).
//!
//! ```ignore
//! let app = Router::new()
//!     .route("/orders/{id}", get(get_order))
//!     .layer(sagaworks_telemetry::http::ServerTraceLayer::new("gateway"));
//! ```
//!
//! Each request gets a server span that continues the caller's W3C `traceparent` (or
//! starts a trace), named `{method} {http.route}` with `http.request.method`,
//! `url.path`, `http.route` and `http.response.status_code`; 5xx responses and
//! service errors mark it as an error. Added with `Router::layer`, the layer sees
//! axum's [`MatchedPath`]; wrapped around the whole router (no matched path yet) the
//! span is named by the method alone, as the conventions ask for.
//!
//! Each request is also counted in the histogram [`HTTP_SERVER_DURATION`] (RED: rate,
//! errors, duration), labelled `service`, `method`, `route` (the matched template,
//! never the raw path, so ids do not explode the series; `unmatched` for a request no
//! route took) and `status`.

use crate::propagation::{self, HeaderExtractor};
use axum::extract::MatchedPath;
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

/// Traces every request passing through it.
#[derive(Debug, Clone, Copy)]
pub struct ServerTraceLayer {
    service: &'static str,
}

impl ServerTraceLayer {
    /// For the requests `service` serves (the `service` label of [`HTTP_SERVER_DURATION`]).
    pub fn new(service: &'static str) -> Self {
        Self { service }
    }
}

impl<S> Layer<S> for ServerTraceLayer {
    type Service = ServerTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerTrace { inner, service: self.service }
    }
}

/// The service made by [`ServerTraceLayer`].
#[derive(Debug, Clone)]
pub struct ServerTrace<S> {
    inner: S,
    service: &'static str,
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
        let _ = span.set_parent(propagation::extract(&HeaderExtractor(request.headers())));
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
pub fn method_label(method: &http::Method) -> &'static str {
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
