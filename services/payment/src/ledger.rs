//! Accounts and payments in payment's own database.
//!
//! A charge is one guarded `UPDATE` (`balance_cents >= $amount`), so
//! concurrent charges can never overdraw an account. A payment's id is the
//! saga's id: its primary key serialises a new charge with anything else on
//! that id, and the row's lock the operations on an existing payment.

use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use sagaworks_events::{AccountCredited, AccountOpened, PaymentCharged, PaymentRefunded};
use sagaworks_outbox::{OutboxWriter, PendingEvent};
use sqlx::{AssertSqlSafe, FromRow, PgConnection};
use uuid::Uuid;

#[derive(Debug, Clone, FromRow)]
pub struct Account {
    pub customer_id: Uuid,
    pub name: String,
    pub balance_cents: i64,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentStatus {
    Charged,
    Refunded,
    Voided,
}

#[derive(Debug, Clone)]
pub struct Payment {
    pub id: Uuid,
    pub customer_id: Uuid,
    pub order_id: Uuid,
    pub amount_cents: i64,
    pub status: PaymentStatus,
}

pub struct Charge {
    pub payment_id: Uuid,
    pub customer_id: Uuid,
    pub order_id: Uuid,
    pub amount_cents: i64,
}

const ACCOUNT_COLUMNS: &str = "customer_id, name, balance_cents, created_at";

#[tracing::instrument(name = "db.open", skip_all, fields(
    otel.name = "open accounts", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "open", db.collection.name = "accounts"))]
pub async fn open_account(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    customer_id: Uuid,
    name: &str,
    credit: i64,
) -> Result<Account> {
    let account = sqlx::query_as::<_, Account>(AssertSqlSafe(format!(
        "INSERT INTO accounts (customer_id, name, balance_cents) VALUES ($1, $2, $3)
         ON CONFLICT DO NOTHING RETURNING {ACCOUNT_COLUMNS}"
    )))
    .bind(customer_id)
    .bind(name)
    .bind(credit)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(Error::DuplicateCustomer(customer_id))?;
    let event = AccountOpened { customer_id, name: name.to_string(), initial_credit_cents: credit };
    outbox.append(conn, &event).await?;
    Ok(account)
}

#[tracing::instrument(name = "db.credit", skip_all, fields(
    otel.name = "credit accounts", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "credit", db.collection.name = "accounts"))]
pub async fn add_credit(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    customer_id: Uuid,
    amount: i64,
) -> Result<Account> {
    let account = sqlx::query_as::<_, Account>(AssertSqlSafe(format!(
        "UPDATE accounts SET balance_cents = balance_cents + $2, updated_at = now()
         WHERE customer_id = $1 RETURNING {ACCOUNT_COLUMNS}"
    )))
    .bind(customer_id)
    .bind(amount)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(Error::CustomerNotFound(customer_id))?;
    let event = AccountCredited { customer_id, amount_cents: amount, balance_cents: account.balance_cents };
    outbox.append(conn, &event).await?;
    Ok(account)
}

pub async fn get_account(conn: &mut PgConnection, customer_id: Uuid) -> Result<Account> {
    sqlx::query_as::<_, Account>(AssertSqlSafe(format!(
        "SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE customer_id = $1"
    )))
    .bind(customer_id)
    .fetch_optional(conn)
    .await?
    .ok_or(Error::CustomerNotFound(customer_id))
}

/// Loads payment `id` and locks its row (`FOR UPDATE`: after waiting for
/// another transaction's lock, the row as that one left it). This serialises
/// every operation on an existing payment (a repeated charge, a refund);
/// creating one is serialised by the primary key (see [`charge`]).
async fn lock_payment(conn: &mut PgConnection, id: Uuid) -> Result<Option<Payment>> {
    let row = sqlx::query_as::<_, (Uuid, Uuid, i64, String)>(
        "SELECT customer_id, order_id, amount_cents, status FROM payments WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|(customer_id, order_id, amount_cents, status)| Payment {
        id,
        customer_id,
        order_id,
        amount_cents,
        status: match status.as_str() {
            "CHARGED" => PaymentStatus::Charged,
            "REFUNDED" => PaymentStatus::Refunded,
            _ => PaymentStatus::Voided,
        },
    }))
}

/// Takes `amount_cents` from the customer's balance, at most once per payment id.
///
/// The common case, a new payment, is one statement: it inserts the payment
/// first (`ON CONFLICT DO NOTHING`: a concurrent insert of the same id is
/// waited for), and only then debits the account and records the event. A
/// payment that exists already, or a debit that did not happen, is sorted out
/// afterwards (the existing payment locked); a rejection rolls the caller's
/// transaction back, inserted payment included.
#[tracing::instrument(name = "db.charge", skip_all, fields(
    otel.name = "charge payments", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "charge", db.collection.name = "payments"))]
pub async fn charge(conn: &mut PgConnection, outbox: &OutboxWriter, c: Charge) -> Result<Payment> {
    let payment = Payment {
        id: c.payment_id,
        customer_id: c.customer_id,
        order_id: c.order_id,
        amount_cents: c.amount_cents,
        status: PaymentStatus::Charged,
    };
    let event = outbox.stage(&PaymentCharged {
        payment_id: payment.id,
        order_id: payment.order_id,
        customer_id: payment.customer_id,
        amount_cents: payment.amount_cents,
    })?;
    let sql = format!(
        "WITH payment AS (
             INSERT INTO payments (id, customer_id, order_id, amount_cents, status)
             VALUES ($3, $1, $4, $2, 'CHARGED')
             ON CONFLICT (id) DO NOTHING
             RETURNING id),
         debit AS (
             UPDATE accounts SET balance_cents = balance_cents - $2, updated_at = now()
             WHERE customer_id = $1 AND balance_cents >= $2 AND EXISTS (SELECT 1 FROM payment)
             RETURNING customer_id),
         {}
         SELECT EXISTS (SELECT 1 FROM payment), EXISTS (SELECT 1 FROM debit)",
        PendingEvent::cte("event", 5, Some("debit")),
    );
    let query = sqlx::query_as(AssertSqlSafe(sql))
        .bind(c.customer_id)
        .bind(c.amount_cents)
        .bind(c.payment_id)
        .bind(c.order_id);
    let (inserted, debited): (bool, bool) = event.bind(query).fetch_one(&mut *conn).await?;
    if debited {
        return Ok(payment);
    }
    if inserted {
        // No debit: the caller rolls back, and the payment with it.
        let account = get_account(conn, c.customer_id).await?;
        return Err(Error::InsufficientFunds {
            customer_id: c.customer_id,
            balance_cents: account.balance_cents,
            amount_cents: c.amount_cents,
        });
    }
    // It conflicted, so it exists (payments are never deleted).
    let existing = lock_payment(conn, c.payment_id).await?.ok_or(sqlx::Error::RowNotFound)?;
    match existing.status {
        PaymentStatus::Voided | PaymentStatus::Refunded => Err(Error::AlreadyRefunded(c.payment_id)),
        PaymentStatus::Charged
            if existing.customer_id != c.customer_id || existing.amount_cents != c.amount_cents =>
        {
            Err(Error::Mismatch(c.payment_id))
        }
        PaymentStatus::Charged => Ok(existing),
    }
}

/// Gives a charge back. Refunding an unknown payment leaves a VOIDED
/// tombstone, so a charge that arrives late (after its saga gave up) is refused.
#[tracing::instrument(name = "db.refund", skip_all, fields(
    otel.name = "refund payments", otel.kind = "client", db.system = "postgresql", db.system.name = "postgresql",
    db.operation.name = "refund", db.collection.name = "payments"))]
pub async fn refund(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    payment_id: Uuid,
    order_id: Uuid,
    reason: &str,
) -> Result<Payment> {
    let mut payment = match lock_payment(conn, payment_id).await? {
        Some(payment) => payment,
        None => {
            // A charge may be inserting this id right now: the insert waits for
            // it, and if it committed, this refunds that charge.
            let voided = sqlx::query(
                "INSERT INTO payments (id, customer_id, order_id, amount_cents, status)
                 VALUES ($1, '00000000-0000-0000-0000-000000000000', $2, 0, 'VOIDED')
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(payment_id)
            .bind(order_id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if voided == 1 {
                return Ok(Payment {
                    id: payment_id,
                    customer_id: Uuid::nil(),
                    order_id,
                    amount_cents: 0,
                    status: PaymentStatus::Voided,
                });
            }
            lock_payment(conn, payment_id).await?.ok_or(sqlx::Error::RowNotFound)?
        }
    };
    // The payment id is the saga id, which customers see: a refund must also name the
    // order the payment is for, so knowing an id is not enough to refund it.
    if payment.order_id != order_id {
        return Err(Error::Mismatch(payment_id));
    }
    if payment.status != PaymentStatus::Charged {
        return Ok(payment);
    }
    sqlx::query(
        "UPDATE accounts SET balance_cents = balance_cents + $2, updated_at = now() WHERE customer_id = $1",
    )
    .bind(payment.customer_id)
    .bind(payment.amount_cents)
    .execute(&mut *conn)
    .await?;
    sqlx::query("UPDATE payments SET status = 'REFUNDED', updated_at = now() WHERE id = $1")
        .bind(payment_id)
        .execute(&mut *conn)
        .await?;
    payment.status = PaymentStatus::Refunded;
    let event = PaymentRefunded {
        payment_id,
        order_id: payment.order_id,
        customer_id: payment.customer_id,
        amount_cents: payment.amount_cents,
        reason: reason.to_string(),
    };
    outbox.append(conn, &event).await?;
    Ok(payment)
}
