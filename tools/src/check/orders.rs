//! Every order ends CONFIRMED or CANCELLED.

use super::{Verdict, first};
use crate::ToolError;
use sqlx::PgPool;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use uuid::Uuid;

async fn statuses(
    order_db: &PgPool,
    customers: &[Uuid],
    accepted: &[Uuid],
) -> Result<HashMap<Uuid, String>, ToolError> {
    let rows: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT id, status FROM orders WHERE customer_id = ANY($1) OR id = ANY($2)")
            .bind(customers)
            .bind(accepted)
            .fetch_all(order_db)
            .await?;
    Ok(rows.into_iter().collect())
}

/// Waits up to `settle` for the sagas to finish, then checks that every
/// order of `customers` is terminal and every `accepted` order exists.
pub async fn terminal(
    order_db: &PgPool,
    customers: &[Uuid],
    accepted: &[Uuid],
    settle: Duration,
) -> Result<Verdict, ToolError> {
    let deadline = Instant::now() + settle;
    loop {
        let orders = statuses(order_db, customers, accepted).await?;
        let open: Vec<String> =
            orders.iter().filter(|(_, s)| *s == "PENDING").map(|(id, s)| format!("{id} {s}")).collect();
        let missing: Vec<String> = accepted
            .iter()
            .filter(|id| !orders.contains_key(id))
            .map(|id| format!("{id} accepted but absent"))
            .collect();
        if (open.is_empty() && missing.is_empty()) || Instant::now() >= deadline {
            let count = |s: &str| orders.values().filter(|v| *v == s).count();
            let mut detail = format!(
                "{} orders ({} accepted by the API): {} CONFIRMED, {} CANCELLED, {} PENDING",
                orders.len(),
                accepted.len(),
                count("CONFIRMED"),
                count("CANCELLED"),
                open.len()
            );
            let offenders: Vec<String> = missing.into_iter().chain(open).collect();
            if !offenders.is_empty() {
                detail.push_str(&format!(" after {settle:?}: {}", first(&offenders)));
            }
            return Ok(Verdict { name: "orders terminal", ok: offenders.is_empty(), detail });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
