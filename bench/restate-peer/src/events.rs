//! The order events, published on `<prefix>.order` as the outbox relay writes them
//! (key = order id, the relay's CloudEvents headers), so inventory's consumer commits
//! or forgets the stock as it does for sagaworks. As the order service's Kafka user.

use crate::settings::KafkaTarget;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sagaworks_event::Event;
use std::time::Duration;
use uuid::Uuid;

/// How long a publish may wait for the broker's acknowledgement (all in-sync replicas)
/// before it fails and the journaled step is retried.
const DELIVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("Kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("event {0}: {1}")]
    Encode(&'static str, serde_json::Error),
}

/// The producer, or none (no brokers: nothing is published).
#[derive(Clone)]
pub struct Publisher {
    producer: Option<FutureProducer>,
    topic: String,
}

impl Publisher {
    pub fn new(target: &KafkaTarget) -> Result<Self, PublishError> {
        let producer = if target.brokers.is_empty() { None } else { Some(config(target).create()?) };
        Ok(Self { producer, topic: target.topic.clone() })
    }

    /// Where events go, for the start-up line.
    pub fn describe(&self, target: &KafkaTarget) -> String {
        match (&self.producer, &target.sasl_ssl) {
            (None, _) => "off".into(),
            (Some(_), Some(s)) => {
                format!("{} on {} (SASL_SSL as {})", self.topic, target.brokers, s.username)
            }
            (Some(_), None) => format!("{} on {} (plaintext)", self.topic, target.brokers),
        }
    }

    /// Publishes `event` with id `event_id` (a replay sends the same id: inventory's
    /// inbox drops the second).
    pub async fn publish<E: Event>(&self, event: &E, event_id: Uuid) -> Result<(), PublishError> {
        let Some(producer) = &self.producer else { return Ok(()) };
        let payload = serde_json::to_vec(event).map_err(|e| PublishError::Encode(E::TYPE, e))?;
        let key = event.aggregate_id();
        let record =
            FutureRecord::to(&self.topic).key(&key).payload(&payload).headers(headers(event, event_id));
        producer.send(record, DELIVERY).await.map_err(|(e, _)| PublishError::Kafka(e))?;
        Ok(())
    }
}

/// librdkafka's settings: acknowledged by all in-sync replicas, idempotent; SCRAM-SHA-512
/// over TLS when a user is set (`sagaworks_config::KafkaSettings::security_properties`).
fn config(target: &KafkaTarget) -> ClientConfig {
    // OpenSSL initialised before librdkafka uses it, without its exit handler
    // (sagaworks_outbox::kafka::client_config says why).
    openssl_sys::init();
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &target.brokers)
        .set("client.id", "restate-peer")
        .set("acks", "all")
        .set("enable.idempotence", "true");
    if let Some(sasl) = &target.sasl_ssl {
        config
            .set("security.protocol", "SASL_SSL")
            .set("sasl.mechanism", "SCRAM-SHA-512")
            .set("sasl.username", &sasl.username)
            .set("sasl.password", &sasl.password);
        if !sasl.ca_file.is_empty() {
            config.set("ssl.ca.location", &sasl.ca_file);
        }
    }
    config
}

/// The outbox relay's CloudEvents headers.
fn headers<E: Event>(event: &E, event_id: Uuid) -> OwnedHeaders {
    let (id, time) =
        (event_id.to_string(), chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    let (version, aggregate, schema) = (E::VERSION.to_string(), event.aggregate_id(), E::data_schema());
    [
        ("ce_id", id.as_str()),
        ("ce_type", E::TYPE),
        ("ce_source", "/sagaworks/order"),
        ("ce_specversion", "1.0"),
        ("ce_time", time.as_str()),
        ("ce_schemaversion", version.as_str()),
        ("ce_aggregateid", aggregate.as_str()),
        ("content-type", "application/json"),
        ("ce_dataschema", schema.as_str()),
    ]
    .into_iter()
    .fold(OwnedHeaders::new(), |h, (key, value)| h.insert(Header { key, value: Some(value) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::Headers;
    use sagaworks_events::order::OrderConfirmed;

    #[test]
    fn the_headers_are_the_relays() {
        let id = Uuid::now_v7();
        let order = Uuid::now_v7();
        let event = OrderConfirmed {
            order_id: order,
            customer_id: id,
            saga_id: id,
            reservation_ids: vec![id],
            payment_id: id,
            total_cents: 5,
        };
        let headers = headers(&event, id);
        let get = |name: &str| {
            headers
                .iter()
                .find(|h| h.key == name)
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        assert_eq!(get("ce_id"), Some(id.to_string()));
        assert_eq!(get("ce_type").as_deref(), Some("OrderConfirmed"));
        assert_eq!(get("ce_schemaversion").as_deref(), Some("2"));
        assert_eq!(get("ce_aggregateid"), Some(order.to_string()));
        assert_eq!(get("ce_dataschema").as_deref(), Some("urn:sagaworks:event:OrderConfirmed:v2"));
        assert!(chrono::DateTime::parse_from_rfc3339(&get("ce_time").unwrap()).is_ok());
    }
}
