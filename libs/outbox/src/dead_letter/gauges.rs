//! The `dlq_size` and `dlq_pending` gauges.

use super::DeadLetters;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Gauge: messages in a dead-letter topic (`topic` = the DLQ topic).
pub(crate) const DLQ_SIZE: &str = "dlq_size";
/// Gauge: messages in a dead-letter topic neither replayed nor discarded.
pub(crate) const DLQ_PENDING: &str = "dlq_pending";

impl DeadLetters {
    /// Refreshes the `dlq_size` and `dlq_pending` gauges every
    /// `gauge_interval_ms` until `shutdown`.
    pub async fn run_gauges(self, shutdown: CancellationToken) {
        let every = Duration::from_millis(self.inner.settings.gauge_interval_ms.max(100));
        loop {
            match self.summaries().await {
                Ok(summaries) => {
                    for s in summaries {
                        metrics::gauge!(DLQ_SIZE, "topic" => s.dlq_topic.clone()).set(s.messages as f64);
                        metrics::gauge!(DLQ_PENDING, "topic" => s.dlq_topic).set(s.pending as f64);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot count dead letters"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }
}
