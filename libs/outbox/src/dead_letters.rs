//! Operating dead-letter topics: list, show, replay and discard the messages
//! a [`Consumer`](crate::Consumer) parked in `<topic>.dlq`.
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

use crate::OutboxError;
use crate::kafka::{self, OffRuntimeDrop, headers};
use chrono::{DateTime, Utc};
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use sagaworks_config::KafkaSettings;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Gauge: messages in a dead-letter topic (`topic` = the DLQ topic).
pub const DLQ_SIZE: &str = "dlq_size";
/// Gauge: messages in a dead-letter topic neither replayed nor discarded.
pub const DLQ_PENDING: &str = "dlq_pending";

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

/// A message's place in its dead-letter topic, written `<partition>-<offset>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId {
    pub partition: i32,
    pub offset: i64,
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.partition, self.offset)
    }
}

impl Serialize for MessageId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl FromStr for MessageId {
    type Err = DeadLetterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || DeadLetterError::Invalid(format!("{s:?} is not a message id (<partition>-<offset>)"));
        let (p, o) = s.split_once('-').ok_or_else(bad)?;
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(p) || !digits(o) {
            return Err(bad());
        }
        // Digits beyond the range name no message that can exist: they
        // saturate (a lookup finds nothing, a cursor is past the end).
        let saturating = |t: &str, max: i64| t.parse::<i64>().map_or(max, |n| n.min(max));
        Ok(Self { partition: saturating(p, i32::MAX.into()) as i32, offset: saturating(o, i64::MAX) })
    }
}

/// Where a dead-lettered message was consumed from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Position {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// What became of a dead-lettered message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Pending,
    Replayed,
    Discarded,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Replayed => "replayed",
            State::Discarded => "discarded",
        }
    }
}

impl FromStr for State {
    type Err = DeadLetterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(State::Pending),
            "replayed" => Ok(State::Replayed),
            "discarded" => Ok(State::Discarded),
            other => {
                Err(DeadLetterError::Invalid(format!("{other:?} is not pending, replayed or discarded")))
            }
        }
    }
}

/// An operator's replay or discard of a message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActionRecord {
    /// `replay` or `discard`.
    pub action: String,
    pub actor: String,
    pub reason: String,
    pub at: DateTime<Utc>,
}

/// One dead-lettered message, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetter {
    pub id: MessageId,
    /// The original topic as configured (`order`).
    pub topic: String,
    pub dlq_topic: String,
    pub key: Option<String>,
    pub original: Option<Position>,
    /// The consumer group that dead-lettered it.
    pub group: Option<String>,
    /// Why it was parked (`dlq_reason`: `invalid_envelope`, `rejected`, `retries_exhausted`,
    /// `unsupported_schema_version`, `untrusted_source` or `unexpected_type`); none on
    /// messages parked before the header existed.
    pub reason: Option<String>,
    pub error: String,
    pub attempts: u32,
    pub dead_lettered_at: Option<DateTime<Utc>>,
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    /// Every header, values as (lossy UTF-8) text.
    pub headers: BTreeMap<String, String>,
    /// The payload as (lossy UTF-8) text, at most `max_payload_bytes`.
    pub payload: String,
    pub payload_bytes: usize,
    pub payload_truncated: bool,
    pub state: State,
    pub actions: Vec<ActionRecord>,
}

/// Which messages [`DeadLetters::list`] returns.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<State>,
    pub key: Option<String>,
}

/// A page of [`DeadLetters::list`]; `next_cursor` is `None` on the last.
#[derive(Debug, Clone)]
pub struct Page {
    pub messages: Vec<DeadLetter>,
    pub next_cursor: Option<MessageId>,
}

/// A dead-letter topic's counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopicSummary {
    pub topic: String,
    pub dlq_topic: String,
    pub messages: u64,
    pub pending: u64,
}

/// What a replay takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// This message (it must be pending).
    One(MessageId),
    /// The pending messages of this key.
    Key(String),
    /// Every pending message.
    AllPending,
}

impl Selector {
    fn to_json(&self) -> serde_json::Value {
        match self {
            Selector::One(id) => serde_json::json!({ "id": id.to_string() }),
            Selector::Key(key) => serde_json::json!({ "key": key }),
            Selector::AllPending => serde_json::json!({ "all": true }),
        }
    }
}

/// Who acts, why, and the key that makes a repeated call a replay of the first.
pub use sagaworks_runtime::operator::Operator;

/// What a replay or discard did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acted {
    /// The messages taken, in the order they were sent.
    pub ids: Vec<MessageId>,
    /// The key was used before for the same request: its answer, nothing done again.
    pub replayed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    #[error("no dead-letter topic is operated for {0:?}")]
    UnknownTopic(String),
    #[error("no message {0} in the dead-letter topic")]
    NotFound(MessageId),
    #[error("message {id} is {state}, not pending", state = state.as_str())]
    NotPending { id: MessageId, state: State },
    #[error("the Idempotency-Key was used for a different request")]
    KeyReused,
    /// Messages that are not what the topic's publisher wrote (see the module
    /// docs); nothing was sent.
    #[error("replay refused, nothing sent: {}", refusals(.0))]
    Refused(Vec<Refusal>),
    #[error("{0}")]
    Invalid(String),
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// A dead letter a replay refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub id: MessageId,
    pub why: String,
}

fn refusals(all: &[Refusal]) -> String {
    all.iter().map(|r| format!("message {}: {}", r.id, r.why)).collect::<Vec<_>>().join("; ")
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

    /// Every operated topic's counts.
    pub async fn summaries(&self) -> Result<Vec<TopicSummary>, DeadLetterError> {
        let mut out = Vec::new();
        for topic in &self.inner.settings.topics {
            let dlq_topic = self.dlq_topic(topic)?;
            let marks = self.watermarks(&dlq_topic).await?;
            let messages: u64 = marks.iter().map(|(_, low, high)| (high - low).max(0) as u64).sum();
            let acted = self.acted_count(&dlq_topic, &marks).await?;
            out.push(TopicSummary {
                topic: topic.clone(),
                dlq_topic,
                messages,
                pending: messages.saturating_sub(acted),
            });
        }
        Ok(out)
    }

    /// Refreshes the `dlq_size` and `dlq_pending` gauges every
    /// `gauge_interval_ms` until `shutdown`.
    pub async fn run_gauges(self, shutdown: CancellationToken) {
        let every = Duration::from_millis(self.inner.settings.gauge_interval_ms.max(100));
        loop {
            match self.summaries().await {
                Ok(summaries) => {
                    for s in summaries {
                        metrics::gauge!(DLQ_SIZE, "topic" => s.dlq_topic.clone()).set(s.messages as f64);
                        metrics::gauge!(DLQ_PENDING, "topic" => s.dlq_topic).set(s.pending as f64);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot count dead letters"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    /// The messages of `topic`'s DLQ after `cursor` that pass `filter`,
    /// oldest first, at most `limit`.
    pub async fn list(
        &self,
        topic: &str,
        filter: &ListFilter,
        cursor: Option<MessageId>,
        limit: usize,
    ) -> Result<Page, DeadLetterError> {
        let dlq_topic = self.dlq_topic(topic)?;
        // Unfiltered, the message after the page is all it takes to know there is more.
        let unfiltered = filter.state.is_none() && filter.key.is_none();
        let max = if unfiltered {
            self.inner.settings.max_scan.min(limit + 1)
        } else {
            self.inner.settings.max_scan
        };
        let (raw, scanned_to) = self.scan(&dlq_topic, cursor, max).await?;
        let actions = self.actions(&dlq_topic, raw.iter().map(|m| m.id)).await?;
        let mut messages = Vec::new();
        let mut next_cursor = scanned_to;
        for m in raw {
            let letter =
                m.into_dead_letter(topic, &dlq_topic, &actions, self.inner.settings.max_payload_bytes);
            if filter.state.is_some_and(|s| s != letter.state)
                || filter.key.as_ref().is_some_and(|k| letter.key.as_ref() != Some(k))
            {
                continue;
            }
            if messages.len() == limit {
                // There is more: the page ends at the last one returned.
                next_cursor = messages.last().map(|l: &DeadLetter| l.id);
                break;
            }
            messages.push(letter);
        }
        Ok(Page { messages, next_cursor })
    }

    /// One message of `topic`'s DLQ.
    pub async fn get(&self, topic: &str, id: MessageId) -> Result<DeadLetter, DeadLetterError> {
        let dlq_topic = self.dlq_topic(topic)?;
        let raw = self.read_one(&dlq_topic, id).await?;
        let actions = self.actions(&dlq_topic, [id]).await?;
        Ok(raw.into_dead_letter(topic, &dlq_topic, &actions, self.inner.settings.max_payload_bytes))
    }

    /// Sends the pending messages `selector` names back to their original
    /// topic, in their original order, and records it (see the module docs).
    pub async fn replay(
        &self,
        topic: &str,
        selector: Selector,
        operator: &Operator,
    ) -> Result<Acted, DeadLetterError> {
        let dlq_topic = self.dlq_topic(topic)?;
        let original_topic = kafka::topic_name(&self.inner.kafka, topic);
        if let Some(done) = self.earlier(&dlq_topic, "replay", &selector, operator).await? {
            return Ok(done);
        }
        let mut chosen = self.pending(&dlq_topic, &selector).await?;
        // Original order: a key's messages were consumed from one partition,
        // in offset order; DLQ order breaks ties (and orders the messages
        // that lack the original position).
        chosen.sort_by_key(|m| (m.original_position(), m.id));
        let mut tx = self.inner.pool.begin().await?;
        let taken = record(&mut tx, &dlq_topic, "replay", &selector, operator, &chosen).await?;
        let Some(taken) = taken else {
            tx.rollback().await?;
            return self
                .earlier(&dlq_topic, "replay", &selector, operator)
                .await?
                .ok_or(DeadLetterError::KeyReused);
        };
        if let Selector::One(id) = selector
            && !taken.contains(&id)
        {
            return Err(self.not_pending(&dlq_topic, id).await);
        }
        let chosen: Vec<&RawMessage> = chosen.iter().filter(|m| taken.contains(&m.id)).collect();
        let (originals, refused) = self.originals(&original_topic, &chosen).await?;
        if !refused.is_empty() {
            tx.rollback().await?;
            self.record_refusals(&dlq_topic, operator, &refused).await?;
            tracing::warn!(dlq = %dlq_topic, actor = %operator.actor, refused = %refusals(&refused),
                "dead-letter replay refused: not what the topic's publisher wrote");
            return Err(DeadLetterError::Refused(refused));
        }
        let mut sent = HashSet::new();
        let mut ids = Vec::new();
        for (m, original) in chosen.iter().zip(&originals) {
            ids.push(m.id);
            // A message two groups dead-lettered is in the DLQ twice: send it once.
            if !sent.insert(original.id) {
                continue;
            }
            self.send_back(&original_topic, &dlq_topic, m.id, original).await?;
        }
        tx.commit().await?;
        tracing::info!(dlq = %dlq_topic, messages = ids.len(), actor = %operator.actor, reason = %operator.reason,
            "dead letters replayed");
        Ok(Acted { ids, replayed: false })
    }

    /// Records that an operator decided message `id` needs nothing.
    pub async fn discard(
        &self,
        topic: &str,
        id: MessageId,
        operator: &Operator,
    ) -> Result<Acted, DeadLetterError> {
        let dlq_topic = self.dlq_topic(topic)?;
        let selector = Selector::One(id);
        if let Some(done) = self.earlier(&dlq_topic, "discard", &selector, operator).await? {
            return Ok(done);
        }
        let chosen = self.pending(&dlq_topic, &selector).await?;
        let mut tx = self.inner.pool.begin().await?;
        let Some(taken) = record(&mut tx, &dlq_topic, "discard", &selector, operator, &chosen).await? else {
            tx.rollback().await?;
            return self
                .earlier(&dlq_topic, "discard", &selector, operator)
                .await?
                .ok_or(DeadLetterError::KeyReused);
        };
        if !taken.contains(&id) {
            return Err(self.not_pending(&dlq_topic, id).await);
        }
        tx.commit().await?;
        tracing::info!(dlq = %dlq_topic, %id, actor = %operator.actor, reason = %operator.reason, "dead letter discarded");
        Ok(Acted { ids: vec![id], replayed: false })
    }

    /// The answer of an earlier request with this key (`None`: the key is new).
    async fn earlier(
        &self,
        dlq_topic: &str,
        action: &str,
        selector: &Selector,
        operator: &Operator,
    ) -> Result<Option<Acted>, DeadLetterError> {
        let row: Option<(String, serde_json::Value)> = sqlx::query_as(
            "SELECT action, selector FROM dead_letter_requests WHERE dlq_topic = $1 AND idempotency_key = $2",
        )
        .bind(dlq_topic)
        .bind(&operator.idempotency_key)
        .fetch_optional(&self.inner.pool)
        .await?;
        let Some((was, was_selector)) = row else { return Ok(None) };
        if was != action || was_selector != selector.to_json() {
            return Err(DeadLetterError::KeyReused);
        }
        let ids: Vec<(i32, i64)> = sqlx::query_as(
            "SELECT dlq_partition, dlq_offset FROM dead_letter_actions WHERE dlq_topic = $1 AND idempotency_key = $2",
        )
        .bind(dlq_topic)
        .bind(&operator.idempotency_key)
        .fetch_all(&self.inner.pool)
        .await?;
        let mut ids: Vec<MessageId> =
            ids.into_iter().map(|(partition, offset)| MessageId { partition, offset }).collect();
        ids.sort();
        Ok(Some(Acted { ids, replayed: true }))
    }

    /// The pending messages `selector` names (for `One`, the message whatever
    /// its state), from the first `max_scan` messages of the topic.
    async fn pending(
        &self,
        dlq_topic: &str,
        selector: &Selector,
    ) -> Result<Vec<RawMessage>, DeadLetterError> {
        let max = self.inner.settings.max_scan;
        let raw = match selector {
            Selector::One(id) => vec![self.read_one(dlq_topic, *id).await?],
            Selector::Key(key) => {
                let (all, _) = self.scan(dlq_topic, None, max).await?;
                all.into_iter().filter(|m| m.key.as_deref() == Some(key.as_bytes())).collect()
            }
            Selector::AllPending => self.scan(dlq_topic, None, max).await?.0,
        };
        if matches!(selector, Selector::One(_)) {
            return Ok(raw);
        }
        let acted = self.actions(dlq_topic, raw.iter().map(|m| m.id)).await?;
        Ok(raw.into_iter().filter(|m| !acted.contains_key(&m.id)).collect())
    }

    async fn not_pending(&self, dlq_topic: &str, id: MessageId) -> DeadLetterError {
        match self.actions(dlq_topic, [id]).await {
            Ok(actions) => {
                let state = actions.get(&id).map(|(s, _)| *s).unwrap_or(State::Pending);
                DeadLetterError::NotPending { id, state }
            }
            Err(e) => e,
        }
    }

    /// Per message of `chosen`, its original record in `original_topic`, or
    /// why there is none that it matches (see the module docs).
    async fn originals(
        &self,
        original_topic: &str,
        chosen: &[&RawMessage],
    ) -> Result<(Vec<RawMessage>, Vec<Refusal>), DeadLetterError> {
        let mut originals = Vec::with_capacity(chosen.len());
        let mut refused = Vec::new();
        for m in chosen {
            let why = match m.original_in(original_topic) {
                Err(why) => Some(why),
                Ok(at) => match self.read_at(original_topic, at).await? {
                    None => {
                        Some(format!("its original {original_topic}/{}/{} is gone", at.partition, at.offset))
                    }
                    Some(original) => match m.differs_from(&original) {
                        Some(what) => Some(format!(
                            "its {what} differs from its original {original_topic}/{}/{}",
                            at.partition, at.offset
                        )),
                        None => {
                            originals.push(original);
                            None
                        }
                    },
                },
            };
            if let Some(why) = why {
                refused.push(Refusal { id: m.id, why });
            }
        }
        Ok((originals, refused))
    }

    /// Records the `refused` messages of a replay by `operator`.
    async fn record_refusals(
        &self,
        dlq_topic: &str,
        operator: &Operator,
        refused: &[Refusal],
    ) -> Result<(), DeadLetterError> {
        let partitions: Vec<i32> = refused.iter().map(|r| r.id.partition).collect();
        let offsets: Vec<i64> = refused.iter().map(|r| r.id.offset).collect();
        let whys: Vec<&str> = refused.iter().map(|r| r.why.as_str()).collect();
        sqlx::query(
            "INSERT INTO dead_letter_refusals (dlq_topic, dlq_partition, dlq_offset, idempotency_key, actor, reason, why)
             SELECT $1, p, o, $2, $3, $4, w FROM unnest($5::int[], $6::bigint[], $7::text[]) AS m(p, o, w)
             ON CONFLICT DO NOTHING",
        )
        .bind(dlq_topic)
        .bind(&operator.idempotency_key)
        .bind(&operator.actor)
        .bind(&operator.reason)
        .bind(&partitions)
        .bind(&offsets)
        .bind(&whys)
        .execute(&self.inner.pool)
        .await?;
        Ok(())
    }

    /// Sends `original` (a record read from `original_topic`) to its partition
    /// there again, marked as replayed from dead letter `from`.
    async fn send_back(
        &self,
        original_topic: &str,
        dlq_topic: &str,
        from: MessageId,
        original: &RawMessage,
    ) -> Result<(), DeadLetterError> {
        let from = format!("{dlq_topic}/{}/{}", from.partition, from.offset);
        let mut h = OwnedHeaders::new();
        for (name, value) in &original.headers {
            if !name.starts_with("dlq_") {
                h = h.insert(Header { key: name, value: value.as_deref() });
            }
        }
        h = h.insert(Header { key: headers::DLQ_REPLAYED_FROM, value: Some(&from) });
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(original_topic).partition(original.id.partition).headers(h);
        if let Some(k) = &original.key {
            record = record.key(k);
        }
        if let Some(p) = &original.payload {
            record = record.payload(p);
        }
        self.inner.producer.send(record, BROKER_TIMEOUT).await.map_err(|(e, _)| e)?;
        Ok(())
    }

    /// Per message, its state and the operator's action on it.
    async fn actions(
        &self,
        dlq_topic: &str,
        ids: impl IntoIterator<Item = MessageId>,
    ) -> Result<BTreeMap<MessageId, (State, ActionRecord)>, DeadLetterError> {
        let (partitions, offsets): (Vec<i32>, Vec<i64>) =
            ids.into_iter().map(|id| (id.partition, id.offset)).unzip();
        if partitions.is_empty() {
            return Ok(BTreeMap::new());
        }
        let rows: Vec<(i32, i64, String, String, String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT a.dlq_partition, a.dlq_offset, r.action, r.actor, r.reason, r.at
             FROM dead_letter_actions a
             JOIN dead_letter_requests r USING (dlq_topic, idempotency_key)
             JOIN unnest($2::int[], $3::bigint[]) AS m(p, o) ON a.dlq_partition = m.p AND a.dlq_offset = m.o
             WHERE a.dlq_topic = $1",
        )
        .bind(dlq_topic)
        .bind(&partitions)
        .bind(&offsets)
        .fetch_all(&self.inner.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(partition, offset, action, actor, reason, at)| {
                let state = if action == "replay" { State::Replayed } else { State::Discarded };
                (MessageId { partition, offset }, (state, ActionRecord { action, actor, reason, at }))
            })
            .collect())
    }

    /// Acted-on messages still in the topic (at or above each partition's low watermark).
    async fn acted_count(&self, dlq_topic: &str, marks: &[(i32, i64, i64)]) -> Result<u64, DeadLetterError> {
        let (partitions, lows): (Vec<i32>, Vec<i64>) = marks.iter().map(|(p, low, _)| (*p, *low)).unzip();
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM dead_letter_actions a
             JOIN unnest($2::int[], $3::bigint[]) AS w(p, low) ON a.dlq_partition = w.p AND a.dlq_offset >= w.low
             WHERE a.dlq_topic = $1",
        )
        .bind(dlq_topic)
        .bind(&partitions)
        .bind(&lows)
        .fetch_one(&self.inner.pool)
        .await?;
        Ok(n as u64)
    }

    /// `(partition, low, high)` of every partition of `topic`; none when
    /// the topic does not exist (nothing was dead-lettered into it yet).
    async fn watermarks(&self, topic: &str) -> Result<Vec<(i32, i64, i64)>, DeadLetterError> {
        let reader = Arc::clone(&self.inner.reader);
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || {
            let metadata = reader.fetch_metadata(Some(&topic), BROKER_TIMEOUT)?;
            let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else { return Ok(Vec::new()) };
            if t.error().is_some() {
                return Ok(Vec::new());
            }
            let mut marks = Vec::new();
            for p in t.partitions() {
                let (low, high) = reader.fetch_watermarks(&topic, p.id(), BROKER_TIMEOUT)?;
                marks.push((p.id(), low, high));
            }
            marks.sort();
            Ok(marks)
        })
        .await
        .expect("watermark task does not panic")
    }

    /// Reads the messages after `cursor`, at most `max` of them; also
    /// returns where a next scan goes on (`None`: the end was reached).
    async fn scan(
        &self,
        dlq_topic: &str,
        cursor: Option<MessageId>,
        max: usize,
    ) -> Result<(Vec<RawMessage>, Option<MessageId>), DeadLetterError> {
        let marks = self.watermarks(dlq_topic).await?;
        let _reading = self.inner.reading.lock().await;
        let mut out = Vec::new();
        for (partition, low, high) in marks {
            let start = match cursor {
                Some(c) if partition < c.partition => continue,
                Some(c) if partition == c.partition => c.offset.saturating_add(1).max(low),
                _ => low,
            };
            if start >= high {
                continue;
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(dlq_topic, partition, Offset::Offset(start))?;
            self.inner.reader.assign(&tpl)?;
            loop {
                let msg = recv(&self.inner.reader).await?;
                if msg.partition() != partition || msg.offset() < start {
                    continue;
                }
                let last = msg.offset() >= high - 1;
                out.push(RawMessage::from(&msg));
                if out.len() >= max {
                    let at = out.last().map(|m| m.id);
                    self.inner.reader.unassign()?;
                    return Ok((out, at));
                }
                if last {
                    break;
                }
            }
        }
        self.inner.reader.unassign()?;
        Ok((out, None))
    }

    async fn read_one(&self, dlq_topic: &str, id: MessageId) -> Result<RawMessage, DeadLetterError> {
        self.read_at(dlq_topic, id).await?.ok_or(DeadLetterError::NotFound(id))
    }

    /// The record of `topic` at `at`, if the topic holds it.
    async fn read_at(&self, topic: &str, at: MessageId) -> Result<Option<RawMessage>, DeadLetterError> {
        let marks = self.watermarks(topic).await?;
        let inside =
            marks.iter().any(|(p, low, high)| *p == at.partition && (*low..*high).contains(&at.offset));
        if !inside {
            return Ok(None);
        }
        let _reading = self.inner.reading.lock().await;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, at.partition, Offset::Offset(at.offset))?;
        self.inner.reader.assign(&tpl)?;
        let found = loop {
            let msg = recv(&self.inner.reader).await?;
            if msg.topic() == topic && msg.partition() == at.partition && msg.offset() >= at.offset {
                break (msg.offset() == at.offset).then(|| RawMessage::from(&msg));
            }
        };
        self.inner.reader.unassign()?;
        Ok(found)
    }
}

/// The next message, or a timeout error if the broker sends none in time.
async fn recv(reader: &StreamConsumer) -> Result<BorrowedMessage<'_>, DeadLetterError> {
    match tokio::time::timeout(BROKER_TIMEOUT, reader.recv()).await {
        Ok(msg) => Ok(msg?),
        Err(_) => {
            Err(DeadLetterError::Kafka(KafkaError::MessageConsumption(RDKafkaErrorCode::RequestTimedOut)))
        }
    }
}

/// Inserts the request and the action rows of the `chosen` messages not
/// taken yet. `None`: the key was taken meanwhile (by a concurrent request).
async fn record(
    tx: &mut sqlx::PgConnection,
    dlq_topic: &str,
    action: &str,
    selector: &Selector,
    operator: &Operator,
    chosen: &[RawMessage],
) -> Result<Option<HashSet<MessageId>>, DeadLetterError> {
    let inserted = sqlx::query(
        "INSERT INTO dead_letter_requests (dlq_topic, idempotency_key, action, selector, actor, reason)
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
    )
    .bind(dlq_topic)
    .bind(&operator.idempotency_key)
    .bind(action)
    .bind(selector.to_json())
    .bind(&operator.actor)
    .bind(&operator.reason)
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 0 {
        return Ok(None);
    }
    let (partitions, offsets): (Vec<i32>, Vec<i64>) =
        chosen.iter().map(|m| (m.id.partition, m.id.offset)).unzip();
    let taken: Vec<(i32, i64)> = sqlx::query_as(
        "INSERT INTO dead_letter_actions (dlq_topic, dlq_partition, dlq_offset, idempotency_key)
         SELECT $1, p, o, $2 FROM unnest($3::int[], $4::bigint[]) AS m(p, o)
         ON CONFLICT DO NOTHING RETURNING dlq_partition, dlq_offset",
    )
    .bind(dlq_topic)
    .bind(&operator.idempotency_key)
    .bind(&partitions)
    .bind(&offsets)
    .fetch_all(&mut *tx)
    .await?;
    Ok(Some(taken.into_iter().map(|(partition, offset)| MessageId { partition, offset }).collect()))
}

/// A DLQ message as read, before it is shown.
struct RawMessage {
    id: MessageId,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp: Option<i64>,
}

impl RawMessage {
    fn from(msg: &BorrowedMessage<'_>) -> Self {
        let headers = msg
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        Self {
            id: MessageId { partition: msg.partition(), offset: msg.offset() },
            key: msg.key().map(<[u8]>::to_vec),
            payload: msg.payload().map(<[u8]>::to_vec),
            headers,
            timestamp: msg.timestamp().to_millis(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// `(partition, offset)` in the original topic, from the `dlq_original_*` headers.
    fn original_position(&self) -> Option<(i32, i64)> {
        let partition = self.header(headers::DLQ_ORIGINAL_PARTITION)?.parse().ok()?;
        let offset = self.header(headers::DLQ_ORIGINAL_OFFSET)?.parse().ok()?;
        Some((partition, offset))
    }

    /// Where in `topic` the `dlq_original_*` headers say this message was
    /// consumed, or why they name no place there.
    fn original_in(&self, topic: &str) -> Result<MessageId, String> {
        match self.header(headers::DLQ_ORIGINAL_TOPIC) {
            Some(t) if t == topic => {}
            Some(t) => return Err(format!("it names {t:?} as its original topic, not {topic:?}")),
            None => return Err(format!("it has no {} header", headers::DLQ_ORIGINAL_TOPIC)),
        }
        let (partition, offset) = self.original_position().ok_or_else(|| {
            format!(
                "it has no valid {} and {} headers",
                headers::DLQ_ORIGINAL_PARTITION,
                headers::DLQ_ORIGINAL_OFFSET
            )
        })?;
        Ok(MessageId { partition, offset })
    }

    /// What of this dead letter is not as in `original` (`None`: key, payload
    /// and `ce_*` headers are the same).
    fn differs_from(&self, original: &RawMessage) -> Option<String> {
        if self.key != original.key {
            return Some("key".into());
        }
        if self.payload != original.payload {
            return Some("payload".into());
        }
        let ce = |m: &RawMessage| -> Vec<(String, Option<Vec<u8>>)> {
            m.headers.iter().filter(|(k, _)| k.starts_with("ce_")).cloned().collect()
        };
        (ce(self) != ce(original)).then(|| "ce_* headers".into())
    }

    fn into_dead_letter(
        self,
        topic: &str,
        dlq_topic: &str,
        actions: &BTreeMap<MessageId, (State, ActionRecord)>,
        max_payload: usize,
    ) -> DeadLetter {
        let original = self.original_position().map(|(partition, offset)| Position {
            topic: self
                .header(headers::DLQ_ORIGINAL_TOPIC)
                .unwrap_or(dlq_topic.trim_end_matches(".dlq"))
                .to_string(),
            partition,
            offset,
        });
        let payload = self.payload.as_deref().unwrap_or_default();
        let shown = &payload[..payload.len().min(max_payload)];
        let (state, actions) = match actions.get(&self.id) {
            Some((state, action)) => (*state, vec![action.clone()]),
            None => (State::Pending, Vec::new()),
        };
        DeadLetter {
            id: self.id,
            topic: topic.to_string(),
            dlq_topic: dlq_topic.to_string(),
            key: self.key.as_ref().map(|k| String::from_utf8_lossy(k).into_owned()),
            original,
            group: self.header(headers::DLQ_GROUP).map(str::to_string),
            reason: self.header(headers::DLQ_REASON).map(str::to_string),
            error: self.header(headers::DLQ_ERROR).unwrap_or_default().to_string(),
            attempts: self.header(headers::DLQ_ATTEMPTS).and_then(|a| a.parse().ok()).unwrap_or(0),
            dead_lettered_at: self.timestamp.and_then(DateTime::from_timestamp_millis),
            event_id: self.header(headers::CE_ID).map(str::to_string),
            event_type: self.header(headers::CE_TYPE).map(str::to_string),
            headers: self
                .headers
                .iter()
                .map(|(k, v)| {
                    (k.clone(), String::from_utf8_lossy(v.as_deref().unwrap_or_default()).into_owned())
                })
                .collect(),
            payload: String::from_utf8_lossy(shown).into_owned(),
            payload_bytes: payload.len(),
            payload_truncated: payload.len() > shown.len(),
            state,
            actions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_partition_dash_offset() {
        let id: MessageId = "2-17".parse().unwrap();
        assert_eq!(id, MessageId { partition: 2, offset: 17 });
        assert_eq!(id.to_string(), "2-17");
        for bad in ["", "2", "2-", "-1", "a-1", "1-1-1", "+1-2", "1- 2"] {
            assert!(bad.parse::<MessageId>().is_err(), "{bad:?}");
        }
        let huge: MessageId = "99999999999-99999999999999999999".parse().unwrap();
        assert_eq!(huge, MessageId { partition: i32::MAX, offset: i64::MAX }, "saturates: no such message");
    }

    #[test]
    fn states_parse_from_their_names() {
        for s in [State::Pending, State::Replayed, State::Discarded] {
            assert_eq!(s.as_str().parse::<State>().unwrap(), s);
        }
        assert!("PENDING".parse::<State>().is_err());
    }
}
