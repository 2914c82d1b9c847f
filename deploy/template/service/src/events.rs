//! What {{name}} does with other services' events: it keeps the confirmed
//! orders (`OrderConfirmed` on `<topic_prefix>.order`) in a local read model.
//!
//! The consumer runs the handler inside the transaction that records the event
//! in the inbox, so a redelivered event changes nothing.

use sagaworks_events::OrderConfirmed;
use sagaworks_outbox::{Handler, HandlerError, ReceivedEvent};
use sqlx::PgConnection;

#[derive(Debug, Default)]
pub struct OrderEvents;

impl Handler for OrderEvents {
    /// The order topic's other events are acknowledged without a transaction.
    fn wants(&self, event: &ReceivedEvent) -> bool {
        event.is::<OrderConfirmed>()
    }

    async fn handle(&self, tx: &mut PgConnection, event: &ReceivedEvent) -> Result<(), HandlerError> {
        // The contract's type: older versions upcast, a newer one parked
        // (dlq_reason=unsupported_schema_version) until this service is rebuilt.
        let confirmed: OrderConfirmed = event.decode()?;
        sqlx::query(
            "INSERT INTO confirmed_orders (order_id, total_cents) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(confirmed.order_id)
        .bind(confirmed.total_cents)
        .execute(tx)
        .await
        .map_err(|e| HandlerError::Retryable(e.to_string()))?;
        Ok(())
    }
}
