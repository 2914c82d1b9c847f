//! What {{name}} does with other services' events: it keeps the confirmed
//! orders (`OrderConfirmed` on `<topic_prefix>.order`) in a local read model.
//!
//! The consumer runs the handler inside the transaction that records the event
//! in the inbox, so a redelivered event changes nothing.

use futures::future::BoxFuture;
use sagaworks_outbox::{Handler, HandlerError, ReceivedEvent};
use sqlx::PgConnection;
use uuid::Uuid;

#[derive(Debug, Default)]
pub struct OrderEvents;

#[derive(serde::Deserialize)]
struct OrderConfirmed {
    order_id: Uuid,
    total_cents: i64,
}

impl Handler for OrderEvents {
    fn wants(&self, event: &ReceivedEvent) -> bool {
        event.event_type == "OrderConfirmed"
    }

    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a ReceivedEvent,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let confirmed: OrderConfirmed = event
                .json()
                .map_err(|e| HandlerError::Permanent(format!("unreadable OrderConfirmed: {e}")))?;
            sqlx::query(
                "INSERT INTO confirmed_orders (order_id, total_cents) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            )
            .bind(confirmed.order_id)
            .bind(confirmed.total_cents)
            .execute(tx)
            .await
            .map_err(|e| HandlerError::Retryable(e.to_string()))?;
            Ok(())
        })
    }
}
