//! The order: what the handler takes (the body of the gateway's `POST /v1/orders`), what
//! it keeps as the object's state, and what it answers.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// At most this many lines per order (the gateway's limit).
const MAX_LINES: usize = 100;

/// The body as sent; [`OrderBody::check`] makes it an [`OrderInput`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderBody {
    pub customer_id: Option<String>,
    pub items: Option<Vec<LineBody>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LineBody {
    pub product_id: Option<String>,
    pub quantity: Option<i64>,
}

/// Why a body is no order (answered as 422).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("the key must be a UUID (the order id)")]
    Key,
    #[error("customer_id must be a UUID")]
    Customer,
    #[error("items: 1 to 100 lines")]
    Lines,
    #[error("each item needs a product_id and a quantity >= 1")]
    Line,
}

/// An order as far as the peer checks it (the participants check the rest: an unknown
/// product is inventory's refusal).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderInput {
    pub customer_id: Uuid,
    pub items: Vec<Line>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub product_id: String,
    pub quantity: i64,
}

impl OrderBody {
    pub fn check(self) -> Result<OrderInput, InputError> {
        let customer_id = self.customer_id.as_deref().and_then(|c| Uuid::parse_str(c).ok());
        let customer_id = customer_id.ok_or(InputError::Customer)?;
        let items = self.items.filter(|i| (1..=MAX_LINES).contains(&i.len())).ok_or(InputError::Lines)?;
        let items = items
            .into_iter()
            .map(|l| match (l.product_id, l.quantity) {
                (Some(product_id), Some(quantity)) if quantity >= 1 => Ok(Line { product_id, quantity }),
                _ => Err(InputError::Line),
            })
            .collect::<Result<_, _>>()?;
        Ok(OrderInput { customer_id, items })
    }
}

/// The object's key: the order id.
pub fn order_id(key: &str) -> Result<Uuid, InputError> {
    Uuid::parse_str(key).map_err(|_| InputError::Key)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Pending,
    Confirmed,
    Cancelled,
}

/// The order as the object's state (where sagaworks has its `orders` row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: Uuid,
    pub customer_id: Uuid,
    pub items: Vec<Line>,
    pub status: Status,
    pub total_cents: i64,
    pub failure_reason: Option<String>,
}

/// The handler's answer once the saga finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub order_id: Uuid,
    pub status: Status,
    pub total_cents: i64,
    pub failure_reason: Option<String>,
}

impl From<&Order> for Outcome {
    fn from(o: &Order) -> Self {
        Self {
            order_id: o.order_id,
            status: o.status,
            total_cents: o.total_cents,
            failure_reason: o.failure_reason.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> OrderBody {
        serde_json::from_str(json).unwrap()
    }

    const CUSTOMER: &str = "0193a5e0-0000-7000-8000-000000000002";

    #[test]
    fn an_order_is_taken_with_its_lines() {
        let input =
            body(&format!(r#"{{"customer_id":"{CUSTOMER}","items":[{{"product_id":"p","quantity":2}}]}}"#))
                .check()
                .unwrap();
        assert_eq!(input.customer_id.to_string(), CUSTOMER);
        assert_eq!(input.items, vec![Line { product_id: "p".into(), quantity: 2 }]);
    }

    #[test]
    fn bodies_that_are_no_order_are_refused_with_the_reason() {
        let cases = [
            (r#"{"items":[{"product_id":"p","quantity":1}]}"#.to_owned(), InputError::Customer),
            (r#"{"customer_id":"nope","items":[]}"#.to_owned(), InputError::Customer),
            (format!(r#"{{"customer_id":"{CUSTOMER}","items":[]}}"#), InputError::Lines),
            (format!(r#"{{"customer_id":"{CUSTOMER}"}}"#), InputError::Lines),
            (
                format!(r#"{{"customer_id":"{CUSTOMER}","items":[{{"product_id":"p","quantity":0}}]}}"#),
                InputError::Line,
            ),
            (format!(r#"{{"customer_id":"{CUSTOMER}","items":[{{"quantity":1}}]}}"#), InputError::Line),
        ];
        for (json, expected) in cases {
            assert_eq!(body(&json).check().unwrap_err(), expected, "{json}");
        }
        let lines = vec![r#"{"product_id":"p","quantity":1}"#; MAX_LINES + 1].join(",");
        let json = format!(r#"{{"customer_id":"{CUSTOMER}","items":[{lines}]}}"#);
        assert_eq!(body(&json).check().unwrap_err(), InputError::Lines);
    }

    #[test]
    fn the_key_must_be_a_uuid() {
        assert_eq!(order_id("42"), Err(InputError::Key));
        assert!(order_id(CUSTOMER).is_ok());
    }

    #[test]
    fn the_status_is_written_as_the_node_peer_and_the_load_tool_spell_it() {
        assert_eq!(serde_json::to_string(&Status::Confirmed).unwrap(), r#""CONFIRMED""#);
        assert_eq!(serde_json::to_string(&Status::Cancelled).unwrap(), r#""CANCELLED""#);
    }
}
