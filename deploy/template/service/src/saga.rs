//! The example saga this service hosts (replace it with yours): a new item
//! claims one unit of its product at inventory, then becomes ACTIVE; when
//! inventory has none left, the item is REJECTED.
//!
//! ```text
//!  reserve_unit ──ok──> activate_item (local pivot) ──> stamp_activation (local, v2) ──> COMPLETED:
//!       │                                                        item ACTIVE, ItemActivated
//!       │ rejected: REJECTED, ItemRejected
//!       │ failed (may have reserved) ──> release_unit ──> COMPENSATED: item REJECTED, ItemRejected
//! ```
//!
//! Two versions, as a saga changed while claims are in flight has (docs/design.md,
//! "Changing a saga"): version 2 ([`definition`]) adds `stamp_activation` and starts every
//! new claim; version 1 ([`definition_v1`]) finishes the claims that started on it. Once
//! `sagaworks-admin sagas versions` shows v1 drained, delete it from [`versions`].
//!
//! `sagaworks_saga` drives it: leases, crash resume, the step's deadline,
//! retries, and every transition committed with its writes and events. What
//! is here is only what is particular to items. To add a step, write an
//! [`Action`] (and, before the pivot, its [`Compensation`]) and add one line
//! to [`definition`]; `tests/saga.rs` then runs the new step's fault cases
//! too (docs/design.md, "Adding a saga step").

use crate::contract::{ItemActivated, ItemRejected};
use sagaworks_outbox::OutboxWriter;
use sagaworks_proto::inventory::v1 as inv;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_resilience::ResilientChannel;
use sagaworks_saga::{
    Action, Compensation, Definition, End, Saga, Statement, StepContext, StepError, Versions,
};
use sagaworks_telemetry::grpc::{ClientTrace, ClientTraceLayer};
use serde::{Deserialize, Serialize};
use tower::Layer;
use uuid::Uuid;

type Inventory = InventoryServiceClient<ClientTrace<ResilientChannel>>;

/// Every version this service drives: the newest starts new claims.
pub fn versions(inventory: ResilientChannel) -> Versions<ClaimUnit> {
    Versions::new(definition(inventory.clone())).and(definition_v1(inventory))
}

/// Version 2, the one new claims start on: version 1, then `stamp_activation`.
pub fn definition(inventory: ResilientChannel) -> Definition<ClaimUnit> {
    let inventory = InventoryServiceClient::new(ClientTraceLayer::new("{{name}}").layer(inventory));
    Definition::builder(ClaimUnit { outbox: OutboxWriter::new("{{name}}") })
        .version(2)
        .compensatable(ReserveUnit(inventory.clone()), ReleaseUnit(inventory))
        .pivot(ActivateItem)
        .retriable(StampActivation)
        .build()
        .expect("the claim saga is well formed")
}

/// Version 1, kept as code until no claim that started on it is unfinished.
pub fn definition_v1(inventory: ResilientChannel) -> Definition<ClaimUnit> {
    let inventory = InventoryServiceClient::new(ClientTraceLayer::new("{{name}}").layer(inventory));
    Definition::builder(ClaimUnit { outbox: OutboxWriter::new("{{name}}") })
        .compensatable(ReserveUnit(inventory.clone()), ReleaseUnit(inventory))
        .pivot(ActivateItem)
        .build()
        .expect("the claim saga is well formed")
}

pub struct ClaimUnit {
    outbox: OutboxWriter,
}

/// What an item's claim starts from (persisted with it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClaimInput {
    pub item_id: Uuid,
    pub product_id: Uuid,
}

impl Saga for ClaimUnit {
    const NAME: &'static str = "claim_unit";
    type Input = ClaimInput;

    /// The item's status and its event, in the statement that ends the saga.
    fn on_end(&self, ctx: &StepContext<'_, Self>, end: &End<'_>, w: &mut Statement) -> Result<(), StepError> {
        let item_id = ctx.input().item_id;
        let (status, event) = match end {
            End::Completed => ("ACTIVE", self.outbox.stage(&ItemActivated { item_id })),
            End::Compensated { reason } => {
                ("REJECTED", self.outbox.stage(&ItemRejected { item_id, reason: reason.to_string() }))
            }
        };
        let (id, status) = (w.bind(item_id), w.bind(status));
        // Guarded: written only while this replica holds the saga's lease.
        w.guarded("item_end", |g| {
            g.update("items").set(format!("status = {status}")).filter(format!("items.id = {id}"))
        });
        w.event(event.map_err(|e| StepError::Failed(e.to_string()))?);
        Ok(())
    }
}

/// One unit of the item's product, held by a reservation named after the saga.
pub struct ReserveUnit(Inventory);

impl Action<ClaimUnit> for ReserveUnit {
    const NAME: &'static str = "reserve_unit";
    type Output = ();

    async fn run(&self, ctx: &StepContext<'_, ClaimUnit>) -> Result<(), StepError> {
        let input = ctx.input();
        let request = inv::ReserveStockRequest {
            idempotency_key: ctx.idempotency_key(),
            reservation_id: ctx.saga_id().to_string(),
            order_id: input.item_id.to_string(),
            items: vec![inv::ReserveItem { product_id: input.product_id.to_string(), quantity: 1 }],
        };
        self.0.clone().reserve_stock(request).await.map_err(|s| ctx.grpc_error(&s))?;
        Ok(())
    }
}

pub struct ReleaseUnit(Inventory);

impl Compensation<ClaimUnit> for ReleaseUnit {
    const NAME: &'static str = "release_unit";

    async fn run(&self, ctx: &StepContext<'_, ClaimUnit>) -> Result<(), StepError> {
        let request = inv::ReleaseReservationRequest {
            idempotency_key: ctx.idempotency_key(),
            reservation_id: ctx.saga_id().to_string(),
            order_id: ctx.input().item_id.to_string(),
            reason: ctx.failure_reason().to_string(),
        };
        self.0
            .clone()
            .release_reservation(request)
            .await
            .map_err(|s| ctx.grpc_error(&s))?;
        Ok(())
    }
}

/// Local: the item's activation is the saga's end ([`ClaimUnit::on_end`]).
pub struct ActivateItem;

impl Action<ClaimUnit> for ActivateItem {
    const NAME: &'static str = "activate_item";
    type Output = ();
    const LOCAL: bool = true;

    async fn run(&self, _: &StepContext<'_, ClaimUnit>) -> Result<(), StepError> {
        Ok(())
    }
}

/// Local, version 2: records when the item became active (`item_activations`), in the
/// statement that ends the saga.
pub struct StampActivation;

impl Action<ClaimUnit> for StampActivation {
    const NAME: &'static str = "stamp_activation";
    type Output = ();
    const LOCAL: bool = true;

    async fn run(&self, _: &StepContext<'_, ClaimUnit>) -> Result<(), StepError> {
        Ok(())
    }

    /// A row of its own: [`ClaimUnit::on_end`] updates the item in the same statement.
    fn record(&self, ctx: &StepContext<'_, ClaimUnit>, _: &(), w: &mut Statement) -> Result<(), StepError> {
        let id = w.bind(ctx.input().item_id);
        w.guarded("item_stamp", |g| {
            g.insert("item_activations (item_id)").select(id.to_string()).then("ON CONFLICT DO NOTHING")
        });
        Ok(())
    }
}
