//! The order-placement saga, as a [`Definition`] of `sagaworks_saga`, in two versions.
//! Version 2, which new orders start on, checks the customer's account first:
//!
//! ```text
//!  check_account ──ok──> reserve_stock ──ok──> charge_payment (pivot) ──ok──> confirm_order (local) ──> COMPLETED: order CONFIRMED
//!       │                     │                     │
//!  rejected/failed:      rejected: CANCELLED   rejected ──────────────────┐
//!  CANCELLED             failed ─────────┐     failed ──> refund_payment ──> release_stock ──> COMPENSATED: order CANCELLED
//!                                        └──────────────────────────────────────────^
//! ```
//!
//! Version 1 is the same without `check_account`. It stays registered, as code, until
//! no version-1 saga is unfinished (`sagaworks-admin sagas drain 1`); then
//! [`definition_v1`] and its line in [`versions`] can go (docs/design.md, "Changing a
//! saga").
//!
//! The library drives it (leases, crash resume, deadlines, retries, the
//! commit of every transition with its writes and events); this module is
//! only what is particular to orders: the saga's input, the three
//! participants' calls, the prices a reservation records, and the order's
//! end with its `OrderConfirmed`/`OrderCancelled` event.

use sagaworks_events::{OrderCancelled, OrderConfirmed};
use sagaworks_outbox::OutboxWriter;
use sagaworks_proto::inventory::v1 as inv;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_proto::payment::v1 as pay;
use sagaworks_proto::payment::v1::payment_service_client::PaymentServiceClient;
use sagaworks_resilience::ResilientChannel;
use sagaworks_saga::{
    Action, ActionKind, Compensation, Definition, End, OperatorRecord, Saga, Statement, StepContext,
    StepError, Versions,
};
use sagaworks_telemetry::grpc::{ClientTrace, ClientTraceLayer};
use serde::{Deserialize, Serialize};
use tower::Layer;
use uuid::Uuid;

/// A participant channel: the resilience stack, each call traced.
type Channel = ClientTrace<ResilientChannel>;

/// Every version this binary drives, the newest (the one new orders start on) first.
pub fn versions(inventory: ResilientChannel, payment: ResilientChannel) -> Versions<PlaceOrder> {
    Versions::new(definition(inventory.clone(), payment.clone())).and(definition_v1(inventory, payment))
}

/// Version 2: an order of a customer without an account, or with nothing on it, is
/// cancelled before any stock is held for it.
pub fn definition(inventory: ResilientChannel, payment: ResilientChannel) -> Definition<PlaceOrder> {
    let inventory = InventoryServiceClient::new(ClientTraceLayer::new("order").layer(inventory));
    let payment = PaymentServiceClient::new(ClientTraceLayer::new("order").layer(payment));
    Definition::builder(PlaceOrder { outbox: OutboxWriter::new("order") })
        .version(2)
        .check(CheckAccount(payment.clone()))
        .compensatable(ReserveStock(inventory.clone()), ReleaseStock(inventory))
        // A charge that timed out may have happened: refunded.
        .pivot_compensatable(ChargePayment(payment.clone()), RefundPayment(payment))
        .retriable(ConfirmOrder)
        .build()
        .expect("the order saga is well formed")
}

/// Version 1, kept until its sagas have drained.
pub fn definition_v1(inventory: ResilientChannel, payment: ResilientChannel) -> Definition<PlaceOrder> {
    let inventory = InventoryServiceClient::new(ClientTraceLayer::new("order").layer(inventory));
    let payment = PaymentServiceClient::new(ClientTraceLayer::new("order").layer(payment));
    Definition::builder(PlaceOrder { outbox: OutboxWriter::new("order") })
        .compensatable(ReserveStock(inventory.clone()), ReleaseStock(inventory))
        // A charge that timed out may have happened: refunded.
        .pivot_compensatable(ChargePayment(payment.clone()), RefundPayment(payment))
        .retriable(ConfirmOrder)
        .build()
        .expect("the order saga is well formed")
}

pub struct PlaceOrder {
    outbox: OutboxWriter,
}

/// What an order's saga starts from (persisted with it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderInput {
    pub order_id: Uuid,
    pub customer_id: Uuid,
    /// In product order.
    pub items: Vec<Line>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Line {
    pub product_id: Uuid,
    pub quantity: i64,
}

impl Saga for PlaceOrder {
    const NAME: &'static str = "place_order";
    type Input = OrderInput;

    /// The order is CONFIRMED or CANCELLED with its event, in the statement
    /// that ends the saga.
    fn on_end(&self, ctx: &StepContext<'_, Self>, end: &End<'_>, w: &mut Statement) -> Result<(), StepError> {
        let input = ctx.input();
        let total_cents = ctx.try_output::<ReserveStock>()?.map_or(0, |r| r.total_cents);
        // The reservation and the payment are keyed by the saga's id.
        let saga_id = ctx.saga_id();
        let (order_id, customer_id) = (input.order_id, input.customer_id);
        let (status, reason, event) = match end {
            End::Completed => {
                let confirmed = OrderConfirmed {
                    order_id,
                    customer_id,
                    saga_id,
                    reservation_ids: vec![saga_id],
                    payment_id: saga_id,
                    total_cents,
                };
                ("CONFIRMED", None, self.outbox.stage(&confirmed))
            }
            End::Compensated { reason } => {
                let cancelled = OrderCancelled {
                    order_id,
                    customer_id,
                    saga_id,
                    reservation_id: saga_id,
                    payment_id: saga_id,
                    total_cents,
                    reason: reason.to_string(),
                };
                ("CANCELLED", Some(reason.to_string()), self.outbox.stage(&cancelled))
            }
        };
        let (id, status, reason) = (w.bind(input.order_id), w.bind(status), w.bind(reason));
        w.guarded("order_end", |g| {
            g.update("orders")
                .set(format!("status = {status}, failure_reason = {reason}, updated_at = now()"))
                .filter(format!("orders.id = {id}"))
        });
        w.event(event.map_err(|e| StepError::Failed(e.to_string()))?);
        Ok(())
    }

    /// An operator's action shows in the order's timeline (source `operator:<who>`).
    fn on_operator_action(
        &self,
        ctx: &StepContext<'_, Self>,
        action: &OperatorRecord<'_>,
        w: &mut Statement,
    ) -> Result<(), StepError> {
        let event_type = match action.action {
            ActionKind::Retry => "SagaRetriedByOperator",
            ActionKind::Compensate => "SagaCompensatedByOperator",
            ActionKind::Resolve => "SagaStepResolvedByOperator",
        };
        let (order, event) = (w.bind(ctx.input().order_id), w.bind(Uuid::now_v7()));
        let (event_type, source) = (w.bind(event_type), w.bind(format!("operator:{}", action.actor)));
        w.guarded("order_timeline_action", |g| {
            g.insert("order_timeline (order_id, event_id, event_type, source, occurred_at)")
                .select(format!("{order}, {event}, {event_type}, {source}, now()"))
        });
        Ok(())
    }
}

/// What a reservation answered: inventory owns prices. (Also what an
/// operator states when resolving `reserve_stock` by hand.)
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reserved {
    pub total_cents: i64,
    pub prices: Vec<Price>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub product_id: Uuid,
    pub unit_price_cents: i64,
}

/// Version 2's first step: the customer has an account with money on it. It reads
/// only, so there is nothing to undo; the charge still decides whether the balance
/// covers the order (prices are known only once the stock is reserved).
pub struct CheckAccount(PaymentServiceClient<Channel>);

impl Action<PlaceOrder> for CheckAccount {
    const NAME: &'static str = "check_account";
    type Output = ();

    async fn run(&self, ctx: &StepContext<'_, PlaceOrder>) -> Result<(), StepError> {
        let request = pay::GetAccountRequest { customer_id: ctx.input().customer_id.to_string() };
        // No account is NOT_FOUND: rejected.
        let account = self.0.clone().get_account(request).await.map_err(|s| ctx.grpc_error(&s))?.into_inner();
        if account.balance_cents <= 0 {
            return Err(StepError::Rejected(format!("{}: the account has no credit", Self::NAME)));
        }
        Ok(())
    }
}

pub struct ReserveStock(InventoryServiceClient<Channel>);

impl Action<PlaceOrder> for ReserveStock {
    const NAME: &'static str = "reserve_stock";
    type Output = Reserved;

    async fn run(&self, ctx: &StepContext<'_, PlaceOrder>) -> Result<Reserved, StepError> {
        let input = ctx.input();
        let request = inv::ReserveStockRequest {
            idempotency_key: ctx.idempotency_key(),
            reservation_id: ctx.saga_id().to_string(),
            order_id: input.order_id.to_string(),
            items: input
                .items
                .iter()
                .map(|l| inv::ReserveItem { product_id: l.product_id.to_string(), quantity: l.quantity })
                .collect(),
        };
        let reservation =
            self.0.clone().reserve_stock(request).await.map_err(|s| ctx.grpc_error(&s))?.into_inner();
        let prices = reservation
            .lines
            .iter()
            .filter_map(|l| {
                Some(Price { product_id: l.product_id.parse().ok()?, unit_price_cents: l.unit_price_cents })
            })
            .collect();
        Ok(Reserved { total_cents: reservation.total_cents, prices })
    }

    /// The order's prices and total, with the step's result.
    fn record(
        &self,
        ctx: &StepContext<'_, PlaceOrder>,
        r: &Reserved,
        w: &mut Statement,
    ) -> Result<(), StepError> {
        let (products, cents): (Vec<Uuid>, Vec<i64>) =
            r.prices.iter().map(|p| (p.product_id, p.unit_price_cents)).unzip();
        let id = w.bind(ctx.input().order_id);
        let (products, cents, total) = (w.bind(products), w.bind(cents), w.bind(r.total_cents));
        w.guarded("order_prices", |g| {
            g.update("order_items")
                .set("unit_price_cents = p.price")
                .from(format!("UNNEST({products}::uuid[], {cents}::bigint[]) AS p (product_id, price)"))
                .filter(format!("order_items.order_id = {id} AND order_items.product_id = p.product_id"))
        });
        w.guarded("order_total", |g| {
            g.update("orders")
                .set(format!("total_cents = {total}, updated_at = now()"))
                .filter(format!("orders.id = {id}"))
        });
        Ok(())
    }
}

pub struct ReleaseStock(InventoryServiceClient<Channel>);

impl Compensation<PlaceOrder> for ReleaseStock {
    const NAME: &'static str = "release_stock";

    async fn run(&self, ctx: &StepContext<'_, PlaceOrder>) -> Result<(), StepError> {
        let request = inv::ReleaseReservationRequest {
            idempotency_key: ctx.idempotency_key(),
            reservation_id: ctx.saga_id().to_string(),
            order_id: ctx.input().order_id.to_string(),
            reason: ctx.failure_reason().to_string(),
        };
        self.0.clone().release_reservation(request).await.map_err(|s| ctx.grpc_error(&s))?;
        Ok(())
    }
}

pub struct ChargePayment(PaymentServiceClient<Channel>);

impl Action<PlaceOrder> for ChargePayment {
    const NAME: &'static str = "charge_payment";
    type Output = ();

    async fn run(&self, ctx: &StepContext<'_, PlaceOrder>) -> Result<(), StepError> {
        let input = ctx.input();
        let request = pay::ChargeRequest {
            idempotency_key: ctx.idempotency_key(),
            payment_id: ctx.saga_id().to_string(),
            customer_id: input.customer_id.to_string(),
            order_id: input.order_id.to_string(),
            amount_cents: ctx.output::<ReserveStock>()?.total_cents,
        };
        self.0.clone().charge(request).await.map_err(|s| ctx.grpc_error(&s))?;
        Ok(())
    }
}

pub struct RefundPayment(PaymentServiceClient<Channel>);

impl Compensation<PlaceOrder> for RefundPayment {
    const NAME: &'static str = "refund_payment";

    async fn run(&self, ctx: &StepContext<'_, PlaceOrder>) -> Result<(), StepError> {
        let request = pay::RefundRequest {
            idempotency_key: ctx.idempotency_key(),
            payment_id: ctx.saga_id().to_string(),
            order_id: ctx.input().order_id.to_string(),
            reason: ctx.failure_reason().to_string(),
        };
        self.0.clone().refund(request).await.map_err(|s| ctx.grpc_error(&s))?;
        Ok(())
    }
}

/// Local: the order's confirmation is the saga's end ([`PlaceOrder::on_end`]).
pub struct ConfirmOrder;

impl Action<PlaceOrder> for ConfirmOrder {
    const NAME: &'static str = "confirm_order";
    type Output = ();
    const LOCAL: bool = true;

    async fn run(&self, _: &StepContext<'_, PlaceOrder>) -> Result<(), StepError> {
        Ok(())
    }
}
