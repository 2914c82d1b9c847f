//! The catalogue and customer accounts: what the admin endpoints of
//! `/v1/products` and `/v1/customers` take and answer.

use super::{integer, time};
use chrono::{DateTime, Utc};
use sagaworks_proto::{inventory::v1 as inv, payment::v1 as pay};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An optional id: absent or null means "choose one"; an empty string is not a UUID.
pub fn optional_id(field: &str, id: Option<String>) -> Result<String, crate::error::ApiError> {
    match id {
        Some(id) if id.is_empty() => Err(crate::error::ApiError::invalid(field, "must be a UUID")),
        id => Ok(id.unwrap_or_default()),
    }
}

/// `POST /v1/products`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProduct {
    /// Unique stock-keeping unit, 1 to 64 characters (trimmed; no NUL).
    #[schema(min_length = 1, max_length = 64, pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$")]
    pub sku: String,
    /// 1 to 200 characters (trimmed; no NUL).
    #[schema(min_length = 1, max_length = 200, pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$")]
    pub name: String,
    #[schema(minimum = 0, maximum = 100_000_000)]
    #[serde(deserialize_with = "integer")]
    pub price_cents: i64,
    #[schema(minimum = 0, maximum = 1_000_000)]
    #[serde(deserialize_with = "integer")]
    pub initial_stock: i64,
    /// Optional client-chosen id (UUID).
    #[serde(default)]
    #[schema(format = Uuid)]
    pub id: Option<String>,
}

/// `POST /v1/products/{id}/stock`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddStock {
    #[schema(minimum = 1, maximum = 1_000_000)]
    #[serde(deserialize_with = "integer")]
    pub quantity: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Product {
    pub id: String,
    pub sku: String,
    pub name: String,
    pub price_cents: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub created_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProductList {
    pub products: Vec<Product>,
}

impl From<inv::Product> for Product {
    fn from(p: inv::Product) -> Self {
        Self {
            id: p.id,
            sku: p.sku,
            name: p.name,
            price_cents: p.price_cents,
            available: p.available,
            reserved: p.reserved,
            sold: p.sold,
            created_at: time(p.created_at),
        }
    }
}

/// `POST /v1/customers`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCustomer {
    /// 1 to 200 characters (trimmed; no NUL).
    #[schema(min_length = 1, max_length = 200, pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$")]
    pub name: String,
    #[schema(minimum = 0, maximum = 100_000_000_000_i64)]
    #[serde(deserialize_with = "integer")]
    pub initial_credit_cents: i64,
    /// Optional client-chosen id (UUID).
    #[serde(default)]
    #[schema(format = Uuid)]
    pub customer_id: Option<String>,
}

/// `POST /v1/customers/{id}/credit`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddCredit {
    #[schema(minimum = 1, maximum = 100_000_000_000_i64)]
    #[serde(deserialize_with = "integer")]
    pub amount_cents: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Customer {
    pub customer_id: String,
    pub name: String,
    pub balance_cents: i64,
    pub created_at: Option<DateTime<Utc>>,
}

impl From<pay::Account> for Customer {
    fn from(a: pay::Account) -> Self {
        Self {
            customer_id: a.customer_id,
            name: a.name,
            balance_cents: a.balance_cents,
            created_at: time(a.created_at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_optional_id_is_invalid() {
        assert_eq!(optional_id("id", None).unwrap(), "");
        assert_eq!(optional_id("id", Some("x".into())).unwrap(), "x");
        assert!(optional_id("id", Some(String::new())).is_err());
    }
}
