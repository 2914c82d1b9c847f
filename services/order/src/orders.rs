//! Orders, their items and their saga's record, in order's own database.

use crate::error::{Error, Result};
use crate::saga::Step;
use chrono::{DateTime, Utc};
use sagaworks_outbox::{NewEvent, OutboxWriter, PendingEvent};
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use sqlx::{FromRow, PgConnection};
use std::collections::BTreeMap;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, FromRow)]
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

#[derive(Debug, Clone, Deserialize, FromRow)]
pub struct SagaStepRecord {
    pub name: String,
    pub status: String,
    pub attempts: i32,
    pub error: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Deserialize, FromRow)]
pub struct SagaRecord {
    pub id: Uuid,
    pub order_id: Uuid,
    pub status: String,
    pub current_step: String,
    pub failure_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[sqlx(skip)]
    #[serde(default)]
    pub steps: Vec<SagaStepRecord>,
}

#[derive(Debug, Clone, Deserialize, FromRow)]
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
    /// The W3C `traceparent` of the call that places the order (see [`create`]).
    pub traceparent: Option<String>,
}

/// The outcome of [`create`]: a new order, or the one its key already made.
pub enum Created {
    New { order_id: Uuid, saga_id: Uuid, created_at: DateTime<Utc> },
    Replayed { order_id: Uuid },
}

const ORDER_COLUMNS: &str =
    "id, customer_id, status, total_cents, failure_reason, trace_id, created_at, updated_at";

/// Inserts the PENDING order, its items, its RUNNING saga (leased to
/// `owner`) and its `OrderCreated` event, in one statement: outside a
/// transaction it commits all of them or nothing. With `first_attempt`
/// (the caller drives the saga right away) the statement also records the
/// first attempt of the saga's first step, which the driver would otherwise
/// record in a statement of its own; the step's clock starts with the order.
#[tracing::instrument(name = "db.create", skip_all, fields(
    otel.name = "create orders", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "create", db.collection.name = "orders"))]
pub async fn create(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    new: &NewOrder,
    owner: &str,
    lease_ms: u64,
    first_attempt: bool,
) -> Result<Created> {
    let order_id = Uuid::now_v7();
    let saga_id = Uuid::now_v7();
    let trace_id = sagaworks_telemetry::propagation::current_trace_id();
    let products: Vec<Uuid> = new.items.keys().copied().collect();
    let quantities: Vec<i64> = new.items.values().copied().collect();
    let items: Vec<_> =
        new.items.iter().map(|(p, q)| serde_json::json!({"product_id": p, "quantity": q})).collect();
    let payload = serde_json::json!({
        "order_id": order_id, "customer_id": new.customer_id, "items": items, "saga_id": saga_id,
    });
    let event = outbox.pending(NewEvent::new("order", order_id, "OrderCreated", payload)?)?;
    // One round trip: the order, its items, its saga and its event, or
    // nothing when the key was used before.
    let sql = format!(
        "WITH o AS (
             INSERT INTO orders (id, customer_id, status, idempotency_key, request_hash, trace_id, traceparent)
             VALUES ($1, $2, 'PENDING', $3, $4, $5, $12) ON CONFLICT (customer_id, idempotency_key) DO NOTHING
             RETURNING id),
         items AS (
             INSERT INTO order_items (order_id, product_id, quantity)
             SELECT o.id, i.product_id, i.quantity FROM o, UNNEST($6::uuid[], $7::bigint[]) AS i (product_id, quantity)),
         saga AS (
             INSERT INTO sagas (id, order_id, status, current_step, lease_owner, lease_expires_at)
             SELECT $8, o.id, 'RUNNING', $9, $10, now() + make_interval(secs => $11) FROM o
             RETURNING created_at),
         step AS (
             INSERT INTO saga_steps (saga_id, name, status, attempts)
             SELECT $8, $9, 'RUNNING', 1 FROM saga WHERE $13),
         {}
         SELECT created_at FROM saga",
        PendingEvent::cte("event", 14, Some("o")),
    );
    let query = sqlx::query_scalar(&sql)
        .bind(order_id)
        .bind(new.customer_id)
        .bind(&new.idempotency_key)
        .bind(&new.request_hash)
        .bind(&trace_id)
        .bind(&products)
        .bind(&quantities)
        .bind(saga_id)
        .bind(Step::ReserveStock.as_str())
        .bind(owner)
        .bind(lease_ms as f64 / 1000.0)
        .bind(&new.traceparent)
        .bind(first_attempt);
    let created: Option<DateTime<Utc>> = event.bind(query).fetch_optional(&mut *conn).await?;
    let Some(created_at) = created else {
        let (id, hash) = sqlx::query_as::<_, (Uuid, Vec<u8>)>(
            "SELECT id, request_hash FROM orders WHERE customer_id = $1 AND idempotency_key = $2",
        )
        .bind(new.customer_id)
        .bind(&new.idempotency_key)
        .fetch_one(&mut *conn)
        .await?;
        return if hash == new.request_hash {
            Ok(Created::Replayed { order_id: id })
        } else {
            Err(Error::KeyReused)
        };
    };
    Ok(Created::New { order_id, saga_id, created_at })
}

/// An order with its saga (and the saga's steps) and its event timeline.
pub struct OrderView {
    pub order: Order,
    pub saga: Option<SagaRecord>,
    pub timeline: Vec<TimelineEntry>,
}

#[derive(FromRow)]
struct ViewRow {
    #[sqlx(flatten)]
    order: Order,
    item_list: Json<Vec<Item>>,
    saga: Option<Json<SagaRecord>>,
    timeline: Json<Vec<TimelineEntry>>,
}

/// The whole view of one order, in one round trip.
pub async fn view(conn: &mut PgConnection, id: Uuid) -> Result<OrderView> {
    let row = sqlx::query_as::<_, ViewRow>(&format!(
        "SELECT {ORDER_COLUMNS},
             (SELECT COALESCE(json_agg(i ORDER BY i.product_id), '[]')
              FROM (SELECT product_id, quantity, unit_price_cents FROM order_items WHERE order_id = o.id) i)
                 AS item_list,
             (SELECT row_to_json(s) FROM (
                  SELECT {SAGA_COLUMNS},
                      (SELECT COALESCE(json_agg(st ORDER BY st.started_at, st.name), '[]')
                       FROM (SELECT name, status, attempts, error, started_at, finished_at
                             FROM saga_steps WHERE saga_id = sagas.id) st) AS steps
                  FROM sagas WHERE order_id = o.id) s) AS saga,
             (SELECT COALESCE(json_agg(t ORDER BY t.occurred_at, t.event_id), '[]')
              FROM (SELECT event_id, event_type, source, occurred_at FROM order_timeline WHERE order_id = o.id) t)
                 AS timeline
         FROM orders o WHERE o.id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?
    .ok_or(Error::OrderNotFound(id))?;
    let mut order = row.order;
    order.items = row.item_list.0;
    Ok(OrderView { order, saga: row.saga.map(|s| s.0), timeline: row.timeline.0 })
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

pub async fn saga(conn: &mut PgConnection, saga_id: Uuid) -> Result<SagaRecord> {
    let Some(mut saga) =
        sqlx::query_as::<_, SagaRecord>(&format!("SELECT {SAGA_COLUMNS} FROM sagas WHERE id = $1"))
            .bind(saga_id)
            .fetch_optional(&mut *conn)
            .await?
    else {
        return Err(Error::SagaNotFound(saga_id));
    };
    saga.steps = sqlx::query_as::<_, SagaStepRecord>(
        "SELECT name, status, attempts, error, started_at, finished_at FROM saga_steps
         WHERE saga_id = $1 ORDER BY started_at, name",
    )
    .bind(saga.id)
    .fetch_all(conn)
    .await?;
    Ok(saga)
}
