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
    PriceOutput, ReservationOutput, SagaActionInput, SagaActionResult, SagaDetail, SagaOperatorAction,
    SagaPage, SagaSummary, SagaVersion, SagaVersions, saga_detail,
};

use chrono::{DateTime, Utc};
use sagaworks_proto::{from_timestamp, order::v1 as ord};
use serde::Serialize;
use utoipa::ToSchema;

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

#[derive(Debug, Serialize, ToSchema)]
pub struct SagaStep {
    /// `check_account` (version 2), `reserve_stock`, `charge_payment`, `confirm_order`, `refund_payment`, `release_stock`.
    pub name: String,
    /// `RUNNING`, `SUCCEEDED` or `FAILED`.
    pub status: String,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Each attempt's outcome, oldest first.
    pub history: Vec<SagaAttempt>,
    /// `compensatable`, `pivot` or `retriable` (forward steps), or `compensation`.
    pub role: String,
}

/// One attempt of a saga step.
#[derive(Debug, Serialize, ToSchema)]
pub struct SagaAttempt {
    pub attempt: u32,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// `succeeded`, `rejected`, `failed`; an operator's `resolved` or `abandoned`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Saga {
    pub saga_id: String,
    pub order_id: String,
    /// The version of the saga's definition it started on (and runs on).
    pub version: u32,
    /// `RUNNING`, `COMPENSATING`, `COMPLETED` or `COMPENSATED`.
    pub status: String,
    /// The step running or to run next; absent once the saga has finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_step: Option<String>,
    pub steps: Vec<SagaStep>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
}

impl From<ord::SagaStep> for SagaStep {
    fn from(s: ord::SagaStep) -> Self {
        Self {
            name: s.name,
            status: s.status,
            attempts: s.attempts,
            error: non_empty(s.error),
            started_at: time(s.started_at),
            finished_at: time(s.finished_at),
            role: s.role,
            history: s
                .history
                .into_iter()
                .map(|a| SagaAttempt {
                    attempt: a.attempt,
                    started_at: time(a.started_at),
                    ended_at: time(a.ended_at),
                    outcome: a.outcome,
                    error: non_empty(a.error),
                })
                .collect(),
        }
    }
}

impl From<ord::Saga> for Saga {
    fn from(s: ord::Saga) -> Self {
        Self {
            saga_id: s.saga_id,
            order_id: s.order_id,
            version: s.version,
            status: s.status,
            current_step: non_empty(s.current_step),
            steps: s.steps.into_iter().map(Into::into).collect(),
            failure_reason: non_empty(s.failure_reason),
            created_at: time(s.created_at),
            updated_at: time(s.updated_at),
        }
    }
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
