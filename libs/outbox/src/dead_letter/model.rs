//! What an operator sees of a dead letter and asks for, the errors of the
//! operator calls, and why a consumer parks a message ([`DlqReason`]).

use chrono::{DateTime, Utc};
use rdkafka::error::KafkaError;
use sagaworks_api::dead_letter::reason;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

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

/// Which messages [`DeadLetters::list`](super::DeadLetters::list) returns.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<State>,
    pub key: Option<String>,
}

/// A page of [`DeadLetters::list`](super::DeadLetters::list); `next_cursor` is `None` on the last.
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
    pub(super) fn to_json(&self) -> serde_json::Value {
        match self {
            Selector::One(id) => serde_json::json!({ "id": id.to_string() }),
            Selector::Key(key) => serde_json::json!({ "key": key }),
            Selector::AllPending => serde_json::json!({ "all": true }),
        }
    }
}

/// Who acts, why, and the key that makes a repeated call a replay of the first.
pub use sagaworks_runtime::Operator;

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

pub(super) fn refusals(all: &[Refusal]) -> String {
    all.iter().map(|r| format!("message {}: {}", r.id, r.why)).collect::<Vec<_>>().join("; ")
}

/// Why a message was dead-lettered: the `dlq_reason` header, one of the
/// API's [`reason`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DlqReason {
    /// Not a CloudEvent (a header missing or invalid).
    InvalidEnvelope,
    /// The handler said it will never succeed ([`HandlerError::Permanent`](crate::HandlerError::Permanent)).
    Rejected,
    /// Retryable errors until `max_attempts` ran out.
    RetriesExhausted,
    /// A schema version newer than the handler reads.
    UnsupportedSchemaVersion,
    /// Its `ce_source` is not the topic's publisher ([`ConsumerSettings::sources`](crate::ConsumerSettings::sources)).
    UntrustedSource,
    /// Its `ce_type` is not one the topic carries ([`ConsumerSettings::types`](crate::ConsumerSettings::types)).
    UnexpectedType,
}

impl DlqReason {
    /// The value of the `dlq_reason` header.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::InvalidEnvelope => reason::INVALID_ENVELOPE,
            Self::Rejected => reason::REJECTED,
            Self::RetriesExhausted => reason::RETRIES_EXHAUSTED,
            Self::UnsupportedSchemaVersion => reason::UNSUPPORTED_SCHEMA_VERSION,
            Self::UntrustedSource => reason::UNTRUSTED_SOURCE,
            Self::UnexpectedType => reason::UNEXPECTED_TYPE,
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
    fn every_reason_is_one_the_api_names() {
        let every = [
            DlqReason::InvalidEnvelope,
            DlqReason::Rejected,
            DlqReason::RetriesExhausted,
            DlqReason::UnsupportedSchemaVersion,
            DlqReason::UntrustedSource,
            DlqReason::UnexpectedType,
        ];
        assert_eq!(every.map(DlqReason::label), reason::ALL);
    }

    #[test]
    fn states_parse_from_their_names() {
        for s in [State::Pending, State::Replayed, State::Discarded] {
            assert_eq!(s.as_str().parse::<State>().unwrap(), s);
        }
        assert!("PENDING".parse::<State>().is_err());
    }
}
