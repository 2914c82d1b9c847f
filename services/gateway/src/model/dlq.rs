//! Dead letters (`/v1/admin/dlq`).

use super::{non_empty, time};
use chrono::{DateTime, Utc};
use sagaworks_proto::deadletter::v1 as dl;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The operated dead-letter topics.
#[derive(Debug, Serialize, ToSchema)]
pub struct DlqTopics {
    pub topics: Vec<DlqTopic>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DlqTopic {
    /// The original topic as configured (`order`): the `{topic}` of the other routes.
    pub topic: String,
    pub dlq_topic: String,
    /// Messages in the dead-letter topic.
    pub messages: u64,
    /// Of those, neither replayed nor discarded.
    pub pending: u64,
}

impl From<dl::ListTopicsResponse> for DlqTopics {
    fn from(r: dl::ListTopicsResponse) -> Self {
        Self {
            topics: r
                .topics
                .into_iter()
                .map(|t| DlqTopic {
                    topic: t.topic,
                    dlq_topic: t.dlq_topic,
                    messages: t.messages,
                    pending: t.pending,
                })
                .collect(),
        }
    }
}

/// Where a message was consumed from before it was dead-lettered.
#[derive(Debug, Serialize, ToSchema)]
pub struct OriginalPosition {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// An operator's replay or discard.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterAction {
    /// `replay` or `discard`.
    pub action: String,
    pub actor: String,
    pub reason: String,
    pub at: Option<DateTime<Utc>>,
}

/// A dead-lettered message.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterView {
    /// `<partition>-<offset>` in the dead-letter topic.
    pub id: String,
    pub topic: String,
    pub dlq_topic: String,
    /// The Kafka key (the aggregate id).
    pub key: Option<String>,
    pub original: Option<OriginalPosition>,
    /// The consumer group that dead-lettered it.
    pub group: Option<String>,
    /// Why it was parked: `invalid_envelope`, `rejected`, `retries_exhausted`,
    /// `unsupported_schema_version`, `untrusted_source` (not from the topic's publisher)
    /// or `unexpected_type` (a type the topic does not carry).
    pub reason: Option<String>,
    /// The handler's last error.
    pub error: String,
    pub attempts: u32,
    pub dead_lettered_at: Option<DateTime<Utc>>,
    /// CloudEvents `ce_id` and `ce_type`.
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    /// Every header, values as text.
    pub headers: std::collections::BTreeMap<String, String>,
    /// The payload as text, cut at 64 KiB (`payload_truncated`).
    pub payload: String,
    pub payload_bytes: u64,
    pub payload_truncated: bool,
    /// `pending`, `replayed` or `discarded`.
    pub state: String,
    pub actions: Vec<DeadLetterAction>,
}

impl From<dl::DeadLetter> for DeadLetterView {
    fn from(d: dl::DeadLetter) -> Self {
        Self {
            id: d.id,
            topic: d.topic,
            dlq_topic: d.dlq_topic,
            key: d.key,
            original: d.original.map(|o| OriginalPosition {
                topic: o.topic,
                partition: o.partition,
                offset: o.offset,
            }),
            group: d.group,
            reason: d.reason,
            error: d.error,
            attempts: d.attempts,
            dead_lettered_at: time(d.dead_lettered_at),
            event_id: d.event_id,
            event_type: d.event_type,
            headers: d.headers.into_iter().collect(),
            payload: d.payload,
            payload_bytes: d.payload_bytes,
            payload_truncated: d.payload_truncated,
            state: d.state,
            actions: d
                .actions
                .into_iter()
                .map(|a| DeadLetterAction {
                    action: a.action,
                    actor: a.actor,
                    reason: a.reason,
                    at: time(a.at),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterPage {
    pub messages: Vec<DeadLetterView>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

impl From<dl::ListDeadLettersResponse> for DeadLetterPage {
    fn from(r: dl::ListDeadLettersResponse) -> Self {
        Self {
            messages: r.messages.into_iter().map(Into::into).collect(),
            next_cursor: non_empty(r.next_cursor),
        }
    }
}

/// `POST /v1/admin/dlq/{topic}/messages/{id}/discard`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DlqActionInput {
    /// Why (recorded with the action), 1 to 1000 characters.
    #[schema(min_length = 1, max_length = 1000)]
    pub reason: String,
}

/// `POST /v1/admin/dlq/{topic}/replay`: exactly one of `id`, `key` or `all`.
#[derive(Debug, Deserialize)]
#[serde(try_from = "ReplayFields")]
pub enum DlqReplayInput {
    /// This message (it must be pending).
    One { reason: String, id: String },
    /// The pending messages of this key.
    Key { reason: String, key: String },
    /// Every pending message.
    All { reason: String },
}

/// The body as sent; [`DlqReplayInput`] checks that it names one selection.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayFields {
    reason: String,
    id: Option<String>,
    key: Option<String>,
    all: Option<bool>,
}

impl TryFrom<ReplayFields> for DlqReplayInput {
    type Error = String;

    fn try_from(f: ReplayFields) -> Result<Self, String> {
        match (f.id, f.key, f.all) {
            (Some(id), None, None) => Ok(Self::One { reason: f.reason, id }),
            (None, Some(key), None) if !key.is_empty() && key.chars().count() <= 255 => {
                Ok(Self::Key { reason: f.reason, key })
            }
            (None, Some(_), None) => Err("key must be 1 to 255 characters".into()),
            (None, None, Some(true)) => Ok(Self::All { reason: f.reason }),
            _ => Err("give exactly one of id, key or \"all\": true".into()),
        }
    }
}

/// The schema of [`DlqReplayInput`]: one of three objects, each with `reason`.
impl utoipa::PartialSchema for DlqReplayInput {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Type};
        let variant = |name: &str, selector: ObjectBuilder, description: &str| {
            let reason = ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(1000))
                .description(Some("Why (recorded with the action), 1 to 1000 characters"));
            ObjectBuilder::new()
                .description(Some(description))
                .property("reason", reason)
                .required("reason")
                .property(name, selector)
                .required(name)
                .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        };
        let id = ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(r"^[0-9]{1,10}-[0-9]{1,19}$"))
            .description(Some("`<partition>-<offset>` in the dead-letter topic"));
        let key = ObjectBuilder::new().schema_type(Type::String).min_length(Some(1)).max_length(Some(255));
        let all = ObjectBuilder::new().schema_type(Type::Boolean).enum_values(Some([true]));
        OneOfBuilder::new()
            .item(variant("id", id, "This message (it must be pending)"))
            .item(variant("key", key, "The pending messages of this Kafka key, in their original order"))
            .item(variant("all", all, "Every pending message"))
            .into()
    }
}

impl ToSchema for DlqReplayInput {}

/// What a replay sent.
#[derive(Debug, Serialize, ToSchema)]
pub struct Replayed {
    /// The messages sent back, in the order they were sent.
    pub replayed: Vec<String>,
    /// The Idempotency-Key was used before: the earlier answer, nothing sent again.
    pub replay: bool,
}

/// A discarded message.
#[derive(Debug, Serialize, ToSchema)]
pub struct Discarded {
    pub id: String,
    /// `discarded`.
    pub state: String,
    /// The Idempotency-Key was used before: nothing done again.
    pub replay: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_names_exactly_one_selection() {
        let parse = |json: &str| serde_json::from_str::<DlqReplayInput>(json);
        assert!(matches!(parse(r#"{"reason":"r","id":"0-1"}"#), Ok(DlqReplayInput::One { .. })));
        assert!(matches!(parse(r#"{"reason":"r","key":"k"}"#), Ok(DlqReplayInput::Key { .. })));
        assert!(matches!(parse(r#"{"reason":"r","all":true}"#), Ok(DlqReplayInput::All { .. })));
        for bad in [
            r#"{"reason":"r"}"#,
            r#"{"reason":"r","all":false}"#,
            r#"{"reason":"r","id":"0-1","key":"k"}"#,
            r#"{"reason":"r","key":""}"#,
            r#"{"reason":"r","all":true,"x":1}"#,
            r#"{"id":"0-1"}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
