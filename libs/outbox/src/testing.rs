//! What the crate's own tests reach into (cargo feature `test-hooks`): the
//! wake-up protocol's channel and lock (see the `wake` module), the writer's
//! payload limit, and the readiness parts [`crate::service::readiness`] wires.

pub use crate::health::BrokerCheck;
pub use crate::metrics::OutboxGauges;
pub use crate::wake::{NOTIFY_CHANNEL, WAKE_LOCK};
pub use crate::writer::MAX_PAYLOAD_BYTES;

/// The Kafka name of consumer group `group`: `<topic prefix>.<group>`.
pub fn group_name(kafka: &sagaworks_config::KafkaSettings, group: &str) -> String {
    crate::kafka::group_name(kafka, group)
}
