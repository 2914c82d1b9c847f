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

impl Handler for Timeline {
    fn handle<'a>(&'a self, tx: &'a mut PgConnection, event: &'a ReceivedEvent) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let about: AboutAnOrder =
                event.json().map_err(|e| HandlerError::Permanent(format!("payload is not a JSON object: {e}")))?;
            let Some(order_id) = about.order_id else { return Ok(()) };
            sqlx::query(
                "INSERT INTO order_timeline (order_id, event_id, event_type, source, occurred_at)
                 VALUES ($1, $2, $3, $4, COALESCE($5, now())) ON CONFLICT DO NOTHING",
            )
            .bind(order_id)
            .bind(event.id)
            .bind(&event.event_type)
            .bind(&event.source)
            .bind(event.time)
            .execute(tx)
            .await
            .map_err(|e| HandlerError::Retryable(e.to_string()))?;
            Ok(())
        })
    }
}
