//! [`init`]: the global subscriber, the tracer provider and the propagator.

use crate::logs::{self, LogStyle};
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource::{EnvResourceDetector, TelemetryResourceDetector};
use opentelemetry_sdk::trace::SdkTracerProvider;
use sagaworks_config::TelemetrySettings;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Name of the instrumentation scope of every span created through this crate.
const SCOPE: &str = "sagaworks-telemetry";

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A global subscriber was already installed (by an earlier `init` or anyone else).
    #[error("a global tracing subscriber is already installed")]
    AlreadyInitialized,
    #[error("invalid log filter {directive:?}: {source}")]
    InvalidFilter {
        directive: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("cannot build the OTLP span exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("flushing spans on shutdown failed: {0}")]
    Shutdown(#[from] opentelemetry_sdk::error::OTelSdkError),
    #[error("the shutdown task failed: {0}")]
    ShutdownTask(#[from] tokio::task::JoinError),
}

/// Keeps the tracer provider alive; flushes and shuts it down on [`shutdown`](Self::shutdown)
/// or drop so the last spans reach the collector.
#[derive(Debug)]
#[must_use = "dropping the guard shuts span export down"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Flushes the pending spans and stops the exporter.
    ///
    /// Runs the (blocking) shutdown on tokio's blocking pool, so this works on any
    /// runtime flavour. Dropping the guard does the same synchronously, which needs a
    /// multi-threaded runtime (or none) because the exporter's gRPC connection is
    /// driven by the runtime.
    pub async fn shutdown(mut self) -> Result<(), TelemetryError> {
        match self.provider.take() {
            Some(provider) => Ok(tokio::task::spawn_blocking(move || provider.shutdown()).await??),
            None => Ok(()),
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            eprintln!("sagaworks-telemetry: flushing spans on shutdown failed: {error}");
        }
    }
}

/// Installs logging and tracing for the whole process.
///
/// * `service_name`: `service.name` of the resource unless `OTEL_SERVICE_NAME` (or
///   `service.name` in `OTEL_RESOURCE_ATTRIBUTES`) says otherwise.
/// * `version`: `service.version`; pass `env!("CARGO_PKG_VERSION")` of the service.
/// * Log filter: `RUST_LOG` when set, else `settings.log_level`. The filter applies to
///   log lines; spans of level `INFO` and above are always traced.
/// * Log format: `settings.log_format` `"json"` (one object per line), `"pretty"`, or
///   anything else for compact text. Lines inside a span carry `trace_id` and `span_id`.
/// * Export: OTLP/gRPC batch export to `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
///   `OTEL_EXPORTER_OTLP_ENDPOINT`, else `settings.otlp_endpoint`; empty = no export
///   (spans still get ids, so logs and `traceparent` propagation keep working). The
///   SDK reads the other `OTEL_*` variables itself (`OTEL_TRACES_SAMPLER[_ARG]`,
///   `OTEL_BSP_*`, `OTEL_SPAN_*_LIMIT`, `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT|HEADERS|COMPRESSION`).
/// * Span attributes: each span's fields and its code location; not its busy/idle
///   time or thread (see the layer's settings below).
///
/// Must be called inside a tokio runtime when export is enabled. A second call (or a
/// call after someone else installed a subscriber) returns
/// [`TelemetryError::AlreadyInitialized`] and changes nothing.
pub fn init(
    service_name: &'static str,
    version: &'static str,
    settings: &TelemetrySettings,
) -> Result<TelemetryGuard, TelemetryError> {
    let filter = log_filter(settings)?;
    let provider = tracer_provider(service_name, version, &otlp_endpoint(settings))?;
    // Not recorded: busy/idle time (two clock reads on every poll of every
    // instrumented future) and the creating thread (meaningless for a task
    // that moves between worker threads); both cost CPU on every span.
    let otel_layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(SCOPE))
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_filter(LevelFilter::INFO);

    let log_layer = logs::layer(LogStyle::from_setting(&settings.log_format), std::io::stdout);

    let installed =
        tracing_subscriber::registry().with(otel_layer).with(log_layer.with_filter(filter)).try_init();
    if installed.is_err() {
        // Nothing of ours is global yet: stop the unused provider and leave the process as it was.
        let _ = provider.shutdown();
        return Err(TelemetryError::AlreadyInitialized);
    }
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(TelemetryGuard { provider: Some(provider) })
}

fn log_filter(settings: &TelemetrySettings) -> Result<EnvFilter, TelemetryError> {
    let directive = std::env::var(EnvFilter::DEFAULT_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| settings.log_level.clone());
    EnvFilter::try_new(&directive).map_err(|source| TelemetryError::InvalidFilter { directive, source })
}

/// The OTLP endpoint by the precedence of the OTel spec: signal-specific env, generic env, config.
fn otlp_endpoint(settings: &TelemetrySettings) -> String {
    ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| settings.otlp_endpoint.clone())
        .trim()
        .to_owned()
}

fn tracer_provider(
    service_name: &'static str,
    version: &'static str,
    endpoint: &str,
) -> Result<SdkTracerProvider, TelemetryError> {
    let mut builder = SdkTracerProvider::builder().with_resource(resource(service_name, version));
    if !endpoint.is_empty() {
        let exporter =
            opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(endpoint).build()?;
        builder = builder.with_batch_exporter(exporter);
    }
    Ok(builder.build())
}

/// Our name and version first, then what the environment says on top (`OTEL_RESOURCE_ATTRIBUTES`,
/// then `OTEL_SERVICE_NAME`, which wins over everything).
fn resource(service_name: &'static str, version: &'static str) -> Resource {
    let mut builder = Resource::builder_empty()
        .with_service_name(service_name)
        .with_attribute(KeyValue::new("service.version", version))
        .with_detectors(&[Box::new(TelemetryResourceDetector), Box::new(EnvResourceDetector::new())]);
    if let Some(name) = std::env::var("OTEL_SERVICE_NAME").ok().filter(|v| !v.trim().is_empty()) {
        builder = builder.with_service_name(name);
    }
    builder.build()
}
