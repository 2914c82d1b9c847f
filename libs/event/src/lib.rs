//! The contract of a typed event: [`Event`] (see its docs), the URI of a
//! version's schema, decoding a payload of any version a consumer reads, and
//! [`Envelope`], what a received event offers to be decoded.
//!
//! Plain serde, so that the crate of the event types (`sagaworks-events`)
//! depends on nothing heavier; the outbox writes and reads these events.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A domain event type: one version of one event's payload.
///
/// Typed events: the contract between a producer and its consumers.
///
/// An [`Event`] is a payload type with its CloudEvents `type`, the aggregate
/// (and so the topic) it belongs to and its schema version as associated
/// constants. Producers write values of it (the outbox's `OutboxWriter::append`
/// and `stage`); consumers read the same type back ([`Envelope::decode`] of a
/// received event), so a payload change that breaks a consumer breaks its
/// build, not its partition.
///
/// # Versions
///
/// `VERSION` is the payload's *major* version, sent as `ce_schemaversion`
/// (and named by `ce_dataschema`). Compatible changes (a new optional field,
/// a new field with a default) keep it: consumers ignore fields they do not
/// know and default the ones that are missing. A breaking change (a field
/// renamed, removed or changing type) is a new version: the old payload type
/// is kept, and [`Event::from_version`] upcasts it to the current one, so
/// consumers built with the new type still read events written by producers
/// that have not been upgraded.
///
/// A consumer never guesses at a version newer than the one it was built
/// with: [`Envelope::decode`] returns [`DecodeError::UnsupportedVersion`],
/// which the outbox's consumer retries or parks in the dead-letter topic with
/// `dlq_reason=unsupported_schema_version`, per its settings'
/// `unsupported_schema_version`. Upgrade consumers before producers; a parked
/// event is replayed once they are.
pub trait Event: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// CloudEvents `type`, e.g. `OrderConfirmed`.
    const TYPE: &'static str;
    /// The aggregate type; the topic is `<topic_prefix>.<AGGREGATE>`.
    const AGGREGATE: &'static str;
    /// The payload's major version (`ce_schemaversion`), from 1.
    const VERSION: i32;

    /// The Kafka key: the id of the aggregate this event is about. All events
    /// with one key keep their order.
    fn aggregate_id(&self) -> String;

    /// `ce_dataschema`: the URI naming this version's schema.
    fn data_schema() -> String {
        data_schema(Self::TYPE, Self::VERSION)
    }

    /// Reads a payload written as `version` (never above [`Self::VERSION`]).
    /// The default reads only the current version; an event with older
    /// versions overrides it to decode each into its own type and upcast it.
    fn from_version(version: i32, payload: &[u8]) -> Result<Self, DecodeError> {
        if version == Self::VERSION {
            decode_payload(Self::TYPE, version, payload)
        } else {
            Err(DecodeError::UnknownVersion { event_type: Self::TYPE, version })
        }
    }
}

/// The `ce_dataschema` of `event_type` at `version`.
pub fn data_schema(event_type: &str, version: i32) -> String {
    format!("urn:sagaworks:event:{event_type}:v{version}")
}

/// Decodes `payload` as `T`, the type of `event_type` at `version`.
pub fn decode_payload<T: DeserializeOwned>(
    event_type: &'static str,
    version: i32,
    payload: &[u8],
) -> Result<T, DecodeError> {
    serde_json::from_slice(payload).map_err(|e| DecodeError::Payload {
        event_type,
        version,
        error: e.to_string(),
    })
}

/// Why a received event could not be read as the type a consumer asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("event type is {found:?}, not {expected}")]
    WrongType { expected: &'static str, found: String },
    /// Written by a producer newer than this consumer: not guessed at.
    #[error(
        "{event_type} schema version {version} is newer than version {known}, the newest this consumer reads"
    )]
    UnsupportedVersion { event_type: &'static str, version: i32, known: i32 },
    /// An older (or invalid) version with no upcast.
    #[error("{event_type} schema version {version} is not one this consumer reads")]
    UnknownVersion { event_type: &'static str, version: i32 },
    #[error("unreadable {event_type} v{version} payload: {error}")]
    Payload { event_type: &'static str, version: i32, error: String },
}

/// A received event as a consumer sees it before decoding: its CloudEvents
/// type, schema version and payload. The outbox's `ReceivedEvent` is one.
pub trait Envelope {
    /// CloudEvents `type`.
    fn event_type(&self) -> &str;
    /// `ce_schemaversion`.
    fn schema_version(&self) -> i32;
    /// The payload's bytes.
    fn payload(&self) -> &[u8];

    /// Whether this is an `E` (of any version).
    fn is<E: Event>(&self) -> bool {
        self.event_type() == E::TYPE
    }

    /// The payload as `E`: the current version as it is, an older one
    /// upcast, a newer one refused ([`DecodeError::UnsupportedVersion`]).
    fn decode<E: Event>(&self) -> Result<E, DecodeError> {
        if !self.is::<E>() {
            return Err(DecodeError::WrongType { expected: E::TYPE, found: self.event_type().to_owned() });
        }
        if self.schema_version() > E::VERSION {
            return Err(DecodeError::UnsupportedVersion {
                event_type: E::TYPE,
                version: self.schema_version(),
                known: E::VERSION,
            });
        }
        E::from_version(self.schema_version(), self.payload())
    }
}

impl<T: Envelope + ?Sized> Envelope for &T {
    fn event_type(&self) -> &str {
        (**self).event_type()
    }

    fn schema_version(&self) -> i32 {
        (**self).schema_version()
    }

    fn payload(&self) -> &[u8] {
        (**self).payload()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Renamed {
        ids: Vec<u32>,
    }

    impl Event for Renamed {
        const TYPE: &'static str = "Renamed";
        const AGGREGATE: &'static str = "thing";
        const VERSION: i32 = 2;
        fn aggregate_id(&self) -> String {
            "k".into()
        }
        fn from_version(version: i32, payload: &[u8]) -> Result<Self, DecodeError> {
            #[derive(Deserialize)]
            struct V1 {
                id: u32,
            }
            match version {
                1 => decode_payload::<V1>(Self::TYPE, 1, payload).map(|v1| Self { ids: vec![v1.id] }),
                2 => decode_payload(Self::TYPE, 2, payload),
                _ => Err(DecodeError::UnknownVersion { event_type: Self::TYPE, version }),
            }
        }
    }

    struct Received(&'static str, i32, &'static str);

    impl Envelope for Received {
        fn event_type(&self) -> &str {
            self.0
        }
        fn schema_version(&self) -> i32 {
            self.1
        }
        fn payload(&self) -> &[u8] {
            self.2.as_bytes()
        }
    }

    fn received(event_type: &'static str, version: i32, payload: &'static str) -> Received {
        Received(event_type, version, payload)
    }

    #[test]
    fn the_current_version_decodes_and_an_older_one_is_upcast() {
        assert_eq!(
            received("Renamed", 2, r#"{"ids":[1,2]}"#).decode::<Renamed>(),
            Ok(Renamed { ids: vec![1, 2] })
        );
        assert_eq!(received("Renamed", 1, r#"{"id":7}"#).decode::<Renamed>(), Ok(Renamed { ids: vec![7] }));
    }

    #[test]
    fn a_newer_version_is_refused_as_unsupported_not_guessed_at() {
        let err = received("Renamed", 3, r#"{"ids":[1]}"#).decode::<Renamed>().unwrap_err();
        assert_eq!(err, DecodeError::UnsupportedVersion { event_type: "Renamed", version: 3, known: 2 });
        assert_eq!(
            err.to_string(),
            "Renamed schema version 3 is newer than version 2, the newest this consumer reads"
        );
    }

    #[test]
    fn another_type_or_a_bad_payload_is_permanent() {
        let err = received("Other", 2, "{}").decode::<Renamed>().unwrap_err();
        assert!(matches!(err, DecodeError::WrongType { expected: "Renamed", .. }), "{err}");
        let err = received("Renamed", 2, r#"{"id":1}"#).decode::<Renamed>().unwrap_err();
        assert!(err.to_string().starts_with("unreadable Renamed v2 payload: missing field `ids`"), "{err}");
        let err = received("Renamed", 0, "{}").decode::<Renamed>().unwrap_err();
        assert_eq!(err, DecodeError::UnknownVersion { event_type: "Renamed", version: 0 });
    }

    #[test]
    fn the_data_schema_names_type_and_version() {
        assert_eq!(Renamed::data_schema(), "urn:sagaworks:event:Renamed:v2");
    }
}
