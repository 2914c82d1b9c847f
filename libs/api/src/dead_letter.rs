//! The bodies of the dead-letter operations (`/v1/admin/dlq`): what the
//! gateway answers and the admin CLI reads. A client ignores fields it does
//! not know, and an absent optional field is `None`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why a consumer parked a message: the values of [`DeadLetter::reason`]
/// (the `dlq_reason` header).
pub mod reason {
    /// Not a CloudEvent (a header missing or invalid).
    pub const INVALID_ENVELOPE: &str = "invalid_envelope";
    /// The handler said it will never succeed.
    pub const REJECTED: &str = "rejected";
    /// Retryable errors until the attempts ran out.
    pub const RETRIES_EXHAUSTED: &str = "retries_exhausted";
    /// A schema version newer than the handler reads.
    pub const UNSUPPORTED_SCHEMA_VERSION: &str = "unsupported_schema_version";
    /// Its `ce_source` is not the topic's publisher.
    pub const UNTRUSTED_SOURCE: &str = "untrusted_source";
    /// Its `ce_type` is not one the topic carries.
    pub const UNEXPECTED_TYPE: &str = "unexpected_type";
    /// Every reason.
    pub const ALL: [&str; 6] = [
        INVALID_ENVELOPE,
        REJECTED,
        RETRIES_EXHAUSTED,
        UNSUPPORTED_SCHEMA_VERSION,
        UNTRUSTED_SOURCE,
        UNEXPECTED_TYPE,
    ];
}

/// The operated dead-letter topics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DlqTopics {
    pub topics: Vec<DlqTopic>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DlqTopic {
    /// The original topic as configured (`order`): the `{topic}` of the other routes.
    pub topic: String,
    pub dlq_topic: String,
    /// Messages in the dead-letter topic.
    pub messages: u64,
    /// Of those, neither replayed nor discarded.
    pub pending: u64,
}

/// Where a message was consumed from before it was dead-lettered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OriginalPosition {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// An operator's replay or discard.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeadLetterAction {
    /// `replay` or `discard`.
    pub action: String,
    pub actor: String,
    pub reason: String,
    pub at: Option<DateTime<Utc>>,
}

/// A dead-lettered message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeadLetter {
    /// `<partition>-<offset>` in the dead-letter topic.
    pub id: String,
    pub topic: String,
    pub dlq_topic: String,
    /// The Kafka key (the aggregate id).
    pub key: Option<String>,
    pub original: Option<OriginalPosition>,
    /// The consumer group that dead-lettered it.
    pub group: Option<String>,
    /// Why it was parked ([`reason`]): `invalid_envelope`, `rejected`, `retries_exhausted`,
    /// `unsupported_schema_version`, `untrusted_source` (not from the topic's publisher)
    /// or `unexpected_type` (a type the topic does not carry); absent on messages parked
    /// before the header existed.
    pub reason: Option<String>,
    /// The handler's last error.
    pub error: String,
    pub attempts: u32,
    pub dead_lettered_at: Option<DateTime<Utc>>,
    /// CloudEvents `ce_id` and `ce_type`.
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    /// Every header, values as text.
    pub headers: BTreeMap<String, String>,
    /// The payload as text, cut at 64 KiB (`payload_truncated`).
    pub payload: String,
    pub payload_bytes: u64,
    pub payload_truncated: bool,
    /// `pending`, `replayed` or `discarded`.
    pub state: String,
    pub actions: Vec<DeadLetterAction>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeadLetterPage {
    pub messages: Vec<DeadLetter>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `POST /v1/admin/dlq/{topic}/messages/{id}/discard`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DlqActionInput {
    /// Why (recorded with the action), 1 to 1000 characters.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 1000))]
    pub reason: String,
}

/// `POST /v1/admin/dlq/{topic}/replay`: exactly one of `id`, `key` or `all`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
#[cfg(feature = "openapi")]
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

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for DlqReplayInput {}

/// What a replay sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Replayed {
    /// The messages sent back, in the order they were sent.
    pub replayed: Vec<String>,
    /// The Idempotency-Key was used before: the earlier answer, nothing sent again.
    pub replay: bool,
}

/// A discarded message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
