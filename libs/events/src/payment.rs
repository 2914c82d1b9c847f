//! Events of the payment service: aggregates `account` (key = customer id)
//! and `payment` (key = payment id).

use crate::event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A customer account was opened with its first credit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AccountOpened {
    pub customer_id: Uuid,
    pub name: String,
    pub initial_credit_cents: i64,
}
event!(AccountOpened, "account", 1, customer_id);

/// Credit was added to an account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AccountCredited {
    pub customer_id: Uuid,
    /// How much was added.
    pub amount_cents: i64,
    /// The balance afterwards.
    pub balance_cents: i64,
}
event!(AccountCredited, "account", 1, customer_id);

/// An order's payment was taken from its customer's account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaymentCharged {
    pub payment_id: Uuid,
    pub order_id: Uuid,
    pub customer_id: Uuid,
    pub amount_cents: i64,
}
event!(PaymentCharged, "payment", 1, payment_id);

/// A payment was given back to the account: the order's saga compensated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaymentRefunded {
    pub payment_id: Uuid,
    pub order_id: Uuid,
    pub customer_id: Uuid,
    pub amount_cents: i64,
    /// Why, for people.
    pub reason: String,
}
event!(PaymentRefunded, "payment", 1, payment_id);
