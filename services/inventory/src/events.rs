//! What inventory does with other services' events: a confirmed order turns
//! its reservations into sales (`reserved` -> `sold`).

use crate::error::Error;
use crate::stock::{self, ToCommit};
use sagaworks_events::OrderConfirmed;
use sagaworks_outbox::{Handler, HandlerError, OutboxWriter, ReceivedEvent};
use sqlx::PgConnection;
use tracing::Instrument;

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

/// What to commit for `event` (an `OrderConfirmed` of any version this
/// build reads: v1 is upcast to one reservation), in `span`.
fn to_commit(event: &ReceivedEvent, span: &tracing::Span) -> Result<Vec<ToCommit>, HandlerError> {
    let confirmed: OrderConfirmed = event.decode()?;
    let order_id = confirmed.order_id;
    Ok(confirmed
        .reservation_ids
        .into_iter()
        .map(|reservation_id| ToCommit { reservation_id, order_id, span: span.clone() })
        .collect())
}

fn handler_error(e: Error) -> HandlerError {
    match e {
        Error::Db(_) | Error::Outbox(_) => HandlerError::Retryable(e.to_string()),
        e => HandlerError::Permanent(e.to_string()),
    }
}

impl Handler for OrderEvents {
    fn wants(&self, event: &ReceivedEvent) -> bool {
        event.is::<OrderConfirmed>()
    }

    async fn handle(&self, tx: &mut PgConnection, event: &ReceivedEvent) -> Result<(), HandlerError> {
        let requests = to_commit(event, &tracing::Span::current())?;
        stock::commit_all(tx, &self.outbox, &requests).await.map_err(handler_error)?;
        Ok(())
    }

    /// A batch of confirmed orders is two statements, whatever its size
    /// ([`stock::commit_all`]); its database span is a child of the first
    /// event's span, linked to the others. A bad event fails the batch, whose
    /// events are then handled one at a time.
    async fn handle_many(
        &self,
        tx: &mut PgConnection,
        events: &[&ReceivedEvent],
        spans: &[tracing::Span],
    ) -> Result<(), HandlerError> {
        let mut requests = Vec::with_capacity(events.len());
        for (event, span) in events.iter().zip(spans) {
            requests.extend(to_commit(event, span)?);
        }
        let Some(first) = spans.first() else { return Ok(()) };
        stock::commit_all(tx, &self.outbox, &requests)
            .instrument(first.clone())
            .await
            .map_err(handler_error)?;
        Ok(())
    }
}
