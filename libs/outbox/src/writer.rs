//! Writing events into the outbox, inside the business transaction.

pub use crate::error::OutboxError;
use sqlx::PgConnection;
use uuid::Uuid;

/// Events larger than this are refused at write time (Kafka's default
/// `message.max.bytes` is about 1 MB and the envelope needs room too).
pub const MAX_PAYLOAD_BYTES: usize = 900 * 1024;

/// The channel the writer NOTIFYs; the relay LISTENs on it.
pub const NOTIFY_CHANNEL: &str = "sagaworks_outbox";

/// A domain event about to be recorded.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// Names the topic (`<prefix>.<aggregate_type>`), e.g. `order`.
    pub aggregate_type: String,
    /// The Kafka key; all events of one aggregate keep their order.
    pub aggregate_id: String,
    /// CloudEvents `type`, e.g. `OrderConfirmed`.
    pub event_type: String,
    /// Version of this event type's payload schema.
    pub schema_version: i32,
    pub payload: serde_json::Value,
}

impl NewEvent {
    /// A version-1 JSON event.
    pub fn new(
        aggregate_type: &str,
        aggregate_id: impl ToString,
        event_type: &str,
        payload: impl serde::Serialize,
    ) -> Result<Self, OutboxError> {
        Ok(Self {
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.to_string(),
            event_type: event_type.into(),
            schema_version: 1,
            payload: serde_json::to_value(payload)?,
        })
    }
}

/// Writes events for one service (the CloudEvents `source`).
#[derive(Debug, Clone)]
pub struct OutboxWriter {
    source: String,
}

impl OutboxWriter {
    /// `service` becomes the source `/sagaworks/<service>`.
    pub fn new(service: &str) -> Self {
        Self { source: format!("/sagaworks/{service}") }
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Records `event` on the caller's transaction and returns its id. The
    /// current span's trace context (`traceparent`, `tracestate`) is stored
    /// with it: the relay's producer span continues that trace, and the
    /// consumer's span links back to it.
    pub async fn write(&self, conn: &mut PgConnection, event: NewEvent) -> Result<Uuid, OutboxError> {
        let payload = serde_json::to_vec(&event.payload)?;
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(OutboxError::PayloadTooLarge {
                event_type: event.event_type,
                size: payload.len(),
                max: MAX_PAYLOAD_BYTES,
            });
        }
        let id = Uuid::now_v7();
        let traceparent = sagaworks_telemetry::propagation::current_traceparent();
        let tracestate = sagaworks_telemetry::propagation::current_tracestate();
        // One round trip: the row, and a NOTIFY that PostgreSQL delivers at
        // commit, and only if the transaction commits (several in one
        // transaction are folded into one).
        sqlx::query(
            "WITH row AS (
                 INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, schema_version, source,
                                     content_type, payload, traceparent, tracestate)
                 VALUES ($1, $2, $3, $4, $5, $6, 'application/json', $7, $8, $9)
                 RETURNING 1)
             SELECT pg_notify($10, '') FROM row",
        )
        .bind(id)
        .bind(&event.aggregate_type)
        .bind(&event.aggregate_id)
        .bind(&event.event_type)
        .bind(event.schema_version)
        .bind(&self.source)
        .bind(payload)
        .bind(traceparent)
        .bind(tracestate)
        .bind(NOTIFY_CHANNEL)
        .execute(&mut *conn)
        .await?;
        Ok(id)
    }
}
