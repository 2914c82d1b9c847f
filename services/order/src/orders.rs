//! Orders, their items and their saga's record, in order's own database.

use crate::error::{Error, Result};
use crate::saga::Step;
use chrono::{DateTime, Utc};
use sagaworks_outbox::{NewEvent, OutboxWriter};
use serde::Serialize;
use sqlx::{FromRow, PgConnection};
use std::collections::BTreeMap;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct Item {
    pub product_id: Uuid,
    pub quantity: i64,
    pub unit_price_cents: i64,
}

#[derive(Debug, Clone, FromRow)]
pub struct Order {
    pub id: Uuid,
    pub customer_id: Uuid,
    pub status: String,
    pub total_cents: i64,
    pub failure_reason: Option<String>,
    pub trace_id: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[sqlx(skip)]
    pub items: Vec<Item>,
}

#[derive(Debug, Clone, FromRow)]
pub struct SagaStepRecord {
    pub name: String,
    pub status: String,
    pub attempts: i32,
    pub error: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, FromRow)]
pub struct SagaRecord {
    pub id: Uuid,
    pub order_id: Uuid,
    pub status: String,
    pub current_step: String,
    pub failure_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[sqlx(skip)]
    pub steps: Vec<SagaStepRecord>,
}

#[derive(Debug, Clone, FromRow)]
pub struct TimelineEntry {
    pub event_id: Uuid,
    pub event_type: String,
    pub source: String,
    pub occurred_at: DateTime<Utc>,
}

/// What a client asked for, validated (duplicate products summed).
pub struct NewOrder {
    pub customer_id: Uuid,
    pub items: BTreeMap<Uuid, i64>,
    pub idempotency_key: String,
    pub request_hash: Vec<u8>,
}

/// The outcome of [`create`]: a new order, or the one its key already made.
pub enum Created {
    New { order_id: Uuid, saga_id: Uuid },
    Replayed { order_id: Uuid },
}

const ORDER_COLUMNS: &str = "id, customer_id, status, total_cents, failure_reason, trace_id, created_at, updated_at";

/// Inserts the PENDING order, its items and its RUNNING saga (leased to
/// `owner`), and records `OrderCreated`, all in the caller's transaction.
#[tracing::instrument(name = "db.create", skip_all, fields(
    otel.name = "create orders", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "create", db.collection.name = "orders"))]
pub async fn create(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    new: &NewOrder,
    owner: &str,
    lease_ms: u64,
) -> Result<Created> {
    let order_id = Uuid::now_v7();
    let trace_id = sagaworks_telemetry::propagation::current_trace_id();
    let inserted = sqlx::query(
        "INSERT INTO orders (id, customer_id, status, idempotency_key, request_hash, trace_id)
         VALUES ($1, $2, 'PENDING', $3, $4, $5) ON CONFLICT (customer_id, idempotency_key) DO NOTHING",
    )
    .bind(order_id)
    .bind(new.customer_id)
    .bind(&new.idempotency_key)
    .bind(&new.request_hash)
    .bind(&trace_id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 0 {
        let (id, hash) = sqlx::query_as::<_, (Uuid, Vec<u8>)>(
            "SELECT id, request_hash FROM orders WHERE customer_id = $1 AND idempotency_key = $2",
        )
        .bind(new.customer_id)
        .bind(&new.idempotency_key)
        .fetch_one(&mut *conn)
        .await?;
        return if hash == new.request_hash { Ok(Created::Replayed { order_id: id }) } else { Err(Error::KeyReused) };
    }
    let products: Vec<Uuid> = new.items.keys().copied().collect();
    let quantities: Vec<i64> = new.items.values().copied().collect();
    sqlx::query(
        "INSERT INTO order_items (order_id, product_id, quantity) SELECT $1, * FROM UNNEST($2::uuid[], $3::bigint[])",
    )
    .bind(order_id)
    .bind(&products)
    .bind(&quantities)
    .execute(&mut *conn)
    .await?;
    let saga_id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO sagas (id, order_id, status, current_step, lease_owner, lease_expires_at)
         VALUES ($1, $2, 'RUNNING', $3, $4, now() + make_interval(secs => $5))",
    )
    .bind(saga_id)
    .bind(order_id)
    .bind(Step::ReserveStock.as_str())
    .bind(owner)
    .bind(lease_ms as f64 / 1000.0)
    .execute(&mut *conn)
    .await?;
    let items: Vec<_> = new.items.iter().map(|(p, q)| serde_json::json!({"product_id": p, "quantity": q})).collect();
    let event = serde_json::json!({
        "order_id": order_id, "customer_id": new.customer_id, "items": items, "saga_id": saga_id,
    });
    outbox.write(conn, NewEvent::new("order", order_id, "OrderCreated", event)?).await?;
    Ok(Created::New { order_id, saga_id })
}

pub async fn get(conn: &mut PgConnection, id: Uuid) -> Result<Order> {
    let mut order = sqlx::query_as::<_, Order>(&format!("SELECT {ORDER_COLUMNS} FROM orders WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or(Error::OrderNotFound(id))?;
    order.items = items(conn, id).await?;
    Ok(order)
}

pub async fn items(conn: &mut PgConnection, order_id: Uuid) -> Result<Vec<Item>> {
    Ok(sqlx::query_as::<_, Item>(
        "SELECT product_id, quantity, unit_price_cents FROM order_items WHERE order_id = $1 ORDER BY product_id",
    )
    .bind(order_id)
    .fetch_all(conn)
    .await?)
}

pub async fn list(conn: &mut PgConnection, customer_id: Uuid, limit: i64) -> Result<Vec<Order>> {
    let mut orders = sqlx::query_as::<_, Order>(&format!(
        "SELECT {ORDER_COLUMNS} FROM orders WHERE customer_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2"
    ))
    .bind(customer_id)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    for o in &mut orders {
        o.items = items(conn, o.id).await?;
    }
    Ok(orders)
}

const SAGA_COLUMNS: &str = "id, order_id, status, current_step, failure_reason, created_at, updated_at";

async fn saga_where(conn: &mut PgConnection, column: &str, id: Uuid) -> Result<Option<SagaRecord>> {
    let Some(mut saga) =
        sqlx::query_as::<_, SagaRecord>(&format!("SELECT {SAGA_COLUMNS} FROM sagas WHERE {column} = $1"))
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?
    else {
        return Ok(None);
    };
    saga.steps = sqlx::query_as::<_, SagaStepRecord>(
        "SELECT name, status, attempts, error, started_at, finished_at FROM saga_steps
         WHERE saga_id = $1 ORDER BY started_at, name",
    )
    .bind(saga.id)
    .fetch_all(conn)
    .await?;
    Ok(Some(saga))
}

pub async fn saga(conn: &mut PgConnection, saga_id: Uuid) -> Result<SagaRecord> {
    saga_where(conn, "id", saga_id).await?.ok_or(Error::SagaNotFound(saga_id))
}

pub async fn saga_of_order(conn: &mut PgConnection, order_id: Uuid) -> Result<Option<SagaRecord>> {
    saga_where(conn, "order_id", order_id).await
}

pub async fn timeline(conn: &mut PgConnection, order_id: Uuid) -> Result<Vec<TimelineEntry>> {
    Ok(sqlx::query_as::<_, TimelineEntry>(
        "SELECT event_id, event_type, source, occurred_at FROM order_timeline
         WHERE order_id = $1 ORDER BY occurred_at, event_id",
    )
    .bind(order_id)
    .fetch_all(conn)
    .await?)
}
