//! The gRPC face of inventory: validates requests, runs them on the
//! database, maps domain values to the protobuf contract.

use crate::error::Error;
type Result<T, E = Error> = std::result::Result<T, E>;
use crate::stock::{self, NewProduct, Product, Reservation, ReservationStatus};
use sagaworks_errors::validate::{self, text, uuid, uuid_or_new};
use sagaworks_outbox::OutboxWriter;
use sagaworks_proto::inventory::v1 as pb;
use sagaworks_proto::inventory::v1::inventory_service_server::InventoryService;
use sagaworks_runtime::idempotency;
use sqlx::PgPool;
use tonic::{Request, Response, Status};

/// Largest quantity one request may move (keeps totals far from overflow).
const MAX_QUANTITY: i64 = 1_000_000;
const MAX_ITEMS: usize = 100;

#[derive(Clone)]
pub struct Inventory {
    pool: PgPool,
    outbox: OutboxWriter,
}

impl Inventory {
    pub fn new(pool: PgPool) -> Self {
        Self { pool, outbox: OutboxWriter::new("inventory") }
    }
}

fn quantity(field: &str, value: i64, allow_zero: bool) -> Result<i64> {
    Ok(validate::within(field, value, if allow_zero { 0 } else { 1 }..=MAX_QUANTITY)?)
}

fn product(p: Product) -> pb::Product {
    pb::Product {
        id: p.id.to_string(),
        sku: p.sku,
        name: p.name,
        price_cents: p.price_cents,
        available: p.available,
        reserved: p.reserved,
        sold: p.sold,
        created_at: Some(sagaworks_proto::timestamp(p.created_at)),
    }
}

pub(crate) fn reservation(r: Reservation) -> pb::Reservation {
    let status = match r.status {
        ReservationStatus::Reserved => pb::ReservationStatus::Reserved,
        ReservationStatus::Released => pb::ReservationStatus::Released,
        ReservationStatus::Committed => pb::ReservationStatus::Committed,
    };
    pb::Reservation {
        reservation_id: r.id.to_string(),
        order_id: r.order_id.to_string(),
        status: status as i32,
        lines: r
            .lines
            .into_iter()
            .map(|l| pb::ReservedLine {
                product_id: l.product_id.to_string(),
                quantity: l.quantity,
                unit_price_cents: l.unit_price_cents,
            })
            .collect(),
        total_cents: r.total_cents,
    }
}

#[tonic::async_trait]
impl InventoryService for Inventory {
    #[tracing::instrument(skip_all, fields(sku = %request.get_ref().sku))]
    async fn create_product(
        &self,
        request: Request<pb::CreateProductRequest>,
    ) -> Result<Response<pb::Product>, Status> {
        let r = request.into_inner();
        let new = NewProduct {
            id: uuid_or_new("id", &r.id)?,
            sku: text("sku", &r.sku, 64)?,
            name: text("name", &r.name, 200)?,
            price_cents: validate::within("price_cents", r.price_cents, 0..=100_000_000)?,
            initial_stock: quantity("initial_stock", r.initial_stock, true)?,
        };
        let outbox = self.outbox.clone();
        let res = idempotency::run_once(&self.pool, &r.idempotency_key, &r, move |conn| {
            Box::pin(async move { Ok::<_, Error>(product(stock::create_product(conn, &outbox, new).await?)) })
        })
        .await?;
        Ok(Response::new(res))
    }

    #[tracing::instrument(skip_all, fields(product_id = %request.get_ref().product_id))]
    async fn add_stock(
        &self,
        request: Request<pb::AddStockRequest>,
    ) -> Result<Response<pb::Product>, Status> {
        let r = request.into_inner();
        let id = uuid("product_id", &r.product_id)?;
        let q = quantity("quantity", r.quantity, false)?;
        let outbox = self.outbox.clone();
        let res = idempotency::run_once(&self.pool, &r.idempotency_key, &r, move |conn| {
            Box::pin(async move { Ok::<_, Error>(product(stock::add_stock(conn, &outbox, id, q).await?)) })
        })
        .await?;
        Ok(Response::new(res))
    }

    async fn get_stock(
        &self,
        request: Request<pb::GetStockRequest>,
    ) -> Result<Response<pb::Product>, Status> {
        let id = uuid("product_id", &request.get_ref().product_id)?;
        let mut conn = self.pool.acquire().await.map_err(Error::from)?;
        Ok(Response::new(product(stock::get_product(&mut conn, id).await?)))
    }

    async fn list_products(
        &self,
        request: Request<pb::ListProductsRequest>,
    ) -> Result<Response<pb::ListProductsResponse>, Status> {
        let limit = match request.get_ref().limit {
            0 => 100,
            n => n.min(1000),
        };
        let mut conn = self.pool.acquire().await.map_err(Error::from)?;
        let products = stock::list_products(&mut conn, limit as i64).await?;
        Ok(Response::new(pb::ListProductsResponse { products: products.into_iter().map(product).collect() }))
    }

    #[tracing::instrument(skip_all, fields(reservation_id = %request.get_ref().reservation_id))]
    async fn reserve_stock(
        &self,
        request: Request<pb::ReserveStockRequest>,
    ) -> Result<Response<pb::Reservation>, Status> {
        let r = request.into_inner();
        let reservation_id = uuid("reservation_id", &r.reservation_id)?;
        let order_id = uuid("order_id", &r.order_id)?;
        let wanted = validate::order_lines(
            r.items.iter().map(|i| (i.product_id.as_str(), i.quantity)),
            MAX_ITEMS,
            MAX_QUANTITY,
        )?;
        let outbox = self.outbox.clone();
        let res = idempotency::run_once(&self.pool, &r.idempotency_key, &r, move |conn| {
            Box::pin(async move {
                let res = stock::reserve(conn, &outbox, reservation_id, order_id, &wanted).await?;
                Ok::<_, Error>(reservation(res))
            })
        })
        .await?;
        Ok(Response::new(res))
    }

    #[tracing::instrument(skip_all, fields(reservation_id = %request.get_ref().reservation_id))]
    async fn release_reservation(
        &self,
        request: Request<pb::ReleaseReservationRequest>,
    ) -> Result<Response<pb::Reservation>, Status> {
        let r = request.into_inner();
        let reservation_id = uuid("reservation_id", &r.reservation_id)?;
        let order_id = uuid("order_id", &r.order_id)?;
        let reason = r.reason.chars().take(500).collect::<String>();
        let outbox = self.outbox.clone();
        let res = idempotency::run_once(&self.pool, &r.idempotency_key, &r, move |conn| {
            Box::pin(async move {
                let res = stock::release(conn, &outbox, reservation_id, order_id, &reason).await?;
                Ok::<_, Error>(reservation(res))
            })
        })
        .await?;
        Ok(Response::new(res))
    }
}
