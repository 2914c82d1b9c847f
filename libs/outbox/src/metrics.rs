//! Metrics of the relay and the consumer, recorded through the `metrics`
//! facade (the process-wide Prometheus recorder is installed by
//! `sagaworks_runtime::metrics::handle()`).
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `outbox_published_total` | counter | `service` |
//! | `outbox_publish_errors_total` | counter | `service` |
//! | `outbox_backlog` | gauge: unpublished rows | `service` |
//! | `outbox_oldest_unpublished_age_seconds` | gauge | `service` |
//! | `outbox_publish_latency_seconds` | histogram: row `created_at` -> broker ack | `service` |
//! | `consumer_processed_total` | counter | `group`, `topic`, `outcome` (`processed`, `ignored`, `duplicate`, `dead_lettered`) |
//! | `consumer_errors_total` | counter: failed handling attempts | `group`, `topic` |
//! | `consumer_dlq_total` | counter | `group`, `topic` |
//! | `consumer_lag` | gauge: high watermark - fetch position (messages queued for a worker count as consumed) | `group`, `topic`, `partition` |
//! | `kafka_clients_closing` | gauge: clients being closed; one stuck above 0 is a destroy that hangs | — |
//!
//! The backlog gauges are refreshed by the relay at most once a second and, so that
//! `/metrics` is current even when no relay runs in the process, by
//! [`OutboxGauges`] as a `/metrics` scrape hook.

use futures::future::BoxFuture;
use sagaworks_runtime::ScrapeHook;
use sqlx::PgPool;

pub(crate) const OUTBOX_PUBLISHED_TOTAL: &str = "outbox_published_total";
pub(crate) const OUTBOX_PUBLISH_ERRORS_TOTAL: &str = "outbox_publish_errors_total";
pub(crate) const OUTBOX_BACKLOG: &str = "outbox_backlog";
pub(crate) const OUTBOX_OLDEST_UNPUBLISHED_AGE_SECONDS: &str = "outbox_oldest_unpublished_age_seconds";
pub(crate) const OUTBOX_PUBLISH_LATENCY_SECONDS: &str = "outbox_publish_latency_seconds";
pub(crate) const CONSUMER_PROCESSED_TOTAL: &str = "consumer_processed_total";
pub(crate) const CONSUMER_ERRORS_TOTAL: &str = "consumer_errors_total";
pub(crate) const CONSUMER_DLQ_TOTAL: &str = "consumer_dlq_total";
pub(crate) const CONSUMER_LAG: &str = "consumer_lag";

/// Sets `outbox_backlog` and `outbox_oldest_unpublished_age_seconds` from the table.
pub(crate) async fn refresh_outbox_gauges(pool: &PgPool, service: &str) -> Result<(), sqlx::Error> {
    let (backlog, age): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), EXTRACT(EPOCH FROM now() - min(created_at))::float8
         FROM outbox",
    )
    .fetch_one(pool)
    .await?;
    let labels = [("service", service.to_string())];
    metrics::gauge!(OUTBOX_BACKLOG, &labels).set(backlog as f64);
    metrics::gauge!(OUTBOX_OLDEST_UNPUBLISHED_AGE_SECONDS, &labels).set(age.unwrap_or(0.0).max(0.0));
    Ok(())
}

/// A `/metrics` scrape hook that refreshes the outbox backlog gauges:
/// `Readiness::new().with_gauges(OutboxGauges { pool, service: "order".into() })`.
pub struct OutboxGauges {
    pub pool: PgPool,
    pub service: String,
}

impl ScrapeHook for OutboxGauges {
    fn refresh(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Err(e) = refresh_outbox_gauges(&self.pool, &self.service).await {
                tracing::warn!(error = %e, "cannot refresh outbox gauges");
            }
        })
    }
}
