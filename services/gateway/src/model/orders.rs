//! Orders: what `/v1/orders` takes and answers.

use super::{Saga, integer, non_empty, saga, time};
use chrono::{DateTime, Utc};
use sagaworks_proto::order::v1 as ord;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderLineInput {
    /// Product id (UUID).
    #[schema(format = Uuid)]
    pub product_id: String,
    /// Units, 1 to 1000000.
    #[schema(minimum = 1, maximum = 1_000_000)]
    #[serde(deserialize_with = "integer")]
    pub quantity: i64,
}

/// `POST /v1/orders`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateOrder {
    /// Customer id (UUID), as created with `POST /v1/customers`; a customer's token may order only for itself.
    #[schema(format = Uuid)]
    pub customer_id: String,
    /// 1 to 100 lines; lines for the same product are summed (at most 1000000 units).
    #[schema(min_items = 1, max_items = 100)]
    pub items: Vec<OrderLineInput>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OrderLine {
    pub product_id: String,
    pub quantity: i64,
    /// Known once stock is reserved (inventory owns prices); 0 before.
    pub unit_price_cents: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TimelineEntry {
    pub event_id: String,
    pub event_type: String,
    pub source: String,
    pub occurred_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Order {
    pub order_id: String,
    pub customer_id: String,
    /// `PENDING`, `CONFIRMED` or `CANCELLED`.
    pub status: String,
    pub items: Vec<OrderLine>,
    pub total_cents: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saga: Option<Saga>,
    /// Domain events about this order seen on Kafka, oldest first.
    pub timeline: Vec<TimelineEntry>,
    /// The OpenTelemetry trace of the request that created the order (open it in Jaeger).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OrderList {
    pub orders: Vec<Order>,
}

impl From<ord::Order> for Order {
    fn from(o: ord::Order) -> Self {
        Self {
            order_id: o.order_id,
            customer_id: o.customer_id,
            status: o.status,
            items: o
                .items
                .into_iter()
                .map(|i| OrderLine {
                    product_id: i.product_id,
                    quantity: i.quantity,
                    unit_price_cents: i.unit_price_cents,
                })
                .collect(),
            total_cents: o.total_cents,
            failure_reason: non_empty(o.failure_reason),
            saga: o.saga.map(saga),
            timeline: o
                .timeline
                .into_iter()
                .map(|t| TimelineEntry {
                    event_id: t.event_id,
                    event_type: t.event_type,
                    source: t.source,
                    occurred_at: time(t.occurred_at),
                })
                .collect(),
            trace_id: non_empty(o.trace_id),
            created_at: time(o.created_at),
            updated_at: time(o.updated_at),
        }
    }
}
