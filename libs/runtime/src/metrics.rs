//! The Prometheus recorder behind the `metrics` facade.
//!
//! Every crate records with `metrics::counter!`/`gauge!`/`histogram!`; the
//! `/metrics` route renders them in the Prometheus text format.
//!
//! A service process has one recorder, installed globally by [`handle`]. Where
//! several services share a process (the in-process tests), each service's
//! runtime gets a recorder of its own with [`isolate`], so a service's
//! `/metrics` shows its own series and nothing another service recorded.
//! Metrics still carry a `service` label, so series stay apart wherever they
//! are merged (a Prometheus federation, a dashboard across services).

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::cell::Cell;
use std::sync::OnceLock;

static GLOBAL: OnceLock<PrometheusHandle> = OnceLock::new();

thread_local! {
    /// The handle of the recorder that [`isolate`] gave this thread's runtime.
    static ISOLATED: Cell<Option<&'static PrometheusHandle>> = const { Cell::new(None) };
}

/// Latency buckets in seconds: 1 ms .. 30 s.
const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

fn recorder() -> PrometheusRecorder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
        .expect("static buckets are valid")
        .build_recorder()
}

/// The handle of the recorder this thread records to: its runtime's own (see
/// [`isolate`]) or else the process-wide one, installed on first use.
pub fn handle() -> &'static PrometheusHandle {
    ISOLATED.get().unwrap_or_else(|| {
        GLOBAL.get_or_init(|| {
            let recorder = recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).expect("no other metrics recorder is installed");
            handle
        })
    })
}

/// Renders every metric of this thread's recorder in the Prometheus text
/// exposition format.
pub fn render() -> String {
    handle().render()
}

/// Gives the runtime that `builder` builds a recorder of its own: every thread
/// it starts (workers and blocking threads) records to it, and [`render`] on
/// those threads renders it. Metrics recorded on other threads are not in it.
///
/// For several services in one process (tests). The recorder lives as long as
/// the process, like the global one; a service started again on a new runtime
/// starts from zero, as a restarted process does.
pub fn isolate(builder: &mut tokio::runtime::Builder) -> &'static PrometheusHandle {
    let recorder: &'static PrometheusRecorder = Box::leak(Box::new(recorder()));
    let handle: &'static PrometheusHandle = Box::leak(Box::new(recorder.handle()));
    builder.on_thread_start(move || {
        // Kept for the thread's life: the thread is the runtime's, the recorder 'static.
        std::mem::forget(metrics::set_default_local_recorder(recorder));
        ISOLATED.set(Some(handle));
    });
    handle
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(builder: &mut tokio::runtime::Builder) -> tokio::runtime::Runtime {
        builder.worker_threads(2).enable_all().build().expect("a runtime")
    }

    #[test]
    fn each_isolated_runtime_records_and_renders_only_its_own_series() {
        let mut a = tokio::runtime::Builder::new_multi_thread();
        let a_handle = isolate(&mut a);
        let a = runtime(&mut a);
        let mut b = tokio::runtime::Builder::new_multi_thread();
        let b_handle = isolate(&mut b);
        let b = runtime(&mut b);

        let from_a = a
            .block_on(a.spawn(async {
                metrics::counter!("isolation_test_total", "service" => "a").increment(2);
                // On a blocking thread of the same runtime too.
                tokio::task::spawn_blocking(|| metrics::counter!("isolation_blocking_total").increment(1))
                    .await
                    .unwrap();
                render()
            }))
            .unwrap();
        let from_b = b
            .block_on(b.spawn(async {
                metrics::counter!("isolation_test_total", "service" => "b").increment(5);
                render()
            }))
            .unwrap();

        assert!(from_a.contains("isolation_test_total{service=\"a\"} 2"), "{from_a}");
        assert!(from_a.contains("isolation_blocking_total 1"), "{from_a}");
        assert!(!from_a.contains("service=\"b\""), "{from_a}");
        assert!(from_b.contains("isolation_test_total{service=\"b\"} 5"), "{from_b}");
        assert!(!from_b.contains("service=\"a\""), "{from_b}");
        assert!(!from_b.contains("isolation_blocking_total"), "{from_b}");
        // The handles `isolate` returned render the same series (in an order of their own).
        let series = |text: &str| text.lines().map(str::to_owned).collect::<std::collections::BTreeSet<_>>();
        assert_eq!(series(&a_handle.render()), series(&from_a));
        assert_eq!(series(&b_handle.render()), series(&from_b));
        // Nothing went to the process-wide recorder.
        assert!(!render().contains("isolation_"), "{}", render());
    }
}
