//! What inventory does with other services' events: a confirmed order turns
//! its reservation into a sale (`reserved` -> `sold`).

use crate::error::Error;
use crate::stock::{self, ToCommit};
use futures::future::BoxFuture;
use sagaworks_outbox::{Handler, HandlerError, OutboxWriter, ReceivedEvent};
use sqlx::PgConnection;
use tracing::Instrument;
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

fn reservation_id(event: &ReceivedEvent) -> Result<Uuid, HandlerError> {
    let confirmed: OrderConfirmed =
        event.json().map_err(|e| HandlerError::Permanent(format!("unreadable OrderConfirmed: {e}")))?;
    Ok(confirmed.reservation_id)
}

fn handler_error(e: Error) -> HandlerError {
    match e {
        Error::Db(_) | Error::Outbox(_) => HandlerError::Retryable(e.to_string()),
        e => HandlerError::Permanent(e.to_string()),
    }
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
            stock::commit(tx, &self.outbox, reservation_id(event)?).await.map_err(handler_error)?;
            Ok(())
        })
    }

    /// A batch of confirmed orders is two statements, whatever its size
    /// ([`stock::commit_all`]); its database span is a child of the first
    /// event's span, linked to the others. A bad event fails the batch, whose
    /// events are then handled one at a time.
    fn handle_many<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        events: &'a [&'a ReceivedEvent],
        spans: &'a [tracing::Span],
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let requests = events
                .iter()
                .zip(spans)
                .map(|(event, span)| {
                    Ok(ToCommit { reservation_id: reservation_id(event)?, span: span.clone() })
                })
                .collect::<Result<Vec<_>, HandlerError>>()?;
            let Some(first) = spans.first() else { return Ok(()) };
            stock::commit_all(tx, &self.outbox, &requests)
                .instrument(first.clone())
                .await
                .map_err(handler_error)?;
            Ok(())
        })
    }
}
