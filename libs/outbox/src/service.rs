//! Wiring the outbox into a service: a few calls in its `startup` module.
//!
//! ```ignore
//! let readiness = sagaworks_outbox::service::readiness(Readiness::new(), &pool, &settings.kafka, &settings.outbox)?;
//! let mut tasks = sagaworks_outbox::service::relay_task(&pool, &settings.kafka, &settings.outbox, &shutdown)?;
//! tasks.push(sagaworks_outbox::service::consumer_task(&pool, &settings.kafka, &settings.consumer, handler, &shutdown)?);
//! host.run(routes, readiness, tasks, shutdown).await
//! ```

use crate::health::BrokerCheck;
use crate::metrics::OutboxGauges;
use crate::{Consumer, ConsumerSettings, Handler, OutboxError, Relay, RelaySettings};
use sagaworks_config::KafkaSettings;
use sagaworks_runtime::Readiness;
use sagaworks_runtime::Task;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// Adds the broker to readiness and the outbox backlog gauges to `/metrics`.
pub fn readiness(
    readiness: Readiness,
    pool: &PgPool,
    kafka: &KafkaSettings,
    relay: &RelaySettings,
) -> Result<Readiness, OutboxError> {
    Ok(readiness
        // Without the broker, events wait in the outbox and requests are still
        // served: degraded, not unready (a broker blip must not empty the Service).
        .with_non_critical(BrokerCheck::new(kafka)?)
        .with_gauges(OutboxGauges { pool: pool.clone(), service: relay.service.clone() }))
}

/// The relay as a host task, when `settings.enabled` (else none).
pub fn relay_task(
    pool: &PgPool,
    kafka: &KafkaSettings,
    settings: &RelaySettings,
    shutdown: &CancellationToken,
) -> Result<Vec<(&'static str, Task)>, OutboxError> {
    if !settings.enabled {
        return Ok(vec![]);
    }
    let relay = Relay::new(pool.clone(), kafka, settings.clone())?;
    let shutdown = shutdown.clone();
    Ok(vec![(
        "outbox relay",
        Box::pin(async move {
            relay.run(shutdown).await;
            Ok(())
        }),
    )])
}

/// A consumer group as a host task.
pub fn consumer_task<H: Handler>(
    pool: &PgPool,
    kafka: &KafkaSettings,
    settings: &ConsumerSettings,
    handler: H,
    shutdown: &CancellationToken,
) -> Result<(&'static str, Task), OutboxError> {
    let consumer = Consumer::new(pool.clone(), kafka, settings.clone(), handler)?;
    let shutdown = shutdown.clone();
    Ok((
        "event consumer",
        Box::pin(async move {
            consumer.run(shutdown).await;
            Ok(())
        }),
    ))
}
