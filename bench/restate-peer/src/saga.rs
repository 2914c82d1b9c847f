//! The order saga of sagaworks (`services/order/src/saga.rs`) as one Restate virtual
//! object, `OrderSaga`, keyed by the order id:
//!
//! ```text
//!   reserve_stock ──ok──> charge_payment ──ok──> confirm_order ──> CONFIRMED
//!        │                     │
//!    rejected: CANCELLED   rejected ──────────────────┐
//!    failed ─────────┐     failed ──> refund_payment ──> release_stock ──> CANCELLED
//!                    └──────────────────────────────────────────^
//! ```
//!
//! Every side effect is a journaled `ctx.run`: a retry or a crash replays its result
//! instead of calling again. The participants are called as the order service calls
//! them: idempotency key `<saga_id>:<step>`, reservation and payment id = the saga id,
//! 2 s per attempt, 3 attempts for a forward step; compensations and the end event are
//! retried until done. The order is the object's state; the end publishes
//! `OrderConfirmed` (v2) or `OrderCancelled` (v1).

use crate::events::Publisher;
use crate::order::{Order, OrderBody, Outcome, Status, order_id};
use crate::participants::{Answer, CallFailed, Participants, attempt};
use restate_sdk::prelude::*;
use sagaworks_event::Event;
use sagaworks_events::{OrderCancelled, OrderConfirmed};
use sagaworks_proto::inventory::v1 as inv;
use sagaworks_proto::payment::v1 as pay;
use std::time::Duration;
use uuid::Uuid;

/// The object's state key of the order.
const ORDER: &str = "order";

/// A forward step: 3 attempts (the order service's `retry.max_attempts`), then it failed.
fn forward_policy() -> RunRetryPolicy {
    RunRetryPolicy::new()
        .initial_delay(Duration::from_millis(50))
        .exponentiation_factor(2.0)
        .max_delay(Duration::from_secs(1))
        .max_attempts(3)
}

/// Compensations and the end event: retried until done, the backoff capped.
fn until_done_policy() -> RunRetryPolicy {
    RunRetryPolicy::new()
        .initial_delay(Duration::from_millis(50))
        .exponentiation_factor(2.0)
        .max_delay(Duration::from_secs(5))
}

/// How a forward step ended.
enum Step<T> {
    Done(T),
    /// A business refusal: nothing of the step happened.
    Rejected(String),
    /// Its attempts ran out: it may have happened, so it is compensated.
    Failed(String),
}

pub struct OrderSaga {
    participants: Participants,
    publisher: Publisher,
}

impl OrderSaga {
    pub fn new(participants: Participants, publisher: Publisher) -> Self {
        Self { participants, publisher }
    }
}

#[restate_sdk::object]
impl OrderSaga {
    /// Places the order keyed by the object's key and runs its saga to the end; an order
    /// placed before answers its outcome again.
    #[handler]
    async fn place(
        &self,
        mut ctx: ObjectContext<'_>,
        body: Json<OrderBody>,
    ) -> Result<Json<Outcome>, HandlerError> {
        let unprocessable = |e: crate::order::InputError| TerminalError::new_with_code(422, e.to_string());
        let order_id = order_id(ctx.key()).map_err(unprocessable)?;
        if let Some(Json(done)) = ctx.get::<Json<Order>>(ORDER).await?
            && done.status != Status::Pending
        {
            return Ok(Json(Outcome::from(&done)));
        }
        let input = body.into_inner().check().map_err(unprocessable)?;
        let saga_id = ctx.rand_uuid();
        let mut order = Order {
            order_id,
            customer_id: input.customer_id,
            items: input.items,
            status: Status::Pending,
            total_cents: 0,
            failure_reason: None,
        };
        ctx.set(ORDER, Json(order.clone()));

        let total = match self.reserve_stock(&ctx, &order, saga_id).await {
            Step::Done(total) => total,
            Step::Rejected(reason) => return self.end(&mut ctx, order, saga_id, Err(reason)).await,
            Step::Failed(reason) => {
                self.release_stock(&ctx, &order, saga_id, &reason).await?;
                return self.end(&mut ctx, order, saga_id, Err(reason)).await;
            }
        };
        order.total_cents = total;
        ctx.set(ORDER, Json(order.clone()));

        match self.charge_payment(&ctx, &order, saga_id).await {
            Step::Done(()) => self.end(&mut ctx, order, saga_id, Ok(())).await,
            Step::Rejected(reason) => {
                self.release_stock(&ctx, &order, saga_id, &reason).await?;
                self.end(&mut ctx, order, saga_id, Err(reason)).await
            }
            Step::Failed(reason) => {
                // A charge that timed out may have happened: refunded.
                self.refund_payment(&ctx, &order, saga_id, &reason).await?;
                self.release_stock(&ctx, &order, saga_id, &reason).await?;
                self.end(&mut ctx, order, saga_id, Err(reason)).await
            }
        }
    }
}

/// The participant's idempotency key of `step` (the saga library's).
fn key(saga_id: Uuid, step: &str) -> String {
    format!("{saga_id}:{step}")
}

impl OrderSaga {
    async fn reserve_stock(&self, ctx: &ObjectContext<'_>, order: &Order, saga_id: Uuid) -> Step<i64> {
        const STEP: &str = "reserve_stock";
        let request = inv::ReserveStockRequest {
            idempotency_key: key(saga_id, STEP),
            reservation_id: saga_id.to_string(),
            order_id: order.order_id.to_string(),
            items: order
                .items
                .iter()
                .map(|l| inv::ReserveItem { product_id: l.product_id.clone(), quantity: l.quantity })
                .collect(),
        };
        let client = self.participants.inventory.clone();
        let run = ctx.run(move || async move {
            let answer = attempt(STEP, client.clone().reserve_stock(request)).await?;
            Ok(Json(match answer {
                Answer::Done(reservation) => Answer::Done(reservation.total_cents),
                Answer::Rejected(reason) => Answer::Rejected(reason),
            }))
        });
        forward(STEP, run.name(STEP).retry_policy(forward_policy()).await)
    }

    async fn charge_payment(&self, ctx: &ObjectContext<'_>, order: &Order, saga_id: Uuid) -> Step<()> {
        const STEP: &str = "charge_payment";
        let request = pay::ChargeRequest {
            idempotency_key: key(saga_id, STEP),
            payment_id: saga_id.to_string(),
            customer_id: order.customer_id.to_string(),
            order_id: order.order_id.to_string(),
            amount_cents: order.total_cents,
        };
        let client = self.participants.payment.clone();
        let run = ctx.run(move || async move {
            let answer = attempt(STEP, client.clone().charge(request)).await?;
            Ok(Json(match answer {
                Answer::Done(_) => Answer::Done(()),
                Answer::Rejected(reason) => Answer::Rejected(reason),
            }))
        });
        forward(STEP, run.name(STEP).retry_policy(forward_policy()).await)
    }

    async fn release_stock(
        &self,
        ctx: &ObjectContext<'_>,
        order: &Order,
        saga_id: Uuid,
        reason: &str,
    ) -> Result<(), TerminalError> {
        const STEP: &str = "release_stock";
        let request = inv::ReleaseReservationRequest {
            idempotency_key: key(saga_id, STEP),
            reservation_id: saga_id.to_string(),
            order_id: order.order_id.to_string(),
            reason: reason.to_owned(),
        };
        let client = self.participants.inventory.clone();
        ctx.run(move || async move { undo(attempt(STEP, client.clone().release_reservation(request)).await) })
            .name(STEP)
            .retry_policy(until_done_policy())
            .await
    }

    async fn refund_payment(
        &self,
        ctx: &ObjectContext<'_>,
        order: &Order,
        saga_id: Uuid,
        reason: &str,
    ) -> Result<(), TerminalError> {
        const STEP: &str = "refund_payment";
        let request = pay::RefundRequest {
            idempotency_key: key(saga_id, STEP),
            payment_id: saga_id.to_string(),
            order_id: order.order_id.to_string(),
            reason: reason.to_owned(),
        };
        let client = self.participants.payment.clone();
        ctx.run(move || async move { undo(attempt(STEP, client.clone().refund(request)).await) })
            .name(STEP)
            .retry_policy(until_done_policy())
            .await
    }

    /// The saga's end: the order's final state, its event published, the answer.
    async fn end(
        &self,
        ctx: &mut ObjectContext<'_>,
        mut order: Order,
        saga_id: Uuid,
        result: Result<(), String>,
    ) -> Result<Json<Outcome>, HandlerError> {
        (order.status, order.failure_reason) = match &result {
            Ok(()) => (Status::Confirmed, None),
            Err(reason) => (Status::Cancelled, Some(reason.clone())),
        };
        ctx.set(ORDER, Json(order.clone()));
        let event_id = ctx.rand_uuid();
        match result {
            Ok(()) => {
                let event = OrderConfirmed {
                    order_id: order.order_id,
                    customer_id: order.customer_id,
                    saga_id,
                    reservation_ids: vec![saga_id],
                    payment_id: saga_id,
                    total_cents: order.total_cents,
                };
                self.publish(ctx, "confirm_order", event, event_id).await?;
            }
            Err(reason) => {
                let event = OrderCancelled {
                    order_id: order.order_id,
                    customer_id: order.customer_id,
                    saga_id,
                    reservation_id: saga_id,
                    payment_id: saga_id,
                    total_cents: order.total_cents,
                    reason,
                };
                self.publish(ctx, "cancel_order", event, event_id).await?;
            }
        }
        Ok(Json(Outcome::from(&order)))
    }

    /// Publishes the end event as step `step`, retried until done.
    async fn publish<E: Event>(
        &self,
        ctx: &ObjectContext<'_>,
        step: &'static str,
        event: E,
        event_id: Uuid,
    ) -> Result<(), TerminalError> {
        let publisher = self.publisher.clone();
        ctx.run(move || async move { Ok(publisher.publish(&event, event_id).await?) })
            .name(step)
            .retry_policy(until_done_policy())
            .await
    }
}

/// A forward step's journaled result: its attempts running out is a terminal error of
/// the run, which the saga compensates.
fn forward<T>(step: &str, run: Result<Json<Answer<T>>, TerminalError>) -> Step<T> {
    match run.map(Json::into_inner) {
        Ok(Answer::Done(value)) => Step::Done(value),
        Ok(Answer::Rejected(reason)) => Step::Rejected(reason),
        Err(e) => Step::Failed(format!("{step}: {}", e.message())),
    }
}

/// A compensation's attempt: a refusal is no success, it is retried until done (like
/// the saga library's compensations).
fn undo<T>(answer: Result<Answer<T>, CallFailed>) -> Result<(), HandlerError> {
    match answer? {
        Answer::Done(_) => Ok(()),
        Answer::Rejected(reason) => Err(HandlerError::from(reason)),
    }
}
