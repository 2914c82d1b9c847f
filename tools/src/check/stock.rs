//! Per product: available + reserved + sold = initial stock, the counters
//! agree with the reservation lines, and nothing stays reserved at rest. Per
//! order: its reservation agrees with its outcome (a CONFIRMED order's is
//! COMMITTED, a CANCELLED order's RELEASED or never made), and no
//! reservation belongs to an unknown order.

use super::{Verdict, first, settled, uuids};
use crate::pg::Databases;
use crate::{FixtureProduct, ToolError};
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

/// The product counters and the reservation lines' sums.
#[derive(Debug, Clone, Copy)]
struct Product {
    available: i64,
    reserved: i64,
    sold: i64,
    /// Units in RESERVED / COMMITTED reservations' lines.
    held: i64,
    committed: i64,
}

/// One reservation: its order, status and number of lines.
struct Reservation {
    id: Uuid,
    order_id: Uuid,
    status: String,
    lines: i64,
}

/// `products` are the fixture's, with the stock they were created with;
/// `customers`' orders are the ones whose reservations are checked (with
/// every order some reservation names). Waits up to `settle` for the state
/// to come to rest (inventory commits a confirmed order's reservation when it
/// consumes `OrderConfirmed`).
pub async fn conserved(
    dbs: &Databases,
    products: &[FixtureProduct],
    customers: &[Uuid],
    settle: Duration,
) -> Result<Verdict, ToolError> {
    settled(settle, || check(dbs, products, customers)).await
}

async fn check(
    dbs: &Databases,
    products: &[FixtureProduct],
    customers: &[Uuid],
) -> Result<Verdict, ToolError> {
    let ids = uuids("fixture product", products.iter().map(|p| p.id.as_str()))?;
    let rows: Vec<(Uuid, i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT p.id, p.available, p.reserved, p.sold,
                COALESCE(sum(l.quantity) FILTER (WHERE r.status = 'RESERVED'), 0)::BIGINT,
                COALESCE(sum(l.quantity) FILTER (WHERE r.status = 'COMMITTED'), 0)::BIGINT
           FROM products p
           LEFT JOIN reservation_lines l ON l.product_id = p.id
           LEFT JOIN reservations r ON r.id = l.reservation_id
          WHERE p.id = ANY($1)
          GROUP BY p.id",
    )
    .bind(&ids)
    .fetch_all(&dbs.inventory)
    .await?;
    let found: HashMap<Uuid, Product> = rows
        .into_iter()
        .map(|(id, available, reserved, sold, held, committed)| {
            (id, Product { available, reserved, sold, held, committed })
        })
        .collect();
    let mut offenders = Vec::new();
    let (mut reserved_total, mut sold_total) = (0, 0);
    for (id, p) in ids.iter().zip(products) {
        let Some(&Product { available, reserved, sold, held, committed }) = found.get(id) else {
            offenders.push(format!("{id} missing"));
            continue;
        };
        reserved_total += reserved;
        sold_total += sold;
        if available + reserved + sold != p.initial_stock {
            offenders.push(format!(
                "{id}: available {available} + reserved {reserved} + sold {sold} != initial {}",
                p.initial_stock
            ));
        }
        if reserved != held || sold != committed {
            offenders.push(format!(
                "{id}: reserved {reserved} / sold {sold} but reservation lines say {held} / {committed}"
            ));
        }
        if reserved != 0 {
            offenders.push(format!("{id}: {reserved} units still reserved at rest"));
        }
    }

    let reservations: Vec<Reservation> = sqlx::query_as::<_, (Uuid, Uuid, String, i64)>(
        "SELECT r.id, r.order_id, r.status, (SELECT count(*) FROM reservation_lines l WHERE l.reservation_id = r.id)
           FROM reservations r",
    )
    .fetch_all(&dbs.inventory)
    .await?
    .into_iter()
    .map(|(id, order_id, status, lines)| Reservation { id, order_id, status, lines })
    .collect();
    let named: Vec<Uuid> = reservations.iter().map(|r| r.order_id).collect();
    let orders: HashMap<Uuid, String> = sqlx::query_as::<_, (Uuid, String)>(
        "SELECT id, status FROM orders WHERE customer_id = ANY($1) OR id = ANY($2)",
    )
    .bind(customers)
    .bind(&named)
    .fetch_all(&dbs.order)
    .await?
    .into_iter()
    .collect();
    let mut by_order: HashMap<Uuid, Vec<&Reservation>> = HashMap::new();
    for r in &reservations {
        by_order.entry(r.order_id).or_default().push(r);
    }
    let (mut committed, mut released) = (0, 0);
    for r in &reservations {
        match r.status.as_str() {
            "COMMITTED" => committed += 1,
            "RELEASED" => released += 1,
            _ => {}
        }
        if !orders.contains_key(&r.order_id) {
            offenders.push(format!("reservation {} ({}) of unknown order {}", r.id, r.status, r.order_id));
        }
        if r.status != "RELEASED" && r.lines == 0 {
            offenders.push(format!("reservation {} {} without lines", r.id, r.status));
        }
    }
    let mut disagreeing: Vec<String> = Vec::new();
    for (order_id, status) in &orders {
        let held = by_order.get(order_id).map(Vec::as_slice).unwrap_or_default();
        let states: Vec<String> = held.iter().map(|r| format!("{} {}", r.id, r.status)).collect();
        let ok = match status.as_str() {
            "CONFIRMED" => held.len() == 1 && held[0].status == "COMMITTED",
            "CANCELLED" => held.len() <= 1 && held.iter().all(|r| r.status == "RELEASED"),
            // Not at rest: the orders check reports it.
            _ => true,
        };
        if !ok {
            let states = if states.is_empty() { "none".to_string() } else { states.join(", ") };
            disagreeing.push(format!("order {order_id} {status} but its reservations: {states}"));
        }
    }
    disagreeing.sort();
    offenders.extend(disagreeing);

    let mut detail = format!(
        "{} products, {reserved_total} units reserved, {sold_total} sold; {} reservations \
         ({committed} COMMITTED, {released} RELEASED) of {} orders",
        products.len(),
        reservations.len(),
        orders.len()
    );
    if !offenders.is_empty() {
        detail.push_str(&format!(": {}", first(&offenders)));
    }
    Ok(Verdict { name: "stock conserved", ok: offenders.is_empty(), detail })
}
