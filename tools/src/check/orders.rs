//! Every order ends CONFIRMED or CANCELLED, with its saga finished the same
//! way: COMPLETED for a confirmed order, COMPENSATED for a cancelled one.

use super::{Verdict, first, settled};
use crate::ToolError;
use sqlx::PgPool;
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

/// The order saga's type in `saga_instances` (its key is the order id).
pub const SAGA_TYPE: &str = "place_order";

/// One order with its saga's status and current step (`None`: no saga).
struct Row {
    status: String,
    saga: Option<(String, Option<String>)>,
}

async fn orders(
    order_db: &PgPool,
    customers: &[Uuid],
    accepted: &[Uuid],
) -> Result<HashMap<Uuid, Row>, ToolError> {
    let rows: Vec<(Uuid, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT o.id, o.status, s.status, s.current_step
           FROM orders o
           LEFT JOIN saga_instances s ON s.saga_type = $3 AND s.key = o.id::text
          WHERE o.customer_id = ANY($1) OR o.id = ANY($2)",
    )
    .bind(customers)
    .bind(accepted)
    .bind(SAGA_TYPE)
    .fetch_all(order_db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, status, saga, step)| (id, Row { status, saga: saga.map(|s| (s, step)) }))
        .collect())
}

/// What is wrong with one order, if anything.
fn offence(id: &Uuid, row: &Row) -> Option<String> {
    let Some((saga, step)) = &row.saga else {
        return Some(format!("{id} {} without a saga", row.status));
    };
    let step = step.as_deref().unwrap_or("-");
    match (row.status.as_str(), saga.as_str()) {
        ("CONFIRMED", "COMPLETED") | ("CANCELLED", "COMPENSATED") => None,
        ("PENDING", _) => Some(format!("{id} PENDING (saga {saga} at {step})")),
        (status, "RUNNING" | "COMPENSATING") => {
            Some(format!("{id} {status} but its saga is {saga} at {step}"))
        }
        (status, _) => Some(format!("{id} {status} but its saga ended {saga}")),
    }
}

/// Waits up to `settle` for the sagas to finish, then checks that every
/// order of `customers` is terminal, with its saga finished to match, and
/// every `accepted` order exists.
pub async fn terminal(
    order_db: &PgPool,
    customers: &[Uuid],
    accepted: &[Uuid],
    settle: Duration,
) -> Result<Verdict, ToolError> {
    settled(settle, || async {
        let orders = orders(order_db, customers, accepted).await?;
        let mut open: Vec<String> = orders.iter().filter_map(|(id, row)| offence(id, row)).collect();
        open.sort();
        let missing: Vec<String> = accepted
            .iter()
            .filter(|id| !orders.contains_key(id))
            .map(|id| format!("{id} accepted but absent"))
            .collect();
        let count = |s: &str| orders.values().filter(|row| row.status == s).count();
        let unfinished = orders
            .values()
            .filter(|row| row.saga.as_ref().is_some_and(|(s, _)| s == "RUNNING" || s == "COMPENSATING"))
            .count();
        let mut detail = format!(
            "{} orders ({} accepted by the API): {} CONFIRMED, {} CANCELLED, {} PENDING; {} sagas unfinished",
            orders.len(),
            accepted.len(),
            count("CONFIRMED"),
            count("CANCELLED"),
            count("PENDING"),
            unfinished
        );
        let offenders: Vec<String> = missing.into_iter().chain(open).collect();
        if !offenders.is_empty() {
            detail.push_str(&format!(" after {settle:?}: {}", first(&offenders)));
        }
        Ok(Verdict { name: "orders terminal", ok: offenders.is_empty(), detail })
    })
    .await
}
