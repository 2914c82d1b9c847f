//! Products, stock levels and reservations in inventory's own database.
//!
//! Stock moves between three counters per product: `available` -> `reserved`
//! (reserve) -> `sold` (commit, when the order is confirmed), or back to
//! `available` (release, the saga's compensation). Every move is one guarded
//! `UPDATE` (`available >= $q`), so concurrent orders can never push stock
//! below zero, and rows are locked in product-id order so they cannot deadlock.

use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use sagaworks_events::{
    ProductCreated, ReservationLine, StockAdded, StockCommitted, StockReleased, StockReserved,
};
use sagaworks_outbox::{OutboxWriter, PendingEvents};
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, FromRow, PgConnection};
use std::collections::BTreeMap;
use uuid::Uuid;

#[derive(Debug, Clone, FromRow)]
pub struct Product {
    pub id: Uuid,
    pub sku: String,
    pub name: String,
    pub price_cents: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationStatus {
    Reserved,
    Released,
    Committed,
}

impl ReservationStatus {
    fn parse(s: &str) -> Self {
        match s {
            "RESERVED" => Self::Reserved,
            "COMMITTED" => Self::Committed,
            _ => Self::Released,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, FromRow)]
pub struct Line {
    pub product_id: Uuid,
    pub quantity: i64,
    pub unit_price_cents: i64,
}

#[derive(Debug, Clone)]
pub struct Reservation {
    pub id: Uuid,
    pub order_id: Uuid,
    pub status: ReservationStatus,
    pub lines: Vec<Line>,
    pub total_cents: i64,
}

pub struct NewProduct {
    pub id: Uuid,
    pub sku: String,
    pub name: String,
    pub price_cents: i64,
    pub initial_stock: i64,
}

const PRODUCT_COLUMNS: &str = "id, sku, name, price_cents, available, reserved, sold, created_at";

/// A reservation's lines as its events carry them.
fn event_lines(lines: &[Line]) -> Vec<ReservationLine> {
    lines
        .iter()
        .map(|l| ReservationLine {
            product_id: l.product_id,
            quantity: l.quantity,
            unit_price_cents: l.unit_price_cents,
        })
        .collect()
}

#[tracing::instrument(name = "db.create", skip_all, fields(
    otel.name = "create products", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "create", db.collection.name = "products"))]
pub async fn create_product(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    p: NewProduct,
) -> Result<Product> {
    let product = sqlx::query_as::<_, Product>(AssertSqlSafe(format!(
        "INSERT INTO products (id, sku, name, price_cents, available) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT DO NOTHING RETURNING {PRODUCT_COLUMNS}"
    )))
    .bind(p.id)
    .bind(&p.sku)
    .bind(&p.name)
    .bind(p.price_cents)
    .bind(p.initial_stock)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| Error::DuplicateSku(p.sku.clone()))?;
    let event = ProductCreated {
        product_id: product.id,
        sku: product.sku.clone(),
        name: product.name.clone(),
        price_cents: product.price_cents,
        initial_stock: product.available,
    };
    outbox.append(conn, &event).await?;
    Ok(product)
}

#[tracing::instrument(name = "db.add_stock", skip_all, fields(
    otel.name = "add_stock products", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "add_stock", db.collection.name = "products"))]
pub async fn add_stock(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    id: Uuid,
    quantity: i64,
) -> Result<Product> {
    let product = sqlx::query_as::<_, Product>(AssertSqlSafe(format!(
        "UPDATE products SET available = available + $2, updated_at = now() WHERE id = $1 RETURNING {PRODUCT_COLUMNS}"
    )))
    .bind(id)
    .bind(quantity)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(Error::ProductNotFound(id))?;
    outbox.append(conn, &StockAdded { product_id: id, quantity, available: product.available }).await?;
    Ok(product)
}

pub async fn get_product(conn: &mut PgConnection, id: Uuid) -> Result<Product> {
    sqlx::query_as::<_, Product>(AssertSqlSafe(format!(
        "SELECT {PRODUCT_COLUMNS} FROM products WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(conn)
    .await?
    .ok_or(Error::ProductNotFound(id))
}

pub async fn list_products(conn: &mut PgConnection, limit: i64) -> Result<Vec<Product>> {
    Ok(sqlx::query_as::<_, Product>(AssertSqlSafe(format!(
        "SELECT {PRODUCT_COLUMNS} FROM products ORDER BY sku LIMIT $1"
    )))
    .bind(limit)
    .fetch_all(conn)
    .await?)
}

/// Loads reservation `id` and locks its row (`FOR UPDATE`: after waiting for
/// another transaction's lock, the row as that one left it). This serialises
/// every operation on an existing reservation (a repeated reserve, release,
/// commit); creating one is serialised by the primary key (see [`reserve`]).
async fn lock_reservation(conn: &mut PgConnection, id: Uuid) -> Result<Option<Reservation>> {
    Ok(lock_reservations(conn, &[id]).await?.pop())
}

/// [`lock_reservation`] for several (those that exist), locked in id order
/// like products are, so two transactions locking overlapping sets cannot
/// deadlock.
async fn lock_reservations(conn: &mut PgConnection, ids: &[Uuid]) -> Result<Vec<Reservation>> {
    // The reservations and their lines (in product order, the lock order), in one round trip.
    type Row = (Uuid, Uuid, String, i64, Json<Vec<Line>>);
    let rows = sqlx::query_as::<_, Row>(
        "SELECT id, order_id, status, total_cents,
                (SELECT COALESCE(json_agg(l ORDER BY l.product_id), '[]')
                 FROM (SELECT product_id, quantity, unit_price_cents FROM reservation_lines
                       WHERE reservation_id = r.id) l)
         FROM reservations r WHERE id = ANY($1)
         ORDER BY id
         FOR UPDATE",
    )
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, order_id, status, total_cents, lines)| Reservation {
            id,
            order_id,
            status: ReservationStatus::parse(&status),
            lines: lines.0,
            total_cents,
        })
        .collect())
}

/// Reserves every item or none. `items` maps product id to quantity (duplicates
/// already summed); iteration order is the lock order.
#[tracing::instrument(name = "db.reserve", skip_all, fields(
    otel.name = "reserve reservations", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "reserve", db.collection.name = "reservations"))]
pub async fn reserve(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    reservation_id: Uuid,
    order_id: Uuid,
    items: &BTreeMap<Uuid, i64>,
) -> Result<Reservation> {
    let products: Vec<Uuid> = items.keys().copied().collect();
    let quantities: Vec<i64> = items.values().copied().collect();
    // One round trip for a new reservation: insert it first (`ON CONFLICT DO
    // NOTHING` waits for a concurrent insert of the same id, so the primary
    // key serialises it with a duplicate or a release), only when every
    // product exists and the total fits a BIGINT; then lock the products in id
    // order, move every line's units that are available, and record the lines.
    // Fewer lines moved than asked is a rejection, and the caller's transaction
    // is rolled back, reservation included. Prices never change once a product
    // exists, so the total taken before the locks is the locked rows' total.
    let (moved, total): (Json<Vec<Line>>, Option<i64>) = sqlx::query_as(
        "WITH reservation AS (
             INSERT INTO reservations (id, order_id, status, total_cents)
             SELECT $3, $4, 'RESERVED', sum(i.quantity::numeric * p.price_cents)::bigint
             FROM UNNEST($1::uuid[], $2::bigint[]) AS i (product_id, quantity)
                  JOIN products p ON p.id = i.product_id
             HAVING count(*) = cardinality($1) AND sum(i.quantity::numeric * p.price_cents) <= $5
             ON CONFLICT (id) DO NOTHING
             RETURNING id, total_cents),
         locked AS MATERIALIZED (
             SELECT id FROM products WHERE id = ANY($1) AND EXISTS (SELECT 1 FROM reservation)
             ORDER BY id FOR UPDATE),
         moved AS (
             UPDATE products p SET available = p.available - i.quantity, reserved = p.reserved + i.quantity,
                                   updated_at = now()
             FROM locked, UNNEST($1::uuid[], $2::bigint[]) AS i (product_id, quantity)
             WHERE p.id = locked.id AND p.id = i.product_id AND p.available >= i.quantity
             RETURNING p.id AS product_id, i.quantity, p.price_cents AS unit_price_cents),
         line_rows AS (
             INSERT INTO reservation_lines (reservation_id, product_id, quantity, unit_price_cents)
             SELECT reservation.id, moved.* FROM reservation, moved)
         SELECT (SELECT COALESCE(json_agg(m ORDER BY m.product_id), '[]') FROM moved m),
                (SELECT total_cents FROM reservation)",
    )
    .bind(&products)
    .bind(&quantities)
    .bind(reservation_id)
    .bind(order_id)
    .bind(i64::MAX)
    .fetch_one(&mut *conn)
    .await?;
    let lines = moved.0;
    let Some(total) = total else {
        // Not inserted: it exists already, or a product is unknown, or the total overflows.
        return match lock_reservation(conn, reservation_id).await? {
            Some(existing) if existing.status == ReservationStatus::Released => {
                Err(Error::AlreadyReleased(reservation_id))
            }
            Some(existing) => Ok(existing),
            None => Err(not_reservable(conn, items).await),
        };
    };
    if lines.len() < items.len() {
        return Err(reserve_refused(conn, items, &lines).await);
    }
    let event = StockReserved { reservation_id, order_id, lines: event_lines(&lines), total_cents: total };
    outbox.append(conn, &event).await?;
    Ok(Reservation {
        id: reservation_id,
        order_id,
        status: ReservationStatus::Reserved,
        lines,
        total_cents: total,
    })
}

/// Why a reservation moved fewer lines than asked: the first such product,
/// in lock order, is short.
async fn reserve_refused(conn: &mut PgConnection, items: &BTreeMap<Uuid, i64>, moved: &[Line]) -> Error {
    let Some((&product_id, &requested)) =
        items.iter().find(|(p, _)| !moved.iter().any(|l| l.product_id == **p))
    else {
        return Error::invalid("items", "order total overflows");
    };
    let available = sqlx::query_scalar::<_, i64>("SELECT available FROM products WHERE id = $1")
        .bind(product_id)
        .fetch_optional(&mut *conn)
        .await;
    match available {
        Ok(Some(available)) => Error::InsufficientStock { product_id, requested, available },
        Ok(None) => Error::ProductNotFound(product_id),
        Err(e) => e.into(),
    }
}

/// Why a new reservation was not even inserted: the first unknown product
/// (in id order), or else a total that overflows.
async fn not_reservable(conn: &mut PgConnection, items: &BTreeMap<Uuid, i64>) -> Error {
    let products: Vec<Uuid> = items.keys().copied().collect();
    let known = sqlx::query_scalar::<_, Uuid>("SELECT id FROM products WHERE id = ANY($1)")
        .bind(&products)
        .fetch_all(&mut *conn)
        .await;
    match known {
        Ok(known) => match products.into_iter().find(|p| !known.contains(p)) {
            Some(product_id) => Error::ProductNotFound(product_id),
            None => Error::invalid("items", "order total overflows"),
        },
        Err(e) => e.into(),
    }
}

/// Gives reserved units back. Releasing an unknown reservation leaves a
/// tombstone, so a reserve that arrives late (after its saga gave up) is refused.
#[tracing::instrument(name = "db.release", skip_all, fields(
    otel.name = "release reservations", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "release", db.collection.name = "reservations"))]
pub async fn release(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    reservation_id: Uuid,
    order_id: Uuid,
    reason: &str,
) -> Result<Reservation> {
    let mut r = match lock_reservation(conn, reservation_id).await? {
        Some(r) => r,
        None => {
            // A reserve may be inserting this id right now: the insert waits for
            // it, and if it committed, this releases that reservation.
            let tombstone = sqlx::query(
                "INSERT INTO reservations (id, order_id, status) VALUES ($1, $2, 'RELEASED')
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(reservation_id)
            .bind(order_id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if tombstone == 1 {
                return Ok(Reservation {
                    id: reservation_id,
                    order_id,
                    status: ReservationStatus::Released,
                    lines: vec![],
                    total_cents: 0,
                });
            }
            // It conflicted, so it exists (reservations are never deleted).
            lock_reservation(conn, reservation_id).await?.ok_or(sqlx::Error::RowNotFound)?
        }
    };
    match r.status {
        ReservationStatus::Released => return Ok(r),
        ReservationStatus::Committed => return Err(Error::AlreadyCommitted(reservation_id)),
        ReservationStatus::Reserved => {}
    }
    let event = outbox.stage(&StockReleased {
        reservation_id,
        order_id: r.order_id,
        lines: event_lines(&r.lines),
        reason: reason.to_string(),
    })?;
    let back = "available = p.available + i.quantity, reserved = p.reserved - i.quantity";
    settle(conn, std::slice::from_ref(&r), back, "RELEASED", PendingEvents::from_iter([event])).await?;
    r.status = ReservationStatus::Released;
    Ok(r)
}

/// Turns a reservation of `order_id` into a sale (on `OrderConfirmed`). Idempotent; a
/// reservation that is unknown, released or another order's is left alone and reported.
pub async fn commit(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    reservation_id: Uuid,
    order_id: Uuid,
) -> Result<Reservation> {
    let request = ToCommit { reservation_id, order_id, span: tracing::Span::current() };
    let mut committed = commit_all(conn, outbox, std::slice::from_ref(&request)).await?;
    committed.pop().ok_or(Error::ReservationNotFound(reservation_id))
}

/// One reservation for [`commit_all`].
#[derive(Debug, Clone)]
pub struct ToCommit {
    pub reservation_id: Uuid,
    /// The confirmed order it must belong to: an event naming another order's
    /// reservation commits nothing.
    pub order_id: Uuid,
    /// The span of the request (a consumer's `process` span): the
    /// reservation's `StockCommitted` event continues its trace.
    pub span: tracing::Span,
}

/// [`commit`] for several reservations at once: two statements whatever
/// their number (lock them, then move every line's units and record every
/// event). All or nothing: one unknown or released reservation is reported
/// and nothing is committed (the caller rolls back). Returns the
/// reservations in id order.
///
/// Its database span is a child of the current span (make it the first
/// request's) and is linked to the other requests' spans.
#[tracing::instrument(name = "db.commit", skip_all, fields(
    otel.name = "commit reservations", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "commit", db.collection.name = "reservations",
    db.operation.batch.size = requests.len()))]
pub async fn commit_all(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    requests: &[ToCommit],
) -> Result<Vec<Reservation>> {
    for other in requests.iter().skip(1) {
        tracing::Span::current().follows_from(&other.span);
    }
    let spans: BTreeMap<Uuid, &tracing::Span> =
        requests.iter().map(|r| (r.reservation_id, &r.span)).collect();
    let ids: Vec<Uuid> = spans.keys().copied().collect();
    let mut found = lock_reservations(conn, &ids).await?;
    if let Some(missing) = ids.iter().find(|id| !found.iter().any(|r| r.id == **id)) {
        return Err(Error::ReservationNotFound(*missing));
    }
    if let Some((r, named)) = found.iter().find_map(|r| {
        let named = requests.iter().find(|q| q.reservation_id == r.id && q.order_id != r.order_id)?;
        Some((r, named.order_id))
    }) {
        return Err(Error::OtherOrder { reservation_id: r.id, order_id: named });
    }
    if let Some(released) = found.iter().find(|r| r.status == ReservationStatus::Released) {
        return Err(Error::AlreadyReleased(released.id));
    }
    let open: Vec<Reservation> =
        found.iter().filter(|r| r.status == ReservationStatus::Reserved).cloned().collect();
    if open.is_empty() {
        return Ok(found);
    }
    let mut events = PendingEvents::new();
    for r in &open {
        let event = StockCommitted {
            reservation_id: r.id,
            order_id: r.order_id,
            lines: event_lines(&r.lines),
            total_cents: r.total_cents,
        };
        // The event continues the trace of the request that asked for it.
        events.push(spans[&r.id].in_scope(|| outbox.stage(&event))?);
    }
    settle(
        conn,
        &open,
        "sold = p.sold + i.quantity, reserved = p.reserved - i.quantity",
        "COMMITTED",
        events,
    )
    .await?;
    for r in &mut found {
        r.status = ReservationStatus::Committed;
    }
    Ok(found)
}

/// Moves every line's units of `reservations` between two counters
/// (`assignment`, with the quantity as `i.quantity`), sets their status and
/// records `events`, in one round trip; the products are locked in id order,
/// like reserve does (one product's lines in several reservations are summed:
/// an `UPDATE` changes a row once).
async fn settle(
    conn: &mut PgConnection,
    reservations: &[Reservation],
    assignment: &str,
    status: &str,
    events: PendingEvents,
) -> Result<()> {
    let ids: Vec<Uuid> = reservations.iter().map(|r| r.id).collect();
    let mut per_product: BTreeMap<Uuid, i64> = BTreeMap::new();
    for line in reservations.iter().flat_map(|r| &r.lines) {
        *per_product.entry(line.product_id).or_default() += line.quantity;
    }
    let products: Vec<Uuid> = per_product.keys().copied().collect();
    let quantities: Vec<i64> = per_product.values().copied().collect();
    let sql = format!(
        "WITH locked AS MATERIALIZED (
             SELECT id FROM products WHERE id = ANY($2) ORDER BY id FOR UPDATE),
         moved AS (
             UPDATE products p SET {assignment}, updated_at = now()
             FROM locked, UNNEST($2::uuid[], $3::bigint[]) AS i (product_id, quantity)
             WHERE p.id = locked.id AND p.id = i.product_id),
         {}
         UPDATE reservations SET status = $4, updated_at = now() WHERE id = ANY($1)",
        PendingEvents::cte("event", 5),
    );
    let query = sqlx::query(AssertSqlSafe(sql)).bind(ids).bind(products).bind(quantities).bind(status);
    events.bind(query).execute(conn).await?;
    Ok(())
}
