//! What inventory does with other services' events: a confirmed order turns
//! its reservation into a sale (`reserved` -> `sold`).

use crate::error::Error;
use crate::stock;
use futures::future::BoxFuture;
use sagaworks_outbox::{Handler, HandlerError, OutboxWriter, ReceivedEvent};
use sqlx::PgConnection;
use uuid::Uuid;

pub struct OrderEvents {
    outbox: OutboxWriter,
}

impl OrderEvents {
    pub fn new() -> Self {
        Self { outbox: OutboxWriter::new("inventory") }
    }
}

impl Default for OrderEvents {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(serde::Deserialize)]
struct OrderConfirmed {
    reservation_id: Uuid,
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
            match stock::commit(tx, &self.outbox, confirmed.reservation_id).await {
                Ok(_) => Ok(()),
                Err(e @ (Error::Db(_) | Error::Outbox(_))) => Err(HandlerError::Retryable(e.to_string())),
                Err(e) => Err(HandlerError::Permanent(e.to_string())),
            }
        })
    }
}
