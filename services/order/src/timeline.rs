//! The per-order event timeline: every event on the order, reservation and
//! payment topics that names an order is recorded for `GetOrder`.

use sagaworks_events::{
    OrderCancelled, OrderConfirmed, OrderCreated, PaymentCharged, PaymentRefunded, StockCommitted,
    StockReleased, StockReserved,
};
use sagaworks_outbox::{Handler, HandlerError, ReceivedEvent};
use sqlx::PgConnection;
use uuid::Uuid;

pub struct Timeline;

sagaworks_events::dispatch! {
    /// The events the timeline records: those about an order.
    pub enum AboutAnOrder {
        OrderCreated, OrderConfirmed, OrderCancelled,
        StockReserved, StockReleased, StockCommitted,
        PaymentCharged, PaymentRefunded,
    }
}

impl AboutAnOrder {
    pub fn order_id(&self) -> Uuid {
        match self {
            Self::OrderCreated(e) => e.order_id,
            Self::OrderConfirmed(e) => e.order_id,
            Self::OrderCancelled(e) => e.order_id,
            Self::StockReserved(e) => e.order_id,
            Self::StockReleased(e) => e.order_id,
            Self::StockCommitted(e) => e.order_id,
            Self::PaymentCharged(e) => e.order_id,
            Self::PaymentRefunded(e) => e.order_id,
        }
    }
}

/// Records `events` in one statement.
async fn record(tx: &mut PgConnection, events: &[&ReceivedEvent]) -> Result<(), HandlerError> {
    let mut rows = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for event in events {
        let Some(about) = AboutAnOrder::decode(event)? else { continue };
        rows.0.push(about.order_id());
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
    /// Other events are acknowledged without a transaction.
    fn wants(&self, event: &ReceivedEvent) -> bool {
        AboutAnOrder::reads(&event.event_type)
    }

    async fn handle(&self, tx: &mut PgConnection, event: &ReceivedEvent) -> Result<(), HandlerError> {
        record(tx, &[event]).await
    }

    /// A whole batch is one INSERT.
    async fn handle_many(
        &self,
        tx: &mut PgConnection,
        events: &[&ReceivedEvent],
        _spans: &[tracing::Span],
    ) -> Result<(), HandlerError> {
        record(tx, events).await
    }
}
