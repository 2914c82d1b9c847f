//! Readiness of the Kafka connection:
//! `Readiness::new().with_check(BrokerCheck::new(&settings.kafka)?)`.

use crate::{OutboxError, kafka};
use futures::future::BoxFuture;
use rdkafka::consumer::{BaseConsumer, Consumer};
use sagaworks_config::KafkaSettings;
use sagaworks_runtime::Check;
use std::sync::Arc;
use std::time::Duration;

/// How long the broker has to answer a metadata request.
const TIMEOUT: Duration = Duration::from_secs(1);

/// Passes when a broker answers a metadata request within a second.
pub struct BrokerCheck {
    client: Arc<kafka::OffRuntimeDrop<BaseConsumer>>,
}

impl BrokerCheck {
    /// Builds the client; connects lazily.
    pub fn new(kafka: &KafkaSettings) -> Result<Self, OutboxError> {
        let client: BaseConsumer = kafka::client_config(kafka, &[]).create()?;
        Ok(Self { client: Arc::new(kafka::OffRuntimeDrop::new(client, "health")) })
    }
}

impl Check for BrokerCheck {
    fn name(&self) -> &str {
        "kafka"
    }

    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        let client = Arc::clone(&self.client);
        Box::pin(async move {
            // fetch_metadata blocks for up to TIMEOUT: keep it off the runtime's threads.
            let meta = tokio::task::spawn_blocking(move || {
                client.fetch_metadata(None, TIMEOUT).map(|m| m.brokers().len())
            })
            .await
            .map_err(|e| format!("metadata task failed: {e}"))?;
            match meta {
                Ok(0) => Err("no broker in the metadata".into()),
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}
