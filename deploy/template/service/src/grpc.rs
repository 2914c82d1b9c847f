//! The gRPC face of {{name}}: validates requests, asks inventory, runs them on
//! the database, maps domain values to the protobuf contract.

use crate::error::Error;
use crate::items::{self, Item, NewItem};
use crate::saga::ClaimUnit;
use sagaworks_saga::Engine;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use crate::pb;
use crate::pb::{{name}}_service_server::{{Name}}Service;
use sagaworks_errors::validate::{text, uuid, uuid_or_new};
use sagaworks_outbox::OutboxWriter;
use sagaworks_proto::inventory::v1::GetStockRequest;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_resilience::ResilientChannel;
use sagaworks_telemetry::grpc::{ClientTrace, ClientTraceLayer};
use sqlx::PgPool;
use tonic::{Code, Request, Response, Status};
use tower::Layer;
use uuid::Uuid;

type Inventory = InventoryServiceClient<ClientTrace<ResilientChannel>>;

#[derive(Clone)]
pub struct Items {
    pool: PgPool,
    outbox: OutboxWriter,
    inventory: Inventory,
    saga: Engine<ClaimUnit>,
    shutdown: CancellationToken,
}

impl Items {
    /// `inventory` is the resilient channel built once at startup (clones share it).
    pub fn new(
        pool: PgPool,
        inventory: ResilientChannel,
        saga: Engine<ClaimUnit>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            pool,
            outbox: OutboxWriter::new("{{name}}"),
            inventory: InventoryServiceClient::new(ClientTraceLayer::new("{{name}}").layer(inventory)),
            saga,
            shutdown,
        }
    }

    /// Fails with [`Error::UnknownProduct`] unless inventory knows the product.
    async fn check_product(&self, product_id: Uuid) -> Result<(), Error> {
        let request = GetStockRequest { product_id: product_id.to_string() };
        match self.inventory.clone().get_stock(request).await {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::NotFound => Err(Error::UnknownProduct(product_id)),
            Err(status) => Err(Error::Downstream { downstream: "inventory", status }),
        }
    }
}

fn item(i: Item) -> pb::Item {
    pb::Item {
        id: i.id.to_string(),
        product_id: i.product_id.to_string(),
        name: i.name,
        status: i.status,
        created_at: Some(sagaworks_proto::timestamp(i.created_at)),
    }
}

#[tonic::async_trait]
impl {{Name}}Service for Items {
    #[tracing::instrument(skip_all, fields(product_id = %request.get_ref().product_id))]
    async fn create_item(
        &self,
        request: Request<pb::CreateItemRequest>,
    ) -> Result<Response<pb::Item>, Status> {
        let r = request.into_inner();
        let new = NewItem {
            id: uuid_or_new("id", &r.id)?,
            product_id: uuid("product_id", &r.product_id)?,
            name: text("name", &r.name, 200)?,
        };
        // Asked before the transaction: no connection is held while waiting on the network.
        self.check_product(new.product_id).await?;
        let mut tx = self.pool.begin().await.map_err(Error::from)?;
        let created = items::create(&mut tx, &self.outbox, &self.saga, new).await?;
        tx.commit().await.map_err(Error::from)?;
        // Answers when the claim has ended, or after `saga.max_wait_ms` with the item PENDING.
        let wait = Duration::from_millis(self.saga.settings().max_wait_ms);
        created.saga.run(wait, &self.shutdown).await;
        let mut conn = self.pool.acquire().await.map_err(Error::from)?;
        Ok(Response::new(item(items::get(&mut conn, created.item.id).await?)))
    }
}
