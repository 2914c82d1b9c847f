//! The standard `OTEL_*` variables win over what the service passes to `init`.
//! Environment variables are process-global: this file holds one test only.

use sagaworks_config::TelemetrySettings;
use sagaworks_telemetry::propagation::current_trace_id;
use sagaworks_test_support::otlp::OtlpReceiver;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_env_vars_override_endpoint_and_service_name() {
    let receiver = OtlpReceiver::start().await;
    // SAFETY: the only test in this process, set before any thread reads the environment.
    unsafe {
        std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint());
        std::env::set_var("OTEL_SERVICE_NAME", "renamed");
        std::env::set_var(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment.name=test,service.name=ignored",
        );
    }
    // No endpoint in the settings: the env var alone enables export.
    let settings = TelemetrySettings { otlp_endpoint: String::new(), ..Default::default() };
    let guard = sagaworks_telemetry::init("configured", "0.1.0", &settings).expect("init");
    tracing::info_span!("work").in_scope(|| assert!(current_trace_id().is_some()));
    guard.shutdown().await.expect("flush");

    let spans = receiver.wait_for("the span", Duration::from_secs(10), |s| !s.is_empty()).await;
    assert_eq!(spans[0].name, "work");
    assert_eq!(spans[0].service_name, "renamed", "OTEL_SERVICE_NAME beats everything");
    assert_eq!(spans[0].resource.get("deployment.environment.name").map(String::as_str), Some("test"));
    assert_eq!(spans[0].resource.get("service.version").map(String::as_str), Some("0.1.0"));
}
