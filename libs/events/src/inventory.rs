//! Events of the inventory service: aggregates `product` (key = product id)
//! and `reservation` (key = reservation id).

use crate::event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A product was added to the catalogue with its first stock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProductCreated {
    pub product_id: Uuid,
    pub sku: String,
    pub name: String,
    pub price_cents: i64,
    pub initial_stock: i64,
}
event!(ProductCreated, "product", 1, product_id);

/// Stock was added to a product.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StockAdded {
    pub product_id: Uuid,
    /// How much was added.
    pub quantity: i64,
    /// Available afterwards.
    pub available: i64,
}
event!(StockAdded, "product", 1, product_id);

/// One product of a reservation, at the price it was reserved at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReservationLine {
    pub product_id: Uuid,
    pub quantity: i64,
    pub unit_price_cents: i64,
}

/// Stock was set aside for an order (available -> reserved).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StockReserved {
    pub reservation_id: Uuid,
    pub order_id: Uuid,
    pub lines: Vec<ReservationLine>,
    /// The sum of the lines at their prices.
    pub total_cents: i64,
}
event!(StockReserved, "reservation", 1, reservation_id);

/// A reservation was given back (reserved -> available): the order's saga
/// compensated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StockReleased {
    pub reservation_id: Uuid,
    pub order_id: Uuid,
    pub lines: Vec<ReservationLine>,
    /// Why, for people.
    pub reason: String,
}
event!(StockReleased, "reservation", 1, reservation_id);

/// A reservation became a sale (reserved -> sold): its order was confirmed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StockCommitted {
    pub reservation_id: Uuid,
    pub order_id: Uuid,
    pub lines: Vec<ReservationLine>,
    pub total_cents: i64,
}
event!(StockCommitted, "reservation", 1, reservation_id);
