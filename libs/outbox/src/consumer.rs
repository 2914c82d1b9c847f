//! The idempotent consumer: Kafka -> inbox + handler, with retries and a DLQ.
//!
//! ```ignore
//! let consumer = Consumer::new(pool.clone(), &settings.kafka, consumer_settings, MyHandler)?;
//! tokio::spawn(consumer.run(token.clone()));
//! ```
//!
//! Messages are routed by partition to `concurrency` workers; a worker
//! handles its messages one after the other, so a partition is handled in
//! order. Each message:
//!
//! 1. The CloudEvents headers are parsed into a [`ReceivedEvent`]. A message
//!    without a valid `ce_id` (a UUID) and `ce_type` is poison: dead-lettered.
//! 2. In one database transaction: `INSERT INTO inbox ... ON CONFLICT DO
//!    NOTHING`; if the event was already there this is a redelivery and
//!    nothing else happens; otherwise the [`Handler`] runs on the same
//!    transaction, which then commits. So the handler's database effects happen
//!    exactly once per consumer group, however often Kafka delivers.
//! 3. The message's offset is marked for commit; the consumer commits the
//!    marked offsets itself (`enable.auto.commit=false`) every
//!    `commit_interval_ms` (one `OffsetCommit` for all of them, instead of a
//!    request per message) and once more when it stops, after its workers
//!    finished. A crash redelivers at most that interval's messages, which
//!    the inbox makes no-ops; an offset is never committed before its
//!    message was handled or dead-lettered.
//!
//! With `batch_size` above 1, the messages already waiting for a worker, and
//! those arriving within `batch_wait_ms`, are handled like this in one
//! transaction (one inbox statement, then [`Handler::handle_many`] with the
//! new events, one commit), and their offsets marked after it; if anything in
//! the batch fails, the batch is rolled back and its messages go through the
//! steps above one at a time, with their own retries and dead-lettering.
//!
//! A [`HandlerError::Retryable`] (or a database error) is retried with
//! exponential backoff and full jitter, up to `max_attempts` in all; then,
//! like a [`HandlerError::Permanent`] at once, the message goes to
//! `<topic>.dlq` with the `dlq_*` headers (`dlq_reason` says why: see
//! [`DlqReason`]) and the offset is marked, so the
//! partition moves on. The DLQ send is awaited and retried until it is acked:
//! an offset is never committed for a message that is neither handled nor
//! dead-lettered. Keep the total retry time (`retry_max_ms` x attempts) well
//! under `max_poll_interval_ms`, or the broker evicts the consumer from its
//! group while it waits.
//!
//! Each message is handled inside a `process {topic}` consumer span (a new
//! trace with a span link to the producer span named by the message's
//! `traceparent` header), so the handler's spans and logs belong to it; a
//! dead-lettered message ends it with an error status.
//!
//! After a rebalance a worker may still finish messages of a partition that
//! moved to another group member (and commit them up to `commit_interval_ms`
//! later); both may then handle (the inbox makes the second a no-op) and
//! commit it, which can only cause redelivery, never loss.
//!
//! The inbox keeps a group's rows for `inbox_retention_hours` (default 7
//! days, Kafka's default log retention) and the consumer deletes older ones
//! hourly ([`purge_inbox`]). Keep it at least as long as the topics keep
//! their messages: a group that rewinds further (a reset to the earliest
//! offset) would handle again the events whose rows are gone.

use crate::OutboxError;
use crate::backoff::Backoff;
use crate::crash::{self, ConsumerCrashPoint};
use crate::kafka::{self, TopicSettings, headers};
use crate::metrics as m;
use chrono::{DateTime, Utc};
use opentelemetry::trace::Status;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use sagaworks_config::KafkaSettings;
use sagaworks_telemetry::messaging::{KafkaMessage, consumer_span};
use sagaworks_telemetry::propagation::context_from_pairs;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use uuid::Uuid;

/// Settings of one consumer group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConsumerSettings {
    /// The group: the inbox's `consumer_group`; on Kafka, `<topic prefix>.<group>`
    /// ([`kafka::group_name`]).
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
    /// Test-only fault hook (`APP_CONSUMER__CRASH_POINT=before_offset_commit`;
    /// see [`crate::crash`]): abort the process once newly handled events
    /// committed, before their offsets are committed. `off` by default;
    /// never in production.
    pub crash_point: ConsumerCrashPoint,
}

/// What the consumer does with an event newer than its handler reads (see
/// [`crate::event`]); either way it is dead-lettered with
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

/// Why a message was dead-lettered: the `dlq_reason` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DlqReason {
    /// Not a CloudEvent ([`EnvelopeError`]).
    InvalidEnvelope,
    /// The handler said it will never succeed ([`HandlerError::Permanent`]).
    Rejected,
    /// Retryable errors until `max_attempts` ran out.
    RetriesExhausted,
    /// A schema version newer than the handler reads.
    UnsupportedSchemaVersion,
    /// Its `ce_source` is not the topic's publisher ([`ConsumerSettings::sources`]).
    UntrustedSource,
}

impl DlqReason {
    pub fn label(self) -> &'static str {
        match self {
            Self::InvalidEnvelope => "invalid_envelope",
            Self::Rejected => "rejected",
            Self::RetriesExhausted => "retries_exhausted",
            Self::UnsupportedSchemaVersion => "unsupported_schema_version",
            Self::UntrustedSource => "untrusted_source",
        }
    }
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
            crash_point: ConsumerCrashPoint::Off,
        }
    }
}

/// Why a handler did not handle an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// Worth another try (a dependency was down, a lock timed out).
    #[error("retryable: {0}")]
    Retryable(String),
    /// Will never succeed (a poison message): dead-letter it at once.
    #[error("permanent: {0}")]
    Permanent(String),
    /// Written with a schema version newer than the handler reads (see
    /// [`crate::event`]); handled per [`ConsumerSettings::unsupported_schema_version`].
    #[error("unsupported schema version: {0}")]
    UnsupportedSchemaVersion(String),
}

/// Handles one event on the consumer's transaction (which already holds the
/// inbox row): write with `tx`, don't commit it.
pub trait Handler: Send + Sync + 'static {
    /// Whether `handle` has anything to do with `event`. An event it does not
    /// want is acknowledged without touching the database (no transaction, no
    /// inbox row: it has no effect, so there is nothing to deduplicate).
    fn wants(&self, _event: &ReceivedEvent) -> bool {
        true
    }

    /// Implement it as an `async fn` (its future must be `Send`).
    fn handle(
        &self,
        tx: &mut PgConnection,
        event: &ReceivedEvent,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Handles the new events of one transaction (several when `batch_size`
    /// is above 1), in partition order; `spans[i]` is the `process {topic}`
    /// span of `events[i]`. The default runs [`handle`](Self::handle) for each
    /// event inside its span. Override it to write a batch in fewer
    /// statements; an error rolls the whole batch back, and its messages are
    /// then handled one at a time (a batch of one each).
    fn handle_many(
        &self,
        tx: &mut PgConnection,
        events: &[&ReceivedEvent],
        spans: &[tracing::Span],
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        async move {
            for (event, span) in events.iter().zip(spans) {
                self.handle(tx, event).instrument(span.clone()).await?;
            }
            Ok(())
        }
    }
}

/// An event as received from Kafka.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedEvent {
    /// CloudEvents `id` (the outbox row id).
    pub id: Uuid,
    pub event_type: String,
    pub source: String,
    pub schema_version: i32,
    /// CloudEvents `dataschema`, when the producer named one.
    pub data_schema: Option<String>,
    pub aggregate_id: String,
    pub time: Option<DateTime<Utc>>,
    pub payload: Vec<u8>,
    /// The raw W3C `traceparent` header, to link the handling span to the writer's trace.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Every header, in order (values that were null are empty).
    pub headers: Vec<(String, Vec<u8>)>,
}

impl ReceivedEvent {
    /// The payload as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }

    /// The first header called `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_slice())
    }

    /// Reads the CloudEvents binary-mode envelope of `msg`.
    pub fn from_message(msg: &OwnedMessage) -> Result<Self, EnvelopeError> {
        let headers: Vec<(String, Vec<u8>)> = msg
            .headers()
            .map(|h| h.iter().map(|x| (x.key.to_string(), x.value.unwrap_or_default().to_vec())).collect())
            .unwrap_or_default();
        let text = |name: &str| -> Option<String> {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| std::str::from_utf8(v).ok())
                .map(str::to_string)
        };
        let id = text(headers::CE_ID).ok_or(EnvelopeError::Missing(headers::CE_ID))?;
        let id = Uuid::parse_str(&id).map_err(|_| EnvelopeError::Invalid(headers::CE_ID, id))?;
        let event_type = text(headers::CE_TYPE)
            .filter(|t| !t.is_empty())
            .ok_or(EnvelopeError::Missing(headers::CE_TYPE))?;
        let schema_version = match text(headers::CE_SCHEMAVERSION) {
            None => 1,
            Some(v) => v.parse().map_err(|_| EnvelopeError::Invalid(headers::CE_SCHEMAVERSION, v))?,
        };
        let time = match text(headers::CE_TIME) {
            None => None,
            Some(t) => Some(
                DateTime::parse_from_rfc3339(&t)
                    .map_err(|_| EnvelopeError::Invalid(headers::CE_TIME, t))?
                    .with_timezone(&Utc),
            ),
        };
        let aggregate_id = text(headers::CE_AGGREGATEID)
            .or_else(|| msg.key().and_then(|k| std::str::from_utf8(k).ok()).map(str::to_string))
            .unwrap_or_default();
        Ok(Self {
            id,
            event_type,
            source: text(headers::CE_SOURCE).unwrap_or_default(),
            schema_version,
            data_schema: text(headers::CE_DATASCHEMA),
            aggregate_id,
            time,
            payload: msg.payload().unwrap_or_default().to_vec(),
            traceparent: text(headers::TRACEPARENT),
            tracestate: text(headers::TRACESTATE),
            topic: msg.topic().to_string(),
            partition: msg.partition(),
            offset: msg.offset(),
            headers,
        })
    }
}

/// Why a message is not a CloudEvent (it is dead-lettered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("header {0} is missing")]
    Missing(&'static str),
    #[error("header {0} is invalid: {1:?}")]
    Invalid(&'static str, String),
}

/// How a message ended.
#[derive(Clone, Copy)]
enum Outcome {
    Processed,
    /// The handler does not want this event ([`Handler::wants`]).
    Ignored,
    Duplicate,
    DeadLettered,
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Self::Processed => "processed",
            Self::Ignored => "ignored",
            Self::Duplicate => "duplicate",
            Self::DeadLettered => "dead_lettered",
        }
    }
}

/// Messages buffered per worker before the poll loop waits.
const WORKER_QUEUE: usize = 256;

/// The worker of a partition (a stable hash of topic and partition).
fn worker_for(topic: &str, partition: i32, workers: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (topic, partition).hash(&mut h);
    (h.finish() % workers.max(1) as u64) as usize
}

/// Shutdown arrived before the message was finished; its offset stays uncommitted.
struct Interrupted;

/// Consumes one group's topics into a [`Handler`] (see the module docs).
pub struct Consumer<H> {
    pool: PgPool,
    kafka: KafkaSettings,
    settings: ConsumerSettings,
    handler: H,
    consumer: Arc<kafka::OffRuntimeDrop<StreamConsumer>>,
    dlq: kafka::OffRuntimeDrop<FutureProducer>,
    /// Per partition, the offset after the last handled message, not committed yet.
    marked: std::sync::Mutex<BTreeMap<(String, i32), i64>>,
}

impl<H: Handler> Consumer<H> {
    /// Builds the Kafka clients; connects nothing yet.
    pub fn new(
        pool: PgPool,
        kafka: &KafkaSettings,
        settings: ConsumerSettings,
        handler: H,
    ) -> Result<Self, OutboxError> {
        if !settings.sources.is_empty()
            && let Some(topic) = settings.topics.iter().find(|t| !settings.sources.contains_key(*t))
        {
            return Err(OutboxError::NoSource { topic: topic.clone() });
        }
        let session = settings.session_timeout_ms.to_string();
        let poll = settings.max_poll_interval_ms.to_string();
        let mut config = kafka::client_config(
            kafka,
            &[
                ("auto.offset.reset", &settings.auto_offset_reset),
                ("session.timeout.ms", &session),
                // Caps the wait of an empty fetch (Kafka answers one as soon as
                // data arrives; a broker that does not then adds at most this).
                ("fetch.wait.max.ms", "100"),
            ],
        );
        // What the processing guarantees rely on: not overridable.
        config
            .set("group.id", kafka::group_name(kafka, &settings.group_id))
            .set("max.poll.interval.ms", &poll)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let consumer: StreamConsumer = config.create()?;
        let dlq: FutureProducer =
            kafka::client_config(kafka, &[("acks", "all"), ("enable.idempotence", "true")]).create()?;
        // The error and DLQ counters of every topic exist from the start (at 0):
        // an alert's rate() sees the first one.
        for topic in &settings.topics {
            let topic = kafka::topic_name(kafka, topic);
            for name in [m::CONSUMER_ERRORS_TOTAL, m::CONSUMER_DLQ_TOTAL] {
                metrics::counter!(name, "group" => settings.group_id.clone(), "topic" => topic.clone())
                    .absolute(0);
            }
        }
        Ok(Self {
            pool,
            kafka: kafka.clone(),
            settings,
            handler,
            consumer: Arc::new(kafka::OffRuntimeDrop::new(consumer, "consumer")),
            dlq: kafka::OffRuntimeDrop::new(dlq, "dlq-producer"),
            marked: std::sync::Mutex::new(BTreeMap::new()),
        })
    }

    /// Why `event` is not from its topic's publisher, if it is not (see
    /// [`ConsumerSettings::sources`]).
    fn untrusted(&self, event: &ReceivedEvent) -> Option<String> {
        if self.settings.sources.is_empty() {
            return None;
        }
        let aggregate = (event.topic.strip_prefix(self.kafka.topic_prefix.as_str()))
            .and_then(|rest| rest.strip_prefix('.'))
            .unwrap_or(&event.topic);
        match self.settings.sources.get(aggregate) {
            Some(expected) if *expected == event.source => None,
            Some(expected) => Some(format!(
                "ce_source {:?} is not {expected:?}, the publisher of topic {}",
                event.source, event.topic
            )),
            None => Some(format!("topic {} has no known publisher", event.topic)),
        }
    }

    fn topics(&self) -> Vec<String> {
        self.settings.topics.iter().map(|t| kafka::topic_name(&self.kafka, t)).collect()
    }

    /// Consumes until `shutdown` is cancelled; the message in hand is finished
    /// first unless it is waiting for a retry (then it is redelivered later).
    pub async fn run(self, shutdown: CancellationToken) {
        let topics = self.topics();
        let mut all = topics.clone();
        all.extend(topics.iter().map(|t| kafka::dlq_topic(t)));
        let mut backoff = Backoff::new(self.settings.retry_base_ms, self.settings.retry_max_ms.max(1_000));
        while let Err(e) = kafka::ensure_topics(&self.kafka, &all, self.settings.topic_settings).await {
            let delay = backoff.next_delay();
            tracing::warn!(error = %e, retry_in = ?delay, "cannot create the consumer's topics");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        if self.settings.crash_point != ConsumerCrashPoint::Off {
            tracing::warn!(crash_point = ?self.settings.crash_point, group = %self.settings.group_id,
                "consumer fault injection is on");
        }
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        if let Err(e) = self.consumer.subscribe(&names) {
            tracing::error!(error = %e, "cannot subscribe; consumer not started");
            return;
        }
        let this = Arc::new(self);
        let workers: Vec<_> = (0..this.settings.concurrency.max(1))
            .map(|_| {
                let (tx, rx) = tokio::sync::mpsc::channel::<OwnedMessage>(WORKER_QUEUE);
                (tx, tokio::spawn(Arc::clone(&this).work(rx, shutdown.clone())))
            })
            .collect();
        let mut lag_tick =
            tokio::time::interval(Duration::from_millis(this.settings.lag_interval_ms.max(100)));
        let mut purge_tick = tokio::time::interval(INBOX_PURGE_EVERY);
        let mut commit_tick =
            tokio::time::interval(Duration::from_millis(this.settings.commit_interval_ms.max(1)));
        commit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = commit_tick.tick() => this.commit_marked(CommitMode::Async),
                _ = lag_tick.tick() => this.report_lag(),
                _ = purge_tick.tick() => this.purge_inbox_in_background(),
                received = this.consumer.recv() => match received {
                    Ok(msg) => {
                        let msg = msg.detach();
                        // One partition, one worker: the partition stays in order.
                        let worker = worker_for(msg.topic(), msg.partition(), workers.len());
                        if workers[worker].0.send(msg).await.is_err() {
                            break; // the worker stopped: shutting down
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, group = %this.settings.group_id, "kafka consume error");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        for (tx, handle) in workers {
            drop(tx);
            if let Err(e) = handle.await {
                tracing::error!(error = %e, "consumer worker panicked");
            }
        }
        // What the workers finished: librdkafka's close waits for this
        // commit before it leaves the group.
        this.commit_marked(CommitMode::Async);
        let group = this.settings.group_id.clone();
        // Leaves the group and destroys the clients, off the runtime (see `kafka::close`).
        kafka::close(this, "consumer", Duration::from_secs(5)).await;
        tracing::info!(%group, "consumer stopped");
    }

    /// Handles the messages of the partitions routed to this worker, in order.
    async fn work(
        self: Arc<Self>,
        mut rx: tokio::sync::mpsc::Receiver<OwnedMessage>,
        shutdown: CancellationToken,
    ) {
        loop {
            let msg = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                msg = rx.recv() => match msg {
                    Some(msg) => msg,
                    None => return,
                },
            };
            let batch = self.fill_batch(msg, &mut rx, &shutdown).await;
            let done = match batch.as_slice() {
                [msg] => self.process(msg, &shutdown).await,
                msgs => self.process_batch(msgs, &shutdown).await,
            };
            if done.is_err() {
                return;
            }
        }
    }

    /// `first` and what follows it within `batch_wait_ms`, up to `batch_size` messages.
    async fn fill_batch(
        &self,
        first: OwnedMessage,
        rx: &mut tokio::sync::mpsc::Receiver<OwnedMessage>,
        shutdown: &CancellationToken,
    ) -> Vec<OwnedMessage> {
        let size = self.settings.batch_size.max(1);
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.settings.batch_wait_ms);
        while batch.len() < size {
            match rx.try_recv() {
                Ok(msg) => batch.push(msg),
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => break,
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                    if self.settings.batch_wait_ms == 0 {
                        break;
                    }
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break,
                        next = tokio::time::timeout_at(deadline, rx.recv()) => match next {
                            Ok(Some(msg)) => batch.push(msg),
                            // The wait is over, or the consumer is stopping.
                            Ok(None) | Err(_) => break,
                        },
                    }
                }
            }
        }
        batch
    }

    /// Handles one message inside its `process {topic}` span: a new trace,
    /// linked to the producer's span named by the message's trace headers.
    async fn process(&self, msg: &OwnedMessage, shutdown: &CancellationToken) -> Result<(), Interrupted> {
        let span = process_span(msg, &self.settings.group_id);
        self.process_in_span(msg, shutdown, &span).instrument(span.clone()).await
    }

    async fn process_in_span(
        &self,
        msg: &OwnedMessage,
        shutdown: &CancellationToken,
        span: &tracing::Span,
    ) -> Result<(), Interrupted> {
        let outcome = match ReceivedEvent::from_message(msg) {
            Err(e) => {
                tracing::warn!(error = %e, topic = msg.topic(), offset = msg.offset(), "poison message");
                self.dead_letter(msg, DlqReason::InvalidEnvelope, &e.to_string(), 1, shutdown).await?
            }
            Ok(event) => match self.untrusted(&event) {
                Some(why) => {
                    tracing::warn!(%why, topic = msg.topic(), offset = msg.offset(), "untrusted source");
                    self.dead_letter(msg, DlqReason::UntrustedSource, &why, 1, shutdown).await?
                }
                None if !self.handler.wants(&event) => Outcome::Ignored,
                None => self.handle_with_retries(msg, &event, shutdown).await?,
            },
        };
        if let Outcome::DeadLettered = outcome {
            span.set_status(Status::error("dead-lettered"));
        }
        self.count(msg, &outcome);
        self.mark(std::slice::from_ref(msg));
        Ok(())
    }

    /// Handles `msgs` (one worker's, in partition order) in one transaction;
    /// see the module docs.
    async fn process_batch(
        &self,
        msgs: &[OwnedMessage],
        shutdown: &CancellationToken,
    ) -> Result<(), Interrupted> {
        let Ok(events) = msgs.iter().map(ReceivedEvent::from_message).collect::<Result<Vec<_>, _>>() else {
            // A poison message: the one-at-a-time path dead-letters it.
            return self.one_by_one(msgs, shutdown).await;
        };
        if events.iter().any(|e| self.untrusted(e).is_some()) {
            // So is one from an untrusted source.
            return self.one_by_one(msgs, shutdown).await;
        }
        let group = &self.settings.group_id;
        let spans: Vec<tracing::Span> = msgs.iter().map(|msg| process_span(msg, group)).collect();
        match self.handle_batch(&events, &spans).await {
            Ok(outcomes) => {
                for (msg, outcome) in msgs.iter().zip(&outcomes) {
                    self.count(msg, outcome);
                }
                self.mark(msgs);
                Ok(())
            }
            Err(e) => {
                tracing::debug!(error = %e, messages = msgs.len(), "batch failed; handling its messages one at a time");
                for span in spans {
                    span.set_status(Status::error(
                        "batch rolled back; the message is handled again on its own",
                    ));
                }
                self.one_by_one(msgs, shutdown).await
            }
        }
    }

    async fn one_by_one(
        &self,
        msgs: &[OwnedMessage],
        shutdown: &CancellationToken,
    ) -> Result<(), Interrupted> {
        for msg in msgs {
            self.process(msg, shutdown).await?;
        }
        Ok(())
    }

    /// Inbox rows and handlers of `events` in one transaction: one statement
    /// records every wanted event in the inbox and says which are new; the
    /// handler then gets the new ones ([`Handler::handle_many`]).
    async fn handle_batch(
        &self,
        events: &[ReceivedEvent],
        spans: &[tracing::Span],
    ) -> Result<Vec<Outcome>, HandlerError> {
        let db = |e: sqlx::Error| HandlerError::Retryable(format!("database: {e}"));
        let wanted: Vec<&ReceivedEvent> = events.iter().filter(|e| self.handler.wants(e)).collect();
        if wanted.is_empty() {
            return Ok(vec![Outcome::Ignored; events.len()]);
        }
        let mut tx = self.pool.begin().await.map_err(db)?;
        let new: std::collections::HashSet<Uuid> = sqlx::query_scalar(
            "INSERT INTO inbox (consumer_group, event_id, event_type, topic, kafka_partition, kafka_offset)
             SELECT $1, * FROM UNNEST($2::uuid[], $3::text[], $4::text[], $5::int[], $6::bigint[])
             ON CONFLICT DO NOTHING
             RETURNING event_id",
        )
        .bind(&self.settings.group_id)
        .bind(wanted.iter().map(|e| e.id).collect::<Vec<_>>())
        .bind(wanted.iter().map(|e| e.event_type.as_str()).collect::<Vec<_>>())
        .bind(wanted.iter().map(|e| e.topic.as_str()).collect::<Vec<_>>())
        .bind(wanted.iter().map(|e| e.partition).collect::<Vec<_>>())
        .bind(wanted.iter().map(|e| e.offset).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?
        .into_iter()
        .collect();
        let mut outcomes = Vec::with_capacity(events.len());
        let mut seen = std::collections::HashSet::with_capacity(events.len());
        let mut fresh = Vec::with_capacity(events.len());
        let mut fresh_spans = Vec::with_capacity(events.len());
        for (event, span) in events.iter().zip(spans) {
            let outcome = if !self.handler.wants(event) {
                Outcome::Ignored
            } else if !new.contains(&event.id) || !seen.insert(event.id) {
                // In the inbox before, or twice in this batch (a redelivery).
                Outcome::Duplicate
            } else {
                fresh.push(event);
                fresh_spans.push(span.clone());
                Outcome::Processed
            };
            outcomes.push(outcome);
        }
        if !fresh.is_empty() {
            self.handler.handle_many(&mut tx, &fresh, &fresh_spans).await?;
        }
        tx.commit().await.map_err(db)?;
        if self.settings.crash_point == ConsumerCrashPoint::BeforeOffsetCommit && !fresh.is_empty() {
            crash::abort(&format!(
                "consumer group {}: {} events handled and committed, offsets not committed",
                self.settings.group_id,
                fresh.len()
            ));
        }
        Ok(outcomes)
    }

    fn count(&self, msg: &OwnedMessage, outcome: &Outcome) {
        metrics::counter!(m::CONSUMER_PROCESSED_TOTAL, "group" => self.settings.group_id.clone(),
            "topic" => msg.topic().to_string(), "outcome" => outcome.label())
        .increment(1);
    }

    /// Marks `msgs` handled: their offsets go out with the next commit (at
    /// once with `commit_interval_ms = 0`).
    fn mark(&self, msgs: &[OwnedMessage]) {
        {
            let mut marked = self.marked.lock().unwrap_or_else(|p| p.into_inner());
            for msg in msgs {
                let next = marked.entry((msg.topic().to_owned(), msg.partition())).or_insert(0);
                *next = (*next).max(msg.offset() + 1);
            }
        }
        if self.settings.commit_interval_ms == 0 {
            self.commit_marked(CommitMode::Async);
        }
    }

    /// Commits, per partition, the offset after the last marked message.
    fn commit_marked(&self, mode: CommitMode) {
        let marked = std::mem::take(&mut *self.marked.lock().unwrap_or_else(|p| p.into_inner()));
        if marked.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        let committed = marked
            .iter()
            .try_for_each(|((topic, partition), offset)| {
                tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))
            })
            .and_then(|()| self.consumer.commit(&tpl, mode));
        if let Err(e) = committed {
            // The messages are redelivered later, which the inbox makes harmless.
            tracing::warn!(error = %e, "offset commit failed");
        }
    }

    async fn handle_with_retries(
        &self,
        msg: &OwnedMessage,
        event: &ReceivedEvent,
        shutdown: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let mut backoff = Backoff::new(self.settings.retry_base_ms, self.settings.retry_max_ms);
        let max = self.settings.max_attempts.max(1);
        let mut attempt = 1;
        loop {
            // What went wrong, the reason it is parked under, and whether another try may help.
            let (error, reason, retry) = match self.handle_once(event).await {
                Ok(outcome) => return Ok(outcome),
                Err(HandlerError::Permanent(e)) => (e, DlqReason::Rejected, false),
                Err(HandlerError::UnsupportedSchemaVersion(e)) => (
                    e,
                    DlqReason::UnsupportedSchemaVersion,
                    self.settings.unsupported_schema_version == UnsupportedVersionPolicy::Retry,
                ),
                Err(HandlerError::Retryable(e)) => (e, DlqReason::RetriesExhausted, true),
            };
            metrics::counter!(m::CONSUMER_ERRORS_TOTAL, "group" => self.settings.group_id.clone(),
                "topic" => event.topic.clone())
            .increment(1);
            if !retry || attempt >= max {
                tracing::warn!(error = %error, event_id = %event.id, attempt, reason = reason.label(), "dead-lettering event");
                return self.dead_letter(msg, reason, &error, attempt, shutdown).await;
            }
            let delay = backoff.next_delay();
            tracing::info!(error = %error, event_id = %event.id, attempt, retry_in = ?delay, "retrying event");
            tokio::select! {
                _ = shutdown.cancelled() => return Err(Interrupted),
                _ = tokio::time::sleep(delay) => {}
            }
            attempt += 1;
        }
    }

    /// Inbox row + handler in one transaction (a batch of one, in the
    /// current span: the message's).
    async fn handle_once(&self, event: &ReceivedEvent) -> Result<Outcome, HandlerError> {
        let span = tracing::Span::current();
        let outcomes = self.handle_batch(std::slice::from_ref(event), std::slice::from_ref(&span)).await?;
        Ok(outcomes[0])
    }

    /// Sends `msg` to `<topic>.dlq` and waits for the ack, retrying until it
    /// is acked or shutdown arrives.
    async fn dead_letter(
        &self,
        msg: &OwnedMessage,
        reason: DlqReason,
        error: &str,
        attempts: u32,
        shutdown: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let topic = kafka::dlq_topic(msg.topic());
        let attempts = attempts.to_string();
        let partition = msg.partition().to_string();
        let offset = msg.offset().to_string();
        let mut backoff = Backoff::new(self.settings.retry_base_ms, self.settings.retry_max_ms.max(1_000));
        loop {
            let mut h = msg.headers().cloned().unwrap_or_default();
            for (key, value) in [
                (headers::DLQ_REASON, reason.label()),
                (headers::DLQ_ERROR, error),
                (headers::DLQ_ATTEMPTS, attempts.as_str()),
                (headers::DLQ_ORIGINAL_TOPIC, msg.topic()),
                (headers::DLQ_ORIGINAL_PARTITION, partition.as_str()),
                (headers::DLQ_ORIGINAL_OFFSET, offset.as_str()),
                (headers::DLQ_GROUP, self.settings.group_id.as_str()),
            ] {
                h = h.insert(Header { key, value: Some(value) });
            }
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic).headers(h);
            if let Some(k) = msg.key() {
                record = record.key(k);
            }
            if let Some(p) = msg.payload() {
                record = record.payload(p);
            }
            match self.dlq.send(record, Duration::from_secs(5)).await {
                Ok(_) => break,
                Err((e, _)) => {
                    let delay = backoff.next_delay();
                    tracing::error!(error = %e, dlq = %topic, retry_in = ?delay, "dead-letter send failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Err(Interrupted),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        metrics::counter!(m::CONSUMER_DLQ_TOTAL, "group" => self.settings.group_id.clone(),
            "topic" => msg.topic().to_string())
        .increment(1);
        Ok(Outcome::DeadLettered)
    }

    /// Deletes the group's expired inbox rows on a task of its own, so a long
    /// purge never holds up consuming.
    fn purge_inbox_in_background(&self) {
        let (pool, group, hours) =
            (self.pool.clone(), self.settings.group_id.clone(), self.settings.inbox_retention_hours);
        tokio::spawn(async move {
            match purge_inbox(&pool, &group, hours).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(rows = n, %group, "purged expired inbox rows"),
                Err(e) => tracing::warn!(error = %e, %group, "inbox purge failed"),
            }
        });
    }

    /// Sets `consumer_lag` per assigned partition (on a blocking thread:
    /// `fetch_watermarks` waits for the broker).
    fn report_lag(&self) {
        let consumer = Arc::clone(&self.consumer);
        let group = self.settings.group_id.clone();
        tokio::task::spawn_blocking(move || {
            let Ok(positions) = consumer.position() else { return };
            for p in positions.elements() {
                let Offset::Offset(position) = p.offset() else { continue };
                match consumer.fetch_watermarks(p.topic(), p.partition(), Duration::from_secs(1)) {
                    Ok((_, high)) => {
                        metrics::gauge!(m::CONSUMER_LAG, "group" => group.clone(),
                            "topic" => p.topic().to_string(), "partition" => p.partition().to_string())
                        .set((high - position).max(0) as f64);
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot fetch watermarks"),
                }
            }
        });
    }
}

/// The consumer span of `msg` (see [`consumer_span`]).
fn process_span(msg: &OwnedMessage, group: &str) -> tracing::Span {
    let producer = context_from_pairs(
        msg.headers().into_iter().flat_map(|h| h.iter()).map(|h| (h.key, h.value.unwrap_or_default())),
    );
    let mut message = KafkaMessage::new(msg.topic())
        .with_partition(msg.partition())
        .with_offset(msg.offset())
        .with_consumer_group(group);
    if let Some(key) = msg.key().and_then(|k| std::str::from_utf8(k).ok()) {
        message = message.with_key(key);
    }
    consumer_span(&message, &producer)
}

/// How often a consumer deletes its group's expired inbox rows.
const INBOX_PURGE_EVERY: Duration = Duration::from_secs(3600);

/// Deletes `group`'s inbox rows older than `retention_hours`, in chunks;
/// returns how many. Other groups' rows are left alone.
pub async fn purge_inbox(pool: &PgPool, group: &str, retention_hours: i64) -> Result<u64, sqlx::Error> {
    crate::delete_in_chunks(|| {
        sqlx::query(
            "DELETE FROM inbox WHERE (consumer_group, event_id) IN (
                 SELECT consumer_group, event_id FROM inbox
                 WHERE consumer_group = $1 AND processed_at < now() - make_interval(hours => $2)
                 LIMIT $3)",
        )
        // Planned on every run: a plan cached while the table was small scans it whole.
        .persistent(false)
        .bind(group)
        .bind(i32::try_from(retention_hours.max(0)).unwrap_or(i32::MAX))
        .bind(crate::PURGE_CHUNK)
        .execute(pool)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Timestamp;
    use rdkafka::message::OwnedHeaders;

    fn message(headers: &[(&str, &str)]) -> OwnedMessage {
        let h = headers
            .iter()
            .fold(OwnedHeaders::new(), |h, (key, value)| h.insert(Header { key, value: Some(*value) }));
        OwnedMessage::new(
            Some(b"{\"a\":1}".to_vec()),
            Some(b"key-1".to_vec()),
            "t.order".into(),
            Timestamp::NotAvailable,
            2,
            41,
            Some(h),
        )
    }

    const ID: &str = "0195f2a4-7c1e-7d2b-9a51-3c2b1d0e9f10";

    #[test]
    fn parses_the_cloudevents_envelope() {
        let e = ReceivedEvent::from_message(&message(&[
            ("ce_id", ID),
            ("ce_type", "OrderCreated"),
            ("ce_source", "/sagaworks/order"),
            ("ce_schemaversion", "2"),
            ("ce_time", "2026-01-02T03:04:05.123456Z"),
            ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ]))
        .unwrap();
        assert_eq!(e.id.to_string(), ID);
        assert_eq!(e.event_type, "OrderCreated");
        assert_eq!(e.source, "/sagaworks/order");
        assert_eq!(e.schema_version, 2);
        assert_eq!(e.aggregate_id, "key-1", "falls back to the key without ce_aggregateid");
        assert_eq!(e.time.unwrap().to_rfc3339(), "2026-01-02T03:04:05.123456+00:00");
        assert_eq!(e.traceparent.as_deref(), Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assert_eq!((e.topic.as_str(), e.partition, e.offset), ("t.order", 2, 41));
        assert_eq!(e.header("ce_type"), Some(b"OrderCreated".as_slice()));
        assert_eq!(e.json::<serde_json::Value>().unwrap()["a"], 1);
    }

    #[test]
    fn a_message_without_a_valid_id_or_type_is_poison() {
        let err = ReceivedEvent::from_message(&message(&[("ce_type", "X")])).unwrap_err();
        assert_eq!(err, EnvelopeError::Missing("ce_id"));
        let err = ReceivedEvent::from_message(&message(&[("ce_id", "nope"), ("ce_type", "X")])).unwrap_err();
        assert_eq!(err, EnvelopeError::Invalid("ce_id", "nope".into()));
        let err = ReceivedEvent::from_message(&message(&[("ce_id", ID), ("ce_type", "")])).unwrap_err();
        assert_eq!(err, EnvelopeError::Missing("ce_type"));
        let err = ReceivedEvent::from_message(&message(&[
            ("ce_id", ID),
            ("ce_type", "X"),
            ("ce_time", "yesterday"),
        ]))
        .unwrap_err();
        assert_eq!(err, EnvelopeError::Invalid("ce_time", "yesterday".into()));
    }

    #[test]
    fn a_partition_always_maps_to_the_same_worker() {
        for p in 0..50 {
            let w = worker_for("t.order", p, 4);
            assert!(w < 4);
            assert_eq!(w, worker_for("t.order", p, 4));
        }
        let used: std::collections::HashSet<_> = (0..50).map(|p| worker_for("t.order", p, 4)).collect();
        assert!(used.len() > 1, "partitions spread over workers");
    }
}
