//! Dead-letter topics: a [`Consumer`](crate::Consumer) parks the messages it
//! cannot handle in `<topic>.dlq` (`park`), and operators list, show, replay
//! and discard them ([`DeadLetters`]).
//!
//! ```ignore
//! let dead_letters = DeadLetters::new(pool, &kafka, settings)?;
//! let page = dead_letters.list("order", &ListFilter::default(), None, 50).await?;
//! let done = dead_letters.replay("order", Selector::Key(key), &operator).await?;
//! ```
//!
//! * **Reading** assigns the DLQ's partitions to a consumer without a group
//!   (nothing is committed) and reads from the low watermark, so listing
//!   never moves anybody's offsets. Messages are listed oldest first, by
//!   partition and offset; a page scans at most
//!   [`DeadLetterSettings::max_scan`] messages and hands out a cursor to go
//!   on. Payloads are cut at [`DeadLetterSettings::max_payload_bytes`].
//! * **Replay** sends the selected *pending* messages (one, all of one key, or
//!   all) back to their original topic and partition with their key, payload
//!   and headers (minus the `dlq_*` ones, plus `dlq_replayed_from`), in their
//!   original order (by original partition and offset).
//! * **A replay sends only what the topic's publisher wrote.** Every consumer
//!   of a topic may write its `.dlq` topic, so a dead letter's headers and
//!   payload prove nothing. Before anything is sent, each selected message's
//!   original record is read again from the position its `dlq_original_*`
//!   headers name, which must be in the replayed topic itself; the record sent
//!   is that original (its key, payload and headers). A message whose original
//!   is gone (no position, below the low watermark, past the end) or differs
//!   from it (key, payload or a `ce_*` header) is refused: the whole call sends
//!   nothing and fails with [`DeadLetterError::Refused`], each refused message
//!   is recorded in `dead_letter_refusals` (who asked, why it was refused) and
//!   stays pending, for an operator to discard. The idempotent
//!   consumer makes this safe: a group that already handled a replayed event
//!   finds it in its inbox and skips it; one that failed on it handles it now.
//!   A message two groups dead-lettered is in the DLQ twice; it is sent once.
//!   One call looks at the first `max_scan` messages of the topic; with more,
//!   call again (the replayed ones are no longer pending).
//! * **Discard** only records that an operator decided the message needs
//!   nothing (Kafka messages cannot be deleted; retention does that).
//!
//! Every replay and discard is recorded (who, when, what, why, the
//! Idempotency-Key) in `dead_letter_requests`, and each message it took in
//! `dead_letter_actions`, in the service's own database. A message is
//! replayed or discarded at most once: the action row is inserted, the
//! messages sent, and then the transaction commits, so two operators racing
//! cannot both replay it (the second waits for the first's row and then
//! finds it taken). If the commit fails after the sends, the messages were
//! replayed without a record and stay pending; replaying them again is a
//! no-op for the groups that handled them.
//!
//! Gauges (see [`DeadLetters::run_gauges`]): `dlq_size{topic}` (messages in
//! the DLQ topic) and `dlq_pending{topic}` (of those, neither replayed nor
//! discarded).
//!
//! The files: `model` (what an operator sees and asks for, and why a
//! message was parked; re-exported here), `headers` (the `dlq_*` headers a consumer writes
//! and the reader reads back), `park` (a consumer's send of a message to its
//! dead-letter topic), `reader` (reading the topics), `replay`
//! (replay and discard), `audit` (the operators' records in the database)
//! and `gauges`.

pub(crate) mod headers;
mod model;

mod audit;
mod gauges;
mod park;
mod reader;
mod replay;

pub use model::{
    Acted, ActionRecord, DeadLetter, DeadLetterError, ListFilter, MessageId, Operator, Page, Position,
    Refusal, Selector, State, TopicSummary,
};

pub(crate) use model::DlqReason;
pub(crate) use park::{NotParked, park};

use crate::OutboxError;
use crate::kafka::{self, OffRuntimeDrop};
use rdkafka::consumer::StreamConsumer;
use rdkafka::producer::FutureProducer;
use sagaworks_config::KafkaSettings;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// The consumer group of the dead-letter reader (`<prefix>.dead-letters` on Kafka).
pub const READER_GROUP: &str = "dead-letters";

/// How long one broker request of an operator call may take.
const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// Which dead-letter topics are operated, and the bounds of one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeadLetterSettings {
    /// The original topics (without prefix, like `ConsumerSettings::topics`):
    /// `order` operates `<prefix>.order.dlq`.
    pub topics: Vec<String>,
    /// How often the `dlq_size` / `dlq_pending` gauges are refreshed.
    pub gauge_interval_ms: u64,
    /// Payloads longer than this are cut in listings.
    pub max_payload_bytes: usize,
    /// Messages one page (or one replay) reads at most.
    pub max_scan: usize,
}

impl Default for DeadLetterSettings {
    fn default() -> Self {
        Self { topics: Vec::new(), gauge_interval_ms: 15_000, max_payload_bytes: 64 * 1024, max_scan: 10_000 }
    }
}

/// The dead-letter topics of [`DeadLetterSettings::topics`] (see the module docs).
#[derive(Clone)]
pub struct DeadLetters {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    kafka: KafkaSettings,
    settings: DeadLetterSettings,
    reader: Arc<OffRuntimeDrop<StreamConsumer>>,
    /// One reader, one assignment at a time.
    reading: tokio::sync::Mutex<()>,
    producer: OffRuntimeDrop<FutureProducer>,
}

impl DeadLetters {
    /// Builds the Kafka clients; connects nothing yet.
    pub fn new(
        pool: PgPool,
        kafka: &KafkaSettings,
        settings: DeadLetterSettings,
    ) -> Result<Self, OutboxError> {
        let mut config = kafka::client_config(kafka, &[("fetch.wait.max.ms", "100")]);
        // Assigned, never subscribed: the group is never joined nor committed to, but
        // librdkafka assigns only with a group and looks up its coordinator, which takes
        // Describe on it (services.toml lists it among the host's `groups`).
        config.set("group.id", kafka::group_name(kafka, READER_GROUP)).set("enable.auto.commit", "false");
        let reader: StreamConsumer = config.create()?;
        let producer: FutureProducer =
            kafka::client_config(kafka, &[("acks", "all"), ("enable.idempotence", "true")]).create()?;
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                kafka: kafka.clone(),
                settings,
                reader: Arc::new(OffRuntimeDrop::new(reader, "dead-letter reader")),
                reading: tokio::sync::Mutex::new(()),
                producer: OffRuntimeDrop::new(producer, "dead-letter producer"),
            }),
        })
    }

    /// The operated topics (as configured, e.g. `order`).
    pub fn topics(&self) -> &[String] {
        &self.inner.settings.topics
    }

    /// `<prefix>.<topic>.dlq`, if `topic` is operated.
    fn dlq_topic(&self, topic: &str) -> Result<String, DeadLetterError> {
        if !self.inner.settings.topics.iter().any(|t| t == topic) {
            return Err(DeadLetterError::UnknownTopic(topic.to_string()));
        }
        Ok(kafka::dlq_topic(&kafka::topic_name(&self.inner.kafka, topic)))
    }
}
