//! Received events decode through [`sagaworks_event::Envelope`]; a decoding
//! error maps to the consumer's [`HandlerError`](crate::HandlerError).

use crate::consumer::ReceivedEvent;
use sagaworks_event::{DecodeError, Envelope, Event};

impl Envelope for ReceivedEvent {
    fn event_type(&self) -> &str {
        &self.event_type
    }

    fn schema_version(&self) -> i32 {
        self.schema_version
    }

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

impl ReceivedEvent {
    /// Whether this is an `E` (of any version): [`Envelope::is`].
    pub fn is<E: Event>(&self) -> bool {
        Envelope::is::<E>(self)
    }

    /// The payload as `E`: [`Envelope::decode`].
    pub fn decode<E: Event>(&self) -> Result<E, DecodeError> {
        Envelope::decode(self)
    }
}

impl From<DecodeError> for crate::HandlerError {
    /// A newer version is [`HandlerError::UnsupportedSchemaVersion`]; anything
    /// else will never decode, so it is permanent.
    ///
    /// [`HandlerError::UnsupportedSchemaVersion`]: crate::HandlerError::UnsupportedSchemaVersion
    fn from(e: DecodeError) -> Self {
        match e {
            DecodeError::UnsupportedVersion { .. } => Self::UnsupportedSchemaVersion(e.to_string()),
            e => Self::Permanent(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HandlerError;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Thing {
        id: u32,
    }

    impl sagaworks_event::Event for Thing {
        const TYPE: &'static str = "Thing";
        const AGGREGATE: &'static str = "thing";
        const VERSION: i32 = 2;
        fn aggregate_id(&self) -> String {
            self.id.to_string()
        }
    }

    fn received(version: i32, payload: &str) -> ReceivedEvent {
        ReceivedEvent {
            id: uuid::Uuid::nil(),
            event_type: "Thing".into(),
            source: String::new(),
            schema_version: version,
            data_schema: None,
            aggregate_id: "k".into(),
            time: None,
            payload: payload.as_bytes().to_vec(),
            traceparent: None,
            tracestate: None,
            topic: "t".into(),
            partition: 0,
            offset: 0,
            headers: vec![],
        }
    }

    #[test]
    fn a_received_event_decodes_and_its_errors_map_to_retry_or_park() {
        assert_eq!(received(2, r#"{"id":7}"#).decode::<Thing>(), Ok(Thing { id: 7 }));
        let newer = received(3, r#"{"id":7}"#).decode::<Thing>().unwrap_err();
        assert!(matches!(HandlerError::from(newer), HandlerError::UnsupportedSchemaVersion(_)));
        let unreadable = received(2, "{}").decode::<Thing>().unwrap_err();
        assert!(matches!(HandlerError::from(unreadable), HandlerError::Permanent(_)));
    }
}
