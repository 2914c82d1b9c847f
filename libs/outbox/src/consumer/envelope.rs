//! The CloudEvents binary-mode envelope of a Kafka message: [`ReceivedEvent`].

use crate::kafka::headers;
use chrono::{DateTime, Utc};
use rdkafka::message::{Headers, Message, OwnedMessage};
use uuid::Uuid;

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
    pub(crate) fn from_message(msg: &OwnedMessage) -> Result<Self, EnvelopeError> {
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
pub(crate) enum EnvelopeError {
    #[error("header {0} is missing")]
    Missing(&'static str),
    #[error("header {0} is invalid: {1:?}")]
    Invalid(&'static str, String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Timestamp;
    use rdkafka::message::{Header, OwnedHeaders};

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
}
