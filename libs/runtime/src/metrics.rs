//! The process-wide Prometheus recorder behind the `metrics` facade.
//!
//! Every crate records with `metrics::counter!`/`gauge!`/`histogram!`; the
//! `/metrics` route renders them in the Prometheus text format. Metric names
//! carry a `service` label where several services may share a process (tests).

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Latency buckets in seconds: 1 ms .. 30 s.
const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Installs the recorder once per process and returns its handle.
pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
            .expect("static buckets are valid")
            .install_recorder()
            .expect("no other metrics recorder is installed")
    })
}

/// Renders every metric in the Prometheus text exposition format.
pub fn render() -> String {
    handle().render()
}
