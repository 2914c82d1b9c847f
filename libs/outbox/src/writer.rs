//! Writing events into the outbox, inside the business transaction.

use crate::error::OutboxError;
use crate::wake::NOTIFY_IF_PARKED;
use sagaworks_event::Event;
use sqlx::error::BoxDynError;
use sqlx::postgres::PgArguments;
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{Arguments, PgConnection, Postgres};
use std::sync::LazyLock;
use uuid::Uuid;

/// Events larger than this are refused at write time (Kafka's default
/// `message.max.bytes` is about 1 MB and the envelope needs room too).
pub const MAX_PAYLOAD_BYTES: usize = 900 * 1024;

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
    /// CloudEvents `dataschema`: the URI naming the payload's schema.
    pub data_schema: Option<String>,
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
            data_schema: None,
            payload: serde_json::to_value(payload)?,
        })
    }
}

/// What [`OutboxWriter::append`] and [`OutboxWriter::stage`] take: a typed
/// [`Event`] (by reference), or a [`NewEvent`] built by hand.
pub trait ToOutbox {
    /// The event's metadata, and its payload serialised (the metadata's
    /// `payload` is not read).
    fn to_outbox(self) -> Result<(NewEvent, Vec<u8>), OutboxError>;
}

impl<E: Event> ToOutbox for &E {
    fn to_outbox(self) -> Result<(NewEvent, Vec<u8>), OutboxError> {
        // Serialised once, straight to bytes (not through a `serde_json::Value`).
        let payload = serde_json::to_vec(self)?;
        let event = NewEvent {
            aggregate_type: E::AGGREGATE.into(),
            aggregate_id: self.aggregate_id(),
            event_type: E::TYPE.into(),
            schema_version: E::VERSION,
            data_schema: Some(E::data_schema()),
            payload: serde_json::Value::Null,
        };
        Ok((event, payload))
    }
}

impl ToOutbox for NewEvent {
    fn to_outbox(self) -> Result<(NewEvent, Vec<u8>), OutboxError> {
        let payload = serde_json::to_vec(&self.payload)?;
        Ok((self, payload))
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

    /// Records `event` (a typed [`Event`], or a [`NewEvent`]) on the caller's
    /// transaction and returns its id. The current span's trace context
    /// (`traceparent`, `tracestate`) is stored with it: the relay's producer
    /// span continues that trace, and the consumer's span links back to it.
    ///
    /// One of the two ways to write an event; the other, for a business
    /// write that is one statement, is [`Self::stage`].
    pub async fn append(&self, conn: &mut PgConnection, event: impl ToOutbox) -> Result<Uuid, OutboxError> {
        let event = self.stage(event)?;
        let id = event.id();
        // One round trip: the row, and, when a relay sleeps, a NOTIFY that
        // PostgreSQL delivers at commit, and only if the transaction commits
        // (several in one transaction are folded into one).
        static SQL: LazyLock<String> =
            LazyLock::new(|| format!("WITH {} SELECT 1", PendingEvent::cte("event", 1, None)));
        event.bind(sqlx::query(SQL.as_str())).execute(&mut *conn).await?;
        Ok(id)
    }

    /// `event` (a typed [`Event`], or a [`NewEvent`]), checked and stamped
    /// (id, source, the current span's trace context), for a business
    /// statement that inserts it as one of its own parts: see
    /// [`PendingEvent`] (and the saga library's `Statement::event`).
    pub fn stage(&self, event: impl ToOutbox) -> Result<PendingEvent, OutboxError> {
        let (event, payload) = event.to_outbox()?;
        self.stamp(event, payload)
    }

    /// `event` with `payload` (its serialised payload; `event.payload` is not read).
    fn stamp(&self, event: NewEvent, payload: Vec<u8>) -> Result<PendingEvent, OutboxError> {
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(OutboxError::PayloadTooLarge {
                event_type: event.event_type,
                size: payload.len(),
                max: MAX_PAYLOAD_BYTES,
            });
        }
        let (traceparent, tracestate) = sagaworks_telemetry::propagation::current_w3c();
        Ok(PendingEvent {
            id: Uuid::now_v7(),
            aggregate_type: event.aggregate_type,
            aggregate_id: event.aggregate_id,
            event_type: event.event_type,
            schema_version: event.schema_version,
            data_schema: event.data_schema,
            source: self.source.clone(),
            payload,
            traceparent,
            tracestate,
        })
    }
}

/// An outbox row that a business statement inserts as one of its own
/// common table expressions, so that the business write and its event cost
/// one round trip (and, outside a transaction, are still atomic: one
/// statement commits all or nothing).
///
/// ```ignore
/// let event = outbox.stage(&OrderConfirmed { order_id, .. })?;
/// let sql = format!(
///     "WITH o AS (UPDATE orders SET status = 'CONFIRMED' WHERE id = $1 RETURNING id),
///           {}
///      SELECT count(*) FROM o",
///     PendingEvent::cte("event", 2, Some("o")), // $2..$11, one row per row of `o`
/// );
/// let updated: i64 = event.bind(sqlx::query_scalar(&sql).bind(id)).fetch_one(&mut *conn).await?;
/// ```
#[derive(Debug, Clone)]
pub struct PendingEvent {
    id: Uuid,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    schema_version: i32,
    data_schema: Option<String>,
    source: String,
    payload: Vec<u8>,
    traceparent: Option<String>,
    tracestate: Option<String>,
}

/// The columns [`PendingEvent::cte`] and [`PendingEvents::cte`] insert, in their order.
const OUTBOX_COLUMNS: &str = "id, aggregate_type, aggregate_id, event_type, schema_version, data_schema, source, content_type, payload, traceparent, tracestate";

/// How many parameters [`PendingEvent::cte`] takes.
pub(crate) const PENDING_EVENT_PARAMS: usize = 10;

impl PendingEvent {
    /// The event's id (the CloudEvents `id`).
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// `name AS (INSERT INTO outbox ...)`, a data-modifying CTE that inserts
    /// the event and, when a relay sleeps, NOTIFYs it (delivered at commit;
    /// see the `wake` module). It takes ten parameters from `$first` on,
    /// bound by [`Self::bind`] (or [`Self::add_to`]) after the statement's own. With `once_per`, the name
    /// of an earlier CTE of the statement, the event is inserted once per row
    /// that CTE returns: give one that returns a row exactly when the
    /// business write happened.
    pub fn cte(name: &str, first: usize, once_per: Option<&str>) -> String {
        use std::fmt::Write;
        // Written in place: a saga transition builds one per event.
        let mut sql = String::with_capacity(512);
        let _ = write!(sql, "{name} AS (\n INSERT INTO outbox ({OUTBOX_COLUMNS})\n SELECT ");
        for i in 0..PENDING_EVENT_PARAMS {
            if i == 7 {
                sql.push_str("'application/json', ");
            }
            let _ = write!(sql, "${}", first + i);
            sql.push_str(if i + 1 < PENDING_EVENT_PARAMS { ", " } else { "" });
        }
        if let Some(cte) = once_per {
            sql.push_str(" FROM ");
            sql.push_str(cte);
        }
        sql.push_str("\n RETURNING ");
        sql.push_str(NOTIFY_IF_PARKED.as_str());
        sql.push(')');
        sql
    }

    /// Binds the event's ten values to a sqlx `query`, `query_as` or
    /// `query_scalar`, in the order of [`Self::cte`].
    pub fn bind<'q, Q: Bind<'q>>(self, query: Q) -> Q {
        query
            .bind_value(self.id)
            .bind_value(self.aggregate_type)
            .bind_value(self.aggregate_id)
            .bind_value(self.event_type)
            .bind_value(self.schema_version)
            .bind_value(self.data_schema)
            .bind_value(self.source)
            .bind_value(self.payload)
            .bind_value(self.traceparent)
            .bind_value(self.tracestate)
    }

    /// Adds the event's ten values to `args`, in the order of [`Self::cte`]:
    /// for a statement assembled by hand, whose `$n` follow the arguments'
    /// count.
    pub fn add_to(self, args: &mut PgArguments) -> Result<(), BoxDynError> {
        args.add(self.id)?;
        args.add(self.aggregate_type)?;
        args.add(self.aggregate_id)?;
        args.add(self.event_type)?;
        args.add(self.schema_version)?;
        args.add(self.data_schema)?;
        args.add(self.source)?;
        args.add(self.payload)?;
        args.add(self.traceparent)?;
        args.add(self.tracestate)
    }
}

/// Several [`PendingEvent`]s that one business statement inserts, in order
/// (the relay publishes an aggregate's events in insertion order), as one
/// common table expression: a statement that changes many aggregates at once
/// records all their events in the same round trip.
#[derive(Debug, Clone, Default)]
pub struct PendingEvents(Vec<PendingEvent>);

impl PendingEvents {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, event: PendingEvent) {
        self.0.push(event);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `name AS (INSERT INTO outbox ...)`, one row per event, in the order
    /// they were pushed; like [`PendingEvent::cte`], it NOTIFYs a sleeping
    /// relay. It takes ten parameters (arrays) from
    /// `$first` on, bound by [`Self::bind`].
    pub fn cte(name: &str, first: usize) -> String {
        let p = |i: usize| format!("${}", first + i);
        format!(
            "{name} AS (
                 INSERT INTO outbox ({OUTBOX_COLUMNS})
                 SELECT e.id, e.aggregate_type, e.aggregate_id, e.event_type, e.schema_version,
                        e.data_schema, e.source, 'application/json', e.payload, e.traceparent, e.tracestate
                 FROM UNNEST({}::uuid[], {}::text[], {}::text[], {}::text[], {}::int[], {}::text[],
                             {}::text[], {}::bytea[], {}::text[], {}::text[])
                      WITH ORDINALITY AS e (id, aggregate_type, aggregate_id, event_type, schema_version,
                                            data_schema, source, payload, traceparent, tracestate, n)
                 ORDER BY e.n
                 RETURNING {})",
            p(0),
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6),
            p(7),
            p(8),
            p(9),
            NOTIFY_IF_PARKED.as_str(),
        )
    }

    /// Binds the events' ten arrays to a sqlx `query`, `query_as` or
    /// `query_scalar`, in the order of [`Self::cte`].
    pub fn bind<'q, Q: Bind<'q>>(self, query: Q) -> Q {
        let mut columns = (vec![], vec![], vec![], vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        for e in self.0 {
            columns.0.push(e.id);
            columns.1.push(e.aggregate_type);
            columns.2.push(e.aggregate_id);
            columns.3.push(e.event_type);
            columns.4.push(e.schema_version);
            columns.5.push(e.data_schema);
            columns.6.push(e.source);
            columns.7.push(e.payload);
            columns.8.push(e.traceparent);
            columns.9.push(e.tracestate);
        }
        query
            .bind_value(columns.0)
            .bind_value(columns.1)
            .bind_value(columns.2)
            .bind_value(columns.3)
            .bind_value(columns.4)
            .bind_value(columns.5)
            .bind_value(columns.6)
            .bind_value(columns.7)
            .bind_value(columns.8)
            .bind_value(columns.9)
    }
}

impl FromIterator<PendingEvent> for PendingEvents {
    fn from_iter<I: IntoIterator<Item = PendingEvent>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

/// A sqlx query that takes one more parameter: `query`, `query_as` and
/// `query_scalar` alike. Public only as the bound of [`PendingEvent::bind`]
/// and [`PendingEvents::bind`]: outside the crate it cannot be named, so
/// these three are all it is implemented for.
pub trait Bind<'q>: Sized {
    fn bind_value<T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(self, value: T) -> Self;
}

impl<'q> Bind<'q> for Query<'q, Postgres, PgArguments> {
    fn bind_value<T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(self, value: T) -> Self {
        self.bind(value)
    }
}

impl<'q, O> Bind<'q> for QueryAs<'q, Postgres, O, PgArguments> {
    fn bind_value<T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(self, value: T) -> Self {
        self.bind(value)
    }
}

impl<'q, O> Bind<'q> for QueryScalar<'q, Postgres, O, PgArguments> {
    fn bind_value<T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(self, value: T) -> Self {
        self.bind(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_events_cte_takes_its_parameters_from_first_on_once_per_row_of_the_guard() {
        let sql = PendingEvent::cte("event_1", 3, Some("o"));
        assert!(sql.starts_with("event_1 AS (\n INSERT INTO outbox (id, aggregate_type,"), "{sql}");
        assert!(
            sql.contains(
                "SELECT $3, $4, $5, $6, $7, $8, $9, 'application/json', $10, $11, $12 FROM o\n RETURNING "
            ),
            "{sql}"
        );
        assert!(sql.ends_with(')'), "{sql}");
        assert!(!PendingEvent::cte("e", 1, None).contains(" FROM "));
    }
}
