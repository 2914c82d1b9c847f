//! Events of the order service: aggregate `order`, key = order id.

use crate::event;
use sagaworks_event::{DecodeError, Event, decode_payload};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An order was accepted; its saga starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub customer_id: Uuid,
    /// What was ordered, one line per product.
    pub items: Vec<OrderLine>,
    /// The order's saga (also the id of its reservation and its payment).
    pub saga_id: Uuid,
}
event!(OrderCreated, "order", 1, order_id);

/// One product of an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OrderLine {
    pub product_id: Uuid,
    pub quantity: i64,
}

/// The order's saga completed: stock is reserved and payment charged.
/// Inventory turns the reservations into sales.
///
/// Version 2 replaced v1's `reservation_id` with `reservation_ids`, so an
/// order can be served by several reservations (e.g. from two warehouses);
/// a v1 event is upcast with its one reservation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OrderConfirmed {
    pub order_id: Uuid,
    pub customer_id: Uuid,
    pub saga_id: Uuid,
    /// The reservations that hold the order's stock, to be committed.
    pub reservation_ids: Vec<Uuid>,
    pub payment_id: Uuid,
    /// What the customer was charged.
    pub total_cents: i64,
}

impl Event for OrderConfirmed {
    const TYPE: &'static str = "OrderConfirmed";
    const AGGREGATE: &'static str = "order";
    const VERSION: i32 = 2;

    fn aggregate_id(&self) -> String {
        self.order_id.to_string()
    }

    fn from_version(version: i32, payload: &[u8]) -> Result<Self, DecodeError> {
        match version {
            1 => decode_payload::<v1::OrderConfirmed>(Self::TYPE, 1, payload).map(Self::from),
            2 => decode_payload(Self::TYPE, 2, payload),
            _ => Err(DecodeError::UnknownVersion { event_type: Self::TYPE, version }),
        }
    }
}

impl From<v1::OrderConfirmed> for OrderConfirmed {
    /// The upcast: v1's one reservation becomes the list.
    fn from(v1: v1::OrderConfirmed) -> Self {
        Self {
            order_id: v1.order_id,
            customer_id: v1.customer_id,
            saga_id: v1.saga_id,
            reservation_ids: vec![v1.reservation_id],
            payment_id: v1.payment_id,
            total_cents: v1.total_cents,
        }
    }
}

/// The order's saga gave up and compensated: nothing stays reserved or
/// charged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OrderCancelled {
    pub order_id: Uuid,
    pub customer_id: Uuid,
    pub saga_id: Uuid,
    pub reservation_id: Uuid,
    pub payment_id: Uuid,
    /// What had been reserved when it was cancelled (0 if nothing was).
    pub total_cents: i64,
    /// Why, for people (the step's error or the operator's reason).
    pub reason: String,
}
event!(OrderCancelled, "order", 1, order_id);

/// Versions that producers no longer write, kept so consumers can read
/// (upcast) what older producers wrote.
pub mod v1 {
    use super::*;

    /// Version 1 of [`super::OrderConfirmed`].
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct OrderConfirmed {
        pub order_id: Uuid,
        pub customer_id: Uuid,
        pub saga_id: Uuid,
        pub reservation_id: Uuid,
        pub payment_id: Uuid,
        pub total_cents: i64,
    }
    event!(OrderConfirmed, "order", 1, order_id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v1_order_confirmed_is_upcast_with_its_one_reservation() {
        let v1 = r#"{"order_id":"0193a5e0-0000-7000-8000-000000000001",
                     "customer_id":"0193a5e0-0000-7000-8000-000000000002",
                     "saga_id":"0193a5e0-0000-7000-8000-000000000003",
                     "reservation_id":"0193a5e0-0000-7000-8000-000000000003",
                     "payment_id":"0193a5e0-0000-7000-8000-000000000003",
                     "total_cents":1250}"#;
        let saga: Uuid = "0193a5e0-0000-7000-8000-000000000003".parse().unwrap();
        let confirmed = OrderConfirmed::from_version(1, v1.as_bytes()).unwrap();
        assert_eq!(confirmed.reservation_ids, vec![saga]);
        assert_eq!(confirmed.total_cents, 1250);
        assert_eq!(confirmed.payment_id, saga);
        // v2 must not be read as v1 (no silent partial read).
        assert!(OrderConfirmed::from_version(2, v1.as_bytes()).is_err());
        assert_eq!(
            OrderConfirmed::from_version(3, b"{}"),
            Err(DecodeError::UnknownVersion { event_type: "OrderConfirmed", version: 3 })
        );
    }
}
