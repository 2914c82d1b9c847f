//! Per product: available + reserved + sold = initial stock, and the
//! counters agree with the reservation lines.

use super::{Verdict, first, uuids};
use crate::{FixtureProduct, ToolError};
use sqlx::PgPool;
use std::collections::HashMap;
use uuid::Uuid;

/// `products` are the fixture's, with the stock they were created with.
pub async fn conserved(inventory_db: &PgPool, products: &[FixtureProduct]) -> Result<Verdict, ToolError> {
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
    .fetch_all(inventory_db)
    .await?;
    let found: HashMap<Uuid, (i64, i64, i64, i64, i64)> =
        rows.into_iter().map(|(id, a, r, s, held, committed)| (id, (a, r, s, held, committed))).collect();
    let mut offenders = Vec::new();
    let (mut reserved_total, mut sold_total) = (0, 0);
    for (id, p) in ids.iter().zip(products) {
        let Some(&(available, reserved, sold, held, committed)) = found.get(id) else {
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
    }
    let mut detail =
        format!("{} products, {reserved_total} units reserved, {sold_total} sold", products.len());
    if !offenders.is_empty() {
        detail.push_str(&format!(": {}", first(&offenders)));
    }
    Ok(Verdict { name: "stock conserved", ok: offenders.is_empty(), detail })
}
