//! An in-process OTLP/gRPC trace collector, so tests can assert on the spans a
//! service really exported.
//!
//! ```ignore
//! let receiver = OtlpReceiver::start().await;
//! let settings = TelemetrySettings { otlp_endpoint: receiver.endpoint(), ..Default::default() };
//! let guard = sagaworks_telemetry::init("svc", "0.0.0", &settings)?;
//! // ... exercise the code ...
//! guard.shutdown().await?; // flush
//! let spans = receiver.wait_for("the server span", Duration::from_secs(5), |s| s.iter().any(|s| s.name == "x")).await;
//! ```

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{span, status};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The kind of a received span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Unspecified,
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

/// The status code of a received span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusCode {
    Unset,
    Ok,
    Error,
}

/// A link from a received span to another span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedLink {
    pub trace_id: String,
    pub span_id: String,
}

/// One exported span, flattened with its resource's `service.name`. Ids are lower-case hex.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    pub kind: SpanKind,
    pub service_name: String,
    /// All resource attributes (`service.name`, `service.version`, ...).
    pub resource: BTreeMap<String, String>,
    /// Attribute values rendered as text (`42`, `true`, `grpc`).
    pub attributes: BTreeMap<String, String>,
    pub status: StatusCode,
    pub status_message: String,
    pub links: Vec<ReceivedLink>,
}

impl ReceivedSpan {
    /// The attribute `key`, if present.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// The collector; stops serving when dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    stop: Option<oneshot::Sender<()>>,
}

impl OtlpReceiver {
    /// Serves the OTLP trace service on `127.0.0.1` on a free port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the OTLP receiver");
        let addr = listener.local_addr().expect("OTLP receiver address");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = oneshot::channel::<()>();
        let service = TraceServiceServer::new(Collector { spans: spans.clone() });
        tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                )
                .await;
            if let Err(error) = served {
                eprintln!("OTLP receiver on {addr} failed: {error}");
            }
        });
        Self { addr, spans, stop: Some(stop) }
    }

    /// `http://127.0.0.1:PORT`, for `telemetry.otlp_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until `predicate` holds for the received spans and returns them; panics
    /// naming `what` (and listing what did arrive) after `timeout`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        predicate: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let start = Instant::now();
        loop {
            let spans = self.spans();
            if predicate(&spans) {
                return spans;
            }
            if start.elapsed() > timeout {
                let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
                panic!("timed out after {timeout:?} waiting for {what}; received spans: {names:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

struct Collector {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
            let service_name = resource.get("service.name").cloned().unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                let status = span.status.unwrap_or_default();
                received.push(ReceivedSpan {
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    name: span.name,
                    kind: kind(span.kind),
                    service_name: service_name.clone(),
                    resource: resource.clone(),
                    attributes: attributes(&span.attributes),
                    status: match status::StatusCode::try_from(status.code) {
                        Ok(status::StatusCode::Ok) => StatusCode::Ok,
                        Ok(status::StatusCode::Error) => StatusCode::Error,
                        _ => StatusCode::Unset,
                    },
                    status_message: status.message,
                    links: span
                        .links
                        .iter()
                        .map(|l| ReceivedLink {
                            trace_id: hex::encode(&l.trace_id),
                            span_id: hex::encode(&l.span_id),
                        })
                        .collect(),
                });
            }
        }
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn kind(value: i32) -> SpanKind {
    match span::SpanKind::try_from(value) {
        Ok(span::SpanKind::Internal) => SpanKind::Internal,
        Ok(span::SpanKind::Server) => SpanKind::Server,
        Ok(span::SpanKind::Client) => SpanKind::Client,
        Ok(span::SpanKind::Producer) => SpanKind::Producer,
        Ok(span::SpanKind::Consumer) => SpanKind::Consumer,
        _ => SpanKind::Unspecified,
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), kv.value.as_ref().map(text).unwrap_or_default())).collect()
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BytesValue(b)) => hex::encode(b),
        Some(any_value::Value::ArrayValue(a)) => {
            format!("[{}]", a.values.iter().map(text).collect::<Vec<_>>().join(","))
        }
        Some(any_value::Value::KvlistValue(kv)) => format!("{:?}", attributes(&kv.values)),
        // An index into a string table: the profiles signal's, never in a trace export.
        Some(any_value::Value::StringValueStrindex(i)) => format!("<string #{i}>"),
        None => String::new(),
    }
}
