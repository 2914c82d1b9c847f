//! Orders, their items and their saga's record, in order's own database.

use crate::error::{Error, Result};
use crate::saga::{Line, OrderInput, PlaceOrder};
use chrono::{DateTime, Utc};
use sagaworks_events::{OrderCreated, OrderLine};
use sagaworks_outbox::OutboxWriter;
use sagaworks_saga::{Engine, InstanceRecord, Saga, Started, instance_json};
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, FromRow, PgConnection};
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
    /// The W3C `traceparent` of the call that places the order, kept with
    /// the order (the saga keeps the span that starts it, see
    /// [`Engine::start_with`]).
    pub traceparent: Option<String>,
}

/// The outcome of [`create`]: a new order with its saga (to run), or the one its key already made.
pub enum Created {
    New { order_id: Uuid, saga: Box<Started<PlaceOrder>> },
    Replayed { order_id: Uuid },
}

const ORDER_COLUMNS: &str =
    "id, customer_id, status, total_cents, failure_reason, trace_id, created_at, updated_at";

/// Inserts the PENDING order, its items, its saga instance (leased to this
/// replica, see [`Engine::start_with`]) and its `OrderCreated` event, in one
/// statement: outside a transaction it commits all of them or nothing.
#[tracing::instrument(name = "db.create", skip_all, fields(
    otel.name = "create orders", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "create", db.collection.name = "orders"))]
pub async fn create(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    engine: &Engine<PlaceOrder>,
    new: &NewOrder,
) -> Result<Created> {
    let order_id = Uuid::now_v7();
    let trace_id = sagaworks_telemetry::propagation::current_trace_id();
    let lines: Vec<Line> =
        new.items.iter().map(|(&product_id, &quantity)| Line { product_id, quantity }).collect();
    let items = lines.iter().map(|l| OrderLine { product_id: l.product_id, quantity: l.quantity }).collect();
    let input = OrderInput { order_id, customer_id: new.customer_id, items: lines };
    // One round trip: the order, its items, its saga and its event, or
    // nothing when the key was used before.
    let started = engine
        .start_with(&mut *conn, order_id.to_string(), input, |saga_id, w| {
            let event =
                outbox.stage(&OrderCreated { order_id, customer_id: new.customer_id, items, saga_id })?;
            let (id, customer, key) =
                (w.bind(order_id), w.bind(new.customer_id), w.bind(new.idempotency_key.clone()));
            let (hash, trace_id, traceparent) =
                (w.bind(new.request_hash.clone()), w.bind(trace_id), w.bind(new.traceparent.clone()));
            // The guard: the rest is written only when the order is new.
            let order = w.guard(
                "o",
                format!(
                    "INSERT INTO orders (id, customer_id, status, idempotency_key, request_hash, trace_id, traceparent)
                     VALUES ({id}, {customer}, 'PENDING', {key}, {hash}, {trace_id}, {traceparent})
                     ON CONFLICT (customer_id, idempotency_key) DO NOTHING
                     RETURNING id"
                ),
            );
            let products: Vec<Uuid> = new.items.keys().copied().collect();
            let quantities: Vec<i64> = new.items.values().copied().collect();
            let (products, quantities) = (w.bind(products), w.bind(quantities));
            w.guarded("items", |g| {
                g.insert("order_items (order_id, product_id, quantity)")
                    .select(format!("{g}.id, i.product_id, i.quantity"))
                    .from(format!("UNNEST({products}::uuid[], {quantities}::bigint[]) AS i (product_id, quantity)"))
            });
            w.event(event);
            Ok::<_, Error>(order)
        })
        .await?;
    let Some(started) = started else {
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
    Ok(Created::New { order_id, saga: Box::new(started) })
}

/// An order with its saga (and the saga's steps) and its event timeline.
pub struct OrderView {
    pub order: Order,
    pub saga: Option<InstanceRecord>,
    pub timeline: Vec<TimelineEntry>,
}

#[derive(FromRow)]
struct ViewRow {
    #[sqlx(flatten)]
    order: Order,
    item_list: Json<Vec<Item>>,
    saga: Option<Json<InstanceRecord>>,
    timeline: Json<Vec<TimelineEntry>>,
}

/// The whole view of one order, in one round trip.
pub async fn view(conn: &mut PgConnection, id: Uuid) -> Result<OrderView> {
    let row = sqlx::query_as::<_, ViewRow>(AssertSqlSafe(format!(
        "SELECT {ORDER_COLUMNS},
             (SELECT COALESCE(json_agg(i ORDER BY i.product_id), '[]')
              FROM (SELECT product_id, quantity, unit_price_cents FROM order_items WHERE order_id = o.id) i)
                 AS item_list,
             {saga} AS saga,
             (SELECT COALESCE(json_agg(t ORDER BY t.occurred_at, t.event_id), '[]')
              FROM (SELECT event_id, event_type, source, occurred_at FROM order_timeline WHERE order_id = o.id) t)
                 AS timeline
         FROM orders o WHERE o.id = $1",
        saga = instance_json::<PlaceOrder>("o.id::text"),
    )))
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
    let mut orders = sqlx::query_as::<_, Order>(AssertSqlSafe(format!(
        "SELECT {ORDER_COLUMNS} FROM orders WHERE customer_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2"
    )))
    .bind(customer_id)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    for o in &mut orders {
        o.items = items(conn, o.id).await?;
    }
    Ok(orders)
}

/// The ids of a customer's orders (newest first, at most 10 000), as saga keys.
pub async fn ids_of_customer(pool: &sqlx::PgPool, customer_id: Uuid) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT id::text FROM orders WHERE customer_id = $1 ORDER BY created_at DESC LIMIT 10000",
    )
    .bind(customer_id)
    .fetch_all(pool)
    .await?)
}

/// An order's saga by the saga's id.
pub async fn saga(conn: &mut PgConnection, saga_id: Uuid) -> Result<InstanceRecord> {
    match InstanceRecord::load(&mut *conn, saga_id).await? {
        Some(saga) if saga.saga_type == PlaceOrder::NAME => Ok(saga),
        _ => Err(Error::SagaNotFound(saga_id)),
    }
}
