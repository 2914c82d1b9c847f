//! Tower layers that trace tonic calls and carry the W3C context in gRPC metadata.
//!
//! ```ignore
//! // server: a span per incoming call, continuing the caller's trace
//! Server::builder().layer(ServerTraceLayer::new("inventory")).add_service(svc).serve(addr).await?;
//! // client: a span per outgoing call; `traceparent` goes out as metadata
//! let client = InventoryServiceClient::new(ClientTraceLayer::new("order").layer(channel));
//! ```
//!
//! Both spans are named `{rpc.service}/{rpc.method}` and carry `rpc.system`,
//! `rpc.service`, `rpc.method` and `rpc.grpc.status_code`. The status comes from the
//! `grpc-status` response header (trailers-only responses, i.e. most errors) or else
//! from the trailers at the end of the body; the span stays open until then, so its
//! duration covers the whole call. A client span is an error for any status but `OK`;
//! a server span only for the server-fault codes (see the crate docs).
//!
//! Each call is also counted in a duration histogram (RED: rate, errors, duration),
//! [`RPC_SERVER_DURATION`] or [`RPC_CLIENT_DURATION`], labelled `service` (the process
//! recording it, given to [`ServerTraceLayer::new`] / [`ClientTraceLayer::new`]),
//! `rpc_service`, `rpc_method` and `code` (the gRPC status name, e.g. `OK`,
//! `UNAVAILABLE`; `UNKNOWN` when the response carried none).
//!
//! Responses come back with a [`tonic::body::Body`], whatever the inner body was.

use crate::propagation::{self, HeaderExtractor, HeaderInjector};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;
use tonic::Code;
use tonic::body::Body;
use tower::{BoxError, Layer, Service};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Histogram: seconds per incoming call, to the end of its response.
pub const RPC_SERVER_DURATION: &str = "rpc_server_duration_seconds";
/// Histogram: seconds per outgoing call, to the end of its response.
pub const RPC_CLIENT_DURATION: &str = "rpc_client_duration_seconds";

/// Which end of the call a span describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

impl Side {
    /// Whether `code` makes the span an error, per the RPC semantic conventions.
    fn is_error(self, code: Code) -> bool {
        match self {
            Side::Client => code != Code::Ok,
            Side::Server => matches!(
                code,
                Code::Unknown
                    | Code::DeadlineExceeded
                    | Code::Unimplemented
                    | Code::Internal
                    | Code::Unavailable
                    | Code::DataLoss
            ),
        }
    }
}

/// Traces outgoing calls: wrap a tonic `Channel` (or any service stack) with it.
#[derive(Debug, Clone, Copy)]
pub struct ClientTraceLayer {
    service: &'static str,
}

impl ClientTraceLayer {
    /// For calls made by `service` (the `service` label of [`RPC_CLIENT_DURATION`]).
    pub fn new(service: &'static str) -> Self {
        Self { service }
    }
}

impl<S> Layer<S> for ClientTraceLayer {
    type Service = ClientTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientTrace { inner, service: self.service }
    }
}

/// The service made by [`ClientTraceLayer`].
#[derive(Debug, Clone)]
pub struct ClientTrace<S> {
    inner: S,
    service: &'static str,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for ClientTrace<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Error: Display,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let call = Call::start(Side::Client, self.service, request.uri());
        propagation::inject_context(&call.span.context(), &mut HeaderInjector(request.headers_mut()));
        let inner = call.span.in_scope(|| self.inner.call(request));
        ResponseFuture { inner, call: Some(call) }
    }
}

/// Traces incoming calls: `tonic::transport::Server::builder().layer(ServerTraceLayer::new("order"))`.
#[derive(Debug, Clone, Copy)]
pub struct ServerTraceLayer {
    service: &'static str,
}

impl ServerTraceLayer {
    /// For the calls `service` serves (the `service` label of [`RPC_SERVER_DURATION`]).
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
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let call = Call::start(Side::Server, self.service, request.uri());
        // The caller's context, or an empty one: a server span never joins an ambient trace.
        let _ = call.span.set_parent(propagation::extract(&HeaderExtractor(request.headers())));
        let inner = call.span.in_scope(|| self.inner.call(request));
        ResponseFuture { inner, call: Some(call) }
    }
}

/// `/package.Service/Method` into its service and method (the whole path as the method otherwise).
fn service_and_method(path: &str) -> (&str, &str) {
    path.trim_start_matches('/').split_once('/').unwrap_or(("", path))
}

fn rpc_span(side: Side, uri: &http::Uri) -> Span {
    let (service, method) = service_and_method(uri.path());
    let name = format!("{service}/{method}");
    let span = match side {
        Side::Client => tracing::info_span!(
            "grpc.client",
            otel.name = %name,
            otel.kind = "client",
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %method,
            server.address = Empty,
            server.port = Empty,
            rpc.grpc.status_code = Empty,
            otel.status_code = Empty,
            otel.status_description = Empty,
        ),
        Side::Server => tracing::info_span!(
            "grpc.server",
            otel.name = %name,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %method,
            rpc.grpc.status_code = Empty,
            otel.status_code = Empty,
            otel.status_description = Empty,
        ),
    };
    if side == Side::Client {
        if let Some(host) = uri.host() {
            span.record("server.address", host);
        }
        if let Some(port) = uri.port_u16() {
            span.record("server.port", port);
        }
    }
    span
}

/// One call in flight: its span and what its duration is recorded under. A call
/// dropped before it finished (the caller gave up: a timeout, a cancelled request)
/// is recorded as `CANCELLED`.
struct Call {
    span: Span,
    side: Side,
    service: &'static str,
    rpc_service: String,
    rpc_method: String,
    started: Instant,
    finished: bool,
}

/// How a call ended.
enum Ended<'a> {
    Status(Code),
    /// No gRPC status (a transport failure, an HTTP error, a broken body).
    Failed(&'a str),
}

impl Call {
    fn start(side: Side, service: &'static str, uri: &http::Uri) -> Self {
        let (rpc_service, rpc_method) = service_and_method(uri.path());
        Self {
            span: rpc_span(side, uri),
            side,
            service,
            rpc_service: rpc_service.to_owned(),
            rpc_method: rpc_method.to_owned(),
            started: Instant::now(),
            finished: false,
        }
    }

    /// Records the outcome on the span and the call in its histogram (once).
    fn finish(&mut self, ended: Ended<'_>) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let code = match ended {
            Ended::Status(code) => {
                self.span.record("rpc.grpc.status_code", code as i64);
                if self.side.is_error(code) {
                    record_error(&self.span, code.description());
                }
                code_name(code)
            }
            Ended::Failed(description) => {
                record_error(&self.span, description);
                "UNKNOWN"
            }
        };
        let name = match self.side {
            Side::Server => RPC_SERVER_DURATION,
            Side::Client => RPC_CLIENT_DURATION,
        };
        metrics::histogram!(name, "service" => self.service, "rpc_service" => std::mem::take(&mut self.rpc_service),
            "rpc_method" => std::mem::take(&mut self.rpc_method), "code" => code)
        .record(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Call {
    /// A no-op when the call finished; else it was given up on.
    fn drop(&mut self) {
        self.finish(Ended::Status(Code::Cancelled));
    }
}

fn record_error(span: &Span, description: &str) {
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", description);
}

/// The status code as the gRPC spec names it (`OK`, `UNAVAILABLE`, ...).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    Some(Code::from_i32(value.trim().parse().ok()?))
}

pin_project! {
    /// The response future of [`ClientTrace`] and [`ServerTrace`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        // `None` once the response is out (the body finishes the call).
        call: Option<Call>,
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    E: Display,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Output = Result<http::Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = {
            let _entered = this.call.as_ref().map(|call| call.span.enter());
            ready!(this.inner.poll(cx))
        };
        let mut call = this.call.take().expect("ResponseFuture polled after completion");
        Poll::Ready(match result {
            Ok(response) => {
                let (parts, body) = response.into_parts();
                let body = if let Some(code) = grpc_status(&parts.headers) {
                    call.finish(Ended::Status(code));
                    Body::new(body)
                } else if !parts.status.is_success() {
                    call.finish(Ended::Failed(&format!("HTTP status {}", parts.status)));
                    Body::new(body)
                } else {
                    // The status comes in the trailers: keep the call open until then.
                    Body::new(TracedBody { inner: body, call: Some(call) })
                };
                Ok(http::Response::from_parts(parts, body))
            }
            Err(error) => {
                call.finish(Ended::Failed(&error.to_string()));
                Err(error)
            }
        })
    }
}

pin_project! {
    /// A response body that records the `grpc-status` trailer on its span and closes
    /// the span at the end of the stream.
    struct TracedBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }
}

impl<B> HttpBody for TracedBody<B>
where
    B: HttpBody<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref()
                    && let Some(mut call) = this.call.take()
                {
                    match grpc_status(trailers) {
                        Some(code) => call.finish(Ended::Status(code)),
                        None => call.finish(Ended::Failed("response ended without grpc-status")),
                    }
                }
            }
            Some(Err(_)) => {
                if let Some(mut call) = this.call.take() {
                    call.finish(Ended::Failed("response body failed"));
                }
            }
            None => {
                if let Some(mut call) = this.call.take() {
                    call.finish(Ended::Failed("response ended without grpc-status"));
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_splits_into_service_and_method() {
        assert_eq!(
            service_and_method("/sagaworks.inventory.v1.InventoryService/GetStock"),
            ("sagaworks.inventory.v1.InventoryService", "GetStock")
        );
        assert_eq!(service_and_method("/health"), ("", "/health"));
    }

    #[test]
    fn server_spans_are_errors_only_for_server_faults() {
        assert!(Side::Client.is_error(Code::NotFound));
        assert!(!Side::Client.is_error(Code::Ok));
        assert!(!Side::Server.is_error(Code::NotFound));
        assert!(!Side::Server.is_error(Code::FailedPrecondition));
        assert!(Side::Server.is_error(Code::Internal));
        assert!(Side::Server.is_error(Code::Unavailable));
    }

    #[test]
    fn grpc_status_header_is_parsed() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(grpc_status(&headers), None);
        headers.insert("grpc-status", "5".parse().unwrap());
        assert_eq!(grpc_status(&headers), Some(Code::NotFound));
        headers.insert("grpc-status", "x".parse().unwrap());
        assert_eq!(grpc_status(&headers), None);
    }
}
