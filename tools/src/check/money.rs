//! Per customer: charges - refunds = confirmed totals = initial credit -
//! balance. Per order: a confirmed order is charged exactly its total, a
//! cancelled one is not charged (or refunded).

use super::{Verdict, first, uuids};
use crate::{FixtureCustomer, ToolError};
use sqlx::PgPool;
use std::collections::HashMap;
use uuid::Uuid;

/// `customers` are the fixture's, with the credit they were opened with.
pub async fn balanced(
    order_db: &PgPool,
    payment_db: &PgPool,
    customers: &[FixtureCustomer],
) -> Result<Verdict, ToolError> {
    let ids = uuids("fixture customer", customers.iter().map(|c| c.id.as_str()))?;
    let orders: Vec<(Uuid, Uuid, String, i64)> = sqlx::query_as(
        "SELECT id, customer_id, status, total_cents FROM orders WHERE customer_id = ANY($1) AND status <> 'PENDING'",
    )
    .bind(&ids)
    .fetch_all(order_db)
    .await?;
    // Net charge per order: CHARGED counts, REFUNDED is charge - refund = 0, VOIDED never charged.
    let payments: Vec<(Uuid, Uuid, String, i64)> = sqlx::query_as(
        "SELECT order_id, customer_id, status, amount_cents FROM payments WHERE customer_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(payment_db)
    .await?;
    let balances: HashMap<Uuid, i64> = sqlx::query_as::<_, (Uuid, i64)>(
        "SELECT customer_id, balance_cents FROM accounts WHERE customer_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(payment_db)
    .await?
    .into_iter()
    .collect();

    let mut net_by_order: HashMap<Uuid, i64> = HashMap::new();
    let mut net_by_customer: HashMap<Uuid, i64> = HashMap::new();
    let (mut charges, mut refunds) = (0i64, 0i64);
    for (order_id, customer_id, status, amount) in &payments {
        let net = match status.as_str() {
            "CHARGED" => *amount,
            "REFUNDED" => 0,
            _ => continue,
        };
        charges += amount;
        if status == "REFUNDED" {
            refunds += amount;
        }
        *net_by_order.entry(*order_id).or_default() += net;
        *net_by_customer.entry(*customer_id).or_default() += net;
    }

    let mut offenders = Vec::new();
    let mut confirmed_by_customer: HashMap<Uuid, i64> = HashMap::new();
    for (order_id, customer_id, status, total) in &orders {
        let net = net_by_order.get(order_id).copied().unwrap_or(0);
        match status.as_str() {
            "CONFIRMED" => {
                *confirmed_by_customer.entry(*customer_id).or_default() += total;
                if net != *total {
                    offenders
                        .push(format!("order {order_id} CONFIRMED with total {total} but net charge {net}"));
                }
            }
            _ if net != 0 => offenders.push(format!("order {order_id} {status} but net charge {net}")),
            _ => {}
        }
    }
    for (id, c) in ids.iter().zip(customers) {
        let Some(balance) = balances.get(id) else {
            offenders.push(format!("customer {id} missing"));
            continue;
        };
        let net = net_by_customer.get(id).copied().unwrap_or(0);
        let confirmed = confirmed_by_customer.get(id).copied().unwrap_or(0);
        let spent = c.initial_credit_cents - balance;
        if net != confirmed || spent != net {
            offenders.push(format!(
                "customer {id}: charges - refunds {net}, confirmed totals {confirmed}, credit - balance {spent}"
            ));
        }
    }
    let mut detail = format!(
        "{} customers: charges {charges} - refunds {refunds} = {} cents; {} confirmed orders total {} cents",
        customers.len(),
        charges - refunds,
        orders.iter().filter(|o| o.2 == "CONFIRMED").count(),
        confirmed_by_customer.values().sum::<i64>()
    );
    if !offenders.is_empty() {
        detail.push_str(&format!(": {}", first(&offenders)));
    }
    Ok(Verdict { name: "money balanced", ok: offenders.is_empty(), detail })
}
