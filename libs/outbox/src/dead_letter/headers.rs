//! The headers of a dead letter: a consumer parks a message in `<topic>.dlq`
//! with its own headers plus these ([`Parked::add_to`]); the reader reads
//! them back, and a replay marks what it sends with [`DLQ_REPLAYED_FROM`].

use super::model::DlqReason;
use rdkafka::message::{Header, OwnedHeaders};

/// Why the message was parked: a [`DlqReason`] label.
pub(crate) const DLQ_REASON: &str = "dlq_reason";
pub(crate) const DLQ_ERROR: &str = "dlq_error";
pub(crate) const DLQ_ATTEMPTS: &str = "dlq_attempts";
pub(crate) const DLQ_ORIGINAL_TOPIC: &str = "dlq_original_topic";
pub(crate) const DLQ_ORIGINAL_PARTITION: &str = "dlq_original_partition";
pub(crate) const DLQ_ORIGINAL_OFFSET: &str = "dlq_original_offset";
/// The consumer group that dead-lettered the message.
pub(crate) const DLQ_GROUP: &str = "dlq_group";
/// On a replayed message: `<dlq topic>/<partition>/<offset>` it was replayed from.
pub(crate) const DLQ_REPLAYED_FROM: &str = "dlq_replayed_from";

/// What a consumer records with a message it parks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parked<'a> {
    pub reason: DlqReason,
    /// The last error.
    pub error: &'a str,
    pub attempts: u32,
    /// Where the message was consumed from.
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    /// The consumer group that parks it.
    pub group: &'a str,
}

impl Parked<'_> {
    /// `headers` (the message's own) with the `dlq_*` headers added.
    pub(crate) fn add_to(&self, headers: OwnedHeaders) -> OwnedHeaders {
        let (attempts, partition, offset) =
            (self.attempts.to_string(), self.partition.to_string(), self.offset.to_string());
        let mut h = headers;
        for (key, value) in [
            (DLQ_REASON, self.reason.label()),
            (DLQ_ERROR, self.error),
            (DLQ_ATTEMPTS, attempts.as_str()),
            (DLQ_ORIGINAL_TOPIC, self.topic),
            (DLQ_ORIGINAL_PARTITION, partition.as_str()),
            (DLQ_ORIGINAL_OFFSET, offset.as_str()),
            (DLQ_GROUP, self.group),
        ] {
            h = h.insert(Header { key, value: Some(value) });
        }
        h
    }
}
