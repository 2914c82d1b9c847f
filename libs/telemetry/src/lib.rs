//! Tracing, OpenTelemetry export and W3C trace-context propagation for sagaworks services.
//!
//! # Use in a service
//!
//! ```ignore
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     let settings: Settings = sagaworks_config::load()?;
//!     // 1. Install logging + tracing; keep the guard alive for the whole of `main`.
//!     let telemetry = sagaworks_telemetry::init("inventory", env!("CARGO_PKG_VERSION"), &settings.telemetry)?;
//!     // 2. Server side: every incoming call gets a server span continuing the caller's trace.
//!     let server = tonic::transport::Server::builder()
//!         .layer(sagaworks_telemetry::grpc::ServerTraceLayer::new("inventory"));
//!     // 3. Client side: wrap the channel so outgoing calls carry `traceparent`.
//!     let channel = tower::Layer::layer(&sagaworks_telemetry::grpc::ClientTraceLayer::new("order"), channel);
//!     let payments = PaymentServiceClient::new(channel);
//!     // 4. HTTP (gateway, the public edge): a new trace per request, linked to the client's.
//!     //    `Router::new().route(..).layer(http::ServerTraceLayer::new("gateway", http::CallerTrace::Link))`.
//!     // ... serve until the shutdown token fires ...
//!     telemetry.shutdown().await?; // 5. flush the last spans (dropping the guard also flushes)
//!     Ok(())
//! }
//! ```
//!
//! * [`init`] installs the global `tracing` subscriber: an `EnvFilter`ed log layer
//!   (JSON lines or text, each line carrying `trace_id`/`span_id`) and the
//!   `tracing-opentelemetry` layer; spans are exported over OTLP/gRPC when an endpoint
//!   is configured. It also installs the W3C TraceContext propagator globally.
//! * [`propagation`] — the current `traceparent`, inject/extract over any carrier, and
//!   byte-valued header pairs for Kafka.
//! * [`grpc`] — tower layers for tonic clients and servers.
//! * [`http`] — a tower layer for the axum gateway: continues the caller's trace, or
//!   (the public edge) starts one of its own linked to the caller's.
//! * [`messaging`] — producer/consumer spans for the outbox relay and Kafka consumers.
//!
//! # Semantic conventions
//!
//! Spans follow the OpenTelemetry semantic conventions (v1.37): gRPC spans are named
//! `{rpc.service}/{rpc.method}` with `rpc.system = "grpc"` and `rpc.grpc.status_code`;
//! a client span is an error for every non-`OK` status, a server span only for
//! `UNKNOWN`, `DEADLINE_EXCEEDED`, `UNIMPLEMENTED`, `INTERNAL`, `UNAVAILABLE` and
//! `DATA_LOSS` (the other codes are the caller's fault). HTTP server spans are named
//! `{method} {http.route}` and are errors for 5xx only. Kafka spans are `send {topic}`
//! (kind producer, child of the context stored in the outbox row) and
//! `process {topic}` (kind consumer, a new trace *linked* to the producer span).
//! The `tracing` span names (`grpc.client`, `http.server`, ...) are only used by the
//! log output; exporters see the `otel.name` given here.

pub mod grpc;
pub mod http;
mod logs;
pub mod messaging;
pub mod propagation;
mod setup;

pub use setup::{TelemetryError, TelemetryGuard, init};
