//! The REST resources (JSON shapes in the OpenAPI document) and their
//! conversions from the gRPC contracts.

mod admin;
mod dlq;
mod orders;
mod sagas;

pub use admin::{
    AddCredit, AddStock, CreateCustomer, CreateProduct, Customer, Product, ProductList, optional_id,
};
pub use dlq::{dead_letter, dead_letter_page, dlq_topics};
pub use orders::{CreateOrder, Order, OrderLine, OrderLineInput, OrderList, TimelineEntry};
pub use sagas::{
    PriceOutput, ReservationOutput, SagaActionInput, saga, saga_detail, saga_summary, saga_versions,
};
pub use sagaworks_api::saga::{
    Saga, SagaActionResult, SagaAttempt, SagaDetail, SagaOperatorAction, SagaPage, SagaStep, SagaSummary,
    SagaVersion, SagaVersions,
};

use chrono::{DateTime, Utc};
use sagaworks_proto::from_timestamp;

fn time(t: Option<prost_types::Timestamp>) -> Option<DateTime<Utc>> {
    t.as_ref().and_then(from_timestamp)
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// An `i64` input field. JSON Schema's `integer` includes numbers with a zero
/// fraction (`5.0`), so those are accepted too; `5.5` is not.
fn integer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    struct Integer;
    impl serde::de::Visitor<'_> for Integer {
        type Value = i64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an integer")
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<i64, E> {
            Ok(v)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<i64, E> {
            i64::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<i64, E> {
            // Below 2^53 every whole f64 is exactly one i64.
            if v.fract() == 0.0 && v.abs() < 9_007_199_254_740_992.0 {
                Ok(v as i64)
            } else {
                Err(E::invalid_value(serde::de::Unexpected::Float(v), &self))
            }
        }
    }
    d.deserialize_any(Integer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_may_have_a_zero_fraction_but_nothing_else() {
        let stock = |json: &str| serde_json::from_str::<AddStock>(json).map(|s| s.quantity);
        assert_eq!(stock(r#"{"quantity": 5}"#).unwrap(), 5);
        assert_eq!(stock(r#"{"quantity": 5.0}"#).unwrap(), 5);
        assert_eq!(stock(r#"{"quantity": -3}"#).unwrap(), -3);
        for bad in [
            r#"{"quantity": 5.5}"#,
            r#"{"quantity": "5"}"#,
            r#"{"quantity": 1e300}"#,
            r#"{"quantity": 18446744073709551615}"#,
        ] {
            assert!(stock(bad).is_err(), "{bad}");
        }
    }
}
