//! Kafka naming and client plumbing shared by the relay, the consumer and the
//! broker health check.
//!
//! * Topic names: [`topic_name`] (`<prefix>.<aggregate_type>`) and
//!   [`dlq_topic`] (`<topic>.dlq`).
//! * Header names of the CloudEvents binary-mode envelope and the dead-letter
//!   extras: [`headers`].
//! * [`client_config`] — `bootstrap.servers` plus the extra librdkafka
//!   properties from [`KafkaSettings::properties`] (security settings etc.).
//! * [`ensure_topics`] — creates missing topics, because a real cluster usually
//!   runs with `auto.create.topics.enable=false`.

use crate::OutboxError;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use sagaworks_config::KafkaSettings;
use std::time::Duration;

/// Header names (see docs/design.md, "Events").
pub mod headers {
    pub const CE_ID: &str = "ce_id";
    pub const CE_TYPE: &str = "ce_type";
    pub const CE_SOURCE: &str = "ce_source";
    pub const CE_SPECVERSION: &str = "ce_specversion";
    pub const CE_TIME: &str = "ce_time";
    pub const CE_SCHEMAVERSION: &str = "ce_schemaversion";
    pub const CE_AGGREGATEID: &str = "ce_aggregateid";
    pub const CONTENT_TYPE: &str = "content-type";
    pub const TRACEPARENT: &str = "traceparent";
    pub const TRACESTATE: &str = "tracestate";
    /// The CloudEvents version written into `ce_specversion`.
    pub const SPECVERSION: &str = "1.0";

    pub const DLQ_ERROR: &str = "dlq_error";
    pub const DLQ_ATTEMPTS: &str = "dlq_attempts";
    pub const DLQ_ORIGINAL_TOPIC: &str = "dlq_original_topic";
    pub const DLQ_ORIGINAL_PARTITION: &str = "dlq_original_partition";
    pub const DLQ_ORIGINAL_OFFSET: &str = "dlq_original_offset";
}

/// How new topics are created (partitions, replication factor).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TopicSettings {
    pub partitions: i32,
    /// 1 suits a single local broker; use 3 on a real cluster.
    pub replication_factor: i32,
}

impl Default for TopicSettings {
    fn default() -> Self {
        Self { partitions: 3, replication_factor: 1 }
    }
}

/// `<prefix>.<aggregate_type>`, e.g. `sagaworks.order`.
pub fn topic_name(kafka: &KafkaSettings, aggregate_type: &str) -> String {
    format!("{}.{}", kafka.topic_prefix, aggregate_type)
}

/// The dead-letter topic of `topic`.
pub fn dlq_topic(topic: &str) -> String {
    format!("{topic}.dlq")
}

/// A librdkafka config: the brokers, then `defaults`, then the extra
/// properties from the settings (which may override a default).
pub fn client_config(kafka: &KafkaSettings, defaults: &[(&str, &str)]) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.brokers);
    for (key, value) in defaults {
        config.set(*key, *value);
    }
    for (key, value) in &kafka.properties {
        config.set(key, value);
    }
    config
}

/// Creates every topic in `topics` that does not exist yet.
pub async fn ensure_topics(
    kafka: &KafkaSettings,
    topics: &[String],
    settings: TopicSettings,
) -> Result<(), OutboxError> {
    if topics.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = client_config(kafka, &[]).create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, settings.partitions, TopicReplication::Fixed(settings.replication_factor)))
        .collect();
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(5)))
        .request_timeout(Some(Duration::from_secs(5)));
    for result in admin.create_topics(&new, &opts).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(OutboxError::CreateTopic { topic, reason: code.to_string() }),
        }
    }
    Ok(())
}
