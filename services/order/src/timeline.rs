//! The per-order event timeline: every event on the order, reservation and
//! payment topics that names an order is recorded for `GetOrder`.

use futures::future::BoxFuture;
use sagaworks_outbox::{Handler, HandlerError, ReceivedEvent};
use sqlx::PgConnection;
use uuid::Uuid;

pub struct Timeline;

#[derive(serde::Deserialize)]
struct AboutAnOrder {
    order_id: Option<Uuid>,
}

/// Records `events` (those that name an order) in one statement.
async fn record(tx: &mut PgConnection, events: &[&ReceivedEvent]) -> Result<(), HandlerError> {
    let mut rows = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for event in events {
        let about: AboutAnOrder = event
            .json()
            .map_err(|e| HandlerError::Permanent(format!("payload is not a JSON object: {e}")))?;
        let Some(order_id) = about.order_id else { continue };
        rows.0.push(order_id);
        rows.1.push(event.id);
        rows.2.push(event.event_type.as_str());
        rows.3.push(event.source.as_str());
        rows.4.push(event.time);
    }
    if rows.0.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO order_timeline (order_id, event_id, event_type, source, occurred_at)
         SELECT order_id, event_id, event_type, source, COALESCE(occurred_at, now())
         FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::timestamptz[])
             AS e (order_id, event_id, event_type, source, occurred_at)
         ON CONFLICT DO NOTHING",
    )
    .bind(rows.0)
    .bind(rows.1)
    .bind(rows.2)
    .bind(rows.3)
    .bind(rows.4)
    .execute(tx)
    .await
    .map_err(|e| HandlerError::Retryable(e.to_string()))?;
    Ok(())
}

impl Handler for Timeline {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a ReceivedEvent,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move { record(tx, &[event]).await })
    }

    /// A whole batch is one INSERT.
    fn handle_many<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        events: &'a [&'a ReceivedEvent],
        _spans: &'a [tracing::Span],
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(record(tx, events))
    }
}
