//! What a consumer group reads and how it handles it: [`ConsumerSettings`].

#[cfg(doc)]
use super::HandlerError;
use crate::crash::ConsumerCrashPoint;
#[cfg(doc)]
use crate::kafka;
use crate::kafka::TopicSettings;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Settings of one consumer group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConsumerSettings {
    /// The group: the inbox's `consumer_group`; on Kafka, `<topic prefix>.<group>`.
    pub group_id: String,
    /// Aggregate types to read; each becomes `<topic_prefix>.<type>`.
    pub topics: Vec<String>,
    /// Handling attempts per message before it is dead-lettered.
    pub max_attempts: u32,
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    pub session_timeout_ms: u64,
    pub max_poll_interval_ms: u64,
    /// Where a new group starts: `earliest` or `latest`.
    pub auto_offset_reset: String,
    /// How often `consumer_lag` is refreshed.
    pub lag_interval_ms: u64,
    /// Used when the consumer creates a missing topic (or its DLQ).
    pub topic_settings: TopicSettings,
    /// Partitions handled at the same time. Each partition always goes to
    /// the same worker, so it is still handled in order.
    pub concurrency: usize,
    /// Messages a worker handles in one database transaction when they are
    /// already waiting (at most this many). `1`: a transaction per message.
    /// A batch saves a commit per message, but its transaction holds the
    /// locks of all its handlers until it commits: keep `1` when handlers
    /// lock rows that other writers lock too (in another order, that is a
    /// deadlock). A batch that fails is handled again message by message.
    pub batch_size: usize,
    /// How long a worker waits for more messages to fill a batch once it has
    /// one (with `batch_size` above 1). `0`: only the messages waiting
    /// already. Under a steady stream, few wait at any moment, so batches
    /// stay small; a wait of a few tens of milliseconds gathers more of them
    /// (fewer transactions and commits) at the cost of that much delay per
    /// event. Use it for events nobody waits on synchronously.
    pub batch_wait_ms: u64,
    /// How long the inbox remembers a handled event (see the module docs).
    pub inbox_retention_hours: i64,
    /// How often the offsets of handled messages are committed (see the
    /// module docs); `0`: after every message or batch.
    pub commit_interval_ms: u64,
    /// What happens to an event written with a schema version newer than the
    /// handler reads ([`HandlerError::UnsupportedSchemaVersion`]).
    pub unsupported_schema_version: UnsupportedVersionPolicy,
    /// Per topic (aggregate type), the only `ce_source` accepted on it: its publisher's,
    /// `/sagaworks/<service>`. A message from any other source is dead-lettered with
    /// `dlq_reason=untrusted_source`, never handled. The services fill it from
    /// services.toml (`sagaworks_mtls::topic_sources`); empty: sources are not checked
    /// (when not empty, every topic of `topics` needs an entry).
    pub sources: BTreeMap<String, String>,
    /// Per topic (aggregate type), the event types (`ce_type`) its publisher writes on it.
    /// A message of another type is dead-lettered with `dlq_reason=unexpected_type`, never
    /// handled: the rightful publisher of a topic cannot put another topic's events on it.
    /// The services fill it from the event catalog (`sagaworks_events::catalog::topic_types`);
    /// empty: types are not checked (when not empty, every topic of `topics` needs an entry).
    pub types: BTreeMap<String, Vec<String>>,
    /// Test-only fault hook (`APP_CONSUMER__CRASH_POINT=before_offset_commit`;
    /// see [`RelayCrashPoint`](crate::RelayCrashPoint)): abort the process once newly handled events
    /// committed, before their offsets are committed. `off` by default;
    /// never in production.
    pub crash_point: ConsumerCrashPoint,
}

impl sagaworks_runtime::TestHooks for ConsumerSettings {
    fn built_in(&self) -> bool {
        cfg!(feature = "test-hooks")
    }

    fn hooks_on(&self) -> Vec<(&'static str, &'static str)> {
        if self.crash_point == ConsumerCrashPoint::Off {
            vec![]
        } else {
            vec![("crash_point", crate::crash::CRASH_POINT)]
        }
    }
}

/// What the consumer does with an event newer than its handler reads (see
/// [`Event`](crate::Event)); either way it is dead-lettered with
/// `dlq_reason=unsupported_schema_version` in the end, to be replayed once
/// the consumer is upgraded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnsupportedVersionPolicy {
    /// Dead-letter it at once: the partition moves on.
    #[default]
    Park,
    /// Retry it like a retryable error (`max_attempts`, with backoff), in
    /// case an upgraded replica of this group takes the partition over
    /// meanwhile (a rolling deploy); then dead-letter it.
    Retry,
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        Self {
            group_id: String::new(),
            topics: Vec::new(),
            max_attempts: 5,
            retry_base_ms: 100,
            retry_max_ms: 2_000,
            session_timeout_ms: 6_000,
            max_poll_interval_ms: 10_000,
            auto_offset_reset: "earliest".into(),
            lag_interval_ms: 5_000,
            topic_settings: TopicSettings::default(),
            concurrency: 4,
            batch_size: 1,
            batch_wait_ms: 0,
            inbox_retention_hours: 24 * 7,
            commit_interval_ms: 200,
            unsupported_schema_version: UnsupportedVersionPolicy::Park,
            sources: BTreeMap::new(),
            types: BTreeMap::new(),
            crash_point: ConsumerCrashPoint::Off,
        }
    }
}
