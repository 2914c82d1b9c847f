//! The REST resources (JSON shapes in the OpenAPI document) and their
//! conversions from the gRPC contracts.

use chrono::{DateTime, Utc};
use sagaworks_proto::{
    deadletter::v1 as dl, from_timestamp, inventory::v1 as inv, order::v1 as ord, payment::v1 as pay,
};
use serde::{Deserialize, Serialize};
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

/// An optional id: absent or null means "choose one"; an empty string is not a UUID.
pub fn optional_id(field: &str, id: Option<String>) -> Result<String, crate::error::ApiError> {
    match id {
        Some(id) if id.is_empty() => Err(crate::error::ApiError::invalid(field, "must be a UUID")),
        id => Ok(id.unwrap_or_default()),
    }
}

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
pub struct SagaStep {
    /// `reserve_stock`, `charge_payment`, `confirm_order`, `refund_payment`, `release_stock`.
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

/// A saga for operators: its steps with their attempts, its trace, and what
/// operators did to it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SagaDetail {
    #[serde(flatten)]
    pub saga: Saga,
    /// The last transition (a step's result).
    pub progressed_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The trace in Jaeger (`api.trace_url`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_url: Option<String>,
    /// Operators' actions, oldest first.
    pub actions: Vec<SagaOperatorAction>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SagaOperatorAction {
    /// `RETRY`, `COMPENSATE` or `RESOLVE`.
    pub action: String,
    pub step: String,
    pub actor: String,
    pub reason: String,
    pub at: Option<DateTime<Utc>>,
}

/// `trace_url` is `trace_url_base` with `{trace_id}` replaced.
pub fn saga_detail(s: ord::Saga, trace_url_base: &str) -> SagaDetail {
    let actions = s
        .actions
        .iter()
        .map(|a| SagaOperatorAction {
            action: a.action.clone(),
            step: a.step.clone(),
            actor: a.actor.clone(),
            reason: a.reason.clone(),
            at: time(a.at),
        })
        .collect();
    let trace_id = non_empty(s.trace_id.clone());
    SagaDetail {
        progressed_at: time(s.progressed_at),
        trace_url: trace_id.as_ref().map(|t| trace_url_base.replace("{trace_id}", t)),
        trace_id,
        actions,
        saga: s.into(),
    }
}

/// One saga in a list.
#[derive(Debug, Serialize, ToSchema)]
pub struct SagaSummary {
    pub saga_id: String,
    pub order_id: String,
    /// `RUNNING`, `COMPENSATING`, `COMPLETED` or `COMPENSATED`.
    pub status: String,
    /// Absent once the saga has finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_step: Option<String>,
    /// Attempts of the current step so far.
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub progressed_at: Option<DateTime<Utc>>,
    /// Seconds since it was created.
    pub age_secs: i64,
    /// Seconds since its last transition.
    pub idle_secs: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

impl From<ord::SagaSummary> for SagaSummary {
    fn from(s: ord::SagaSummary) -> Self {
        let now = Utc::now();
        let (created_at, progressed_at) = (time(s.created_at), time(s.progressed_at));
        let secs = |t: Option<DateTime<Utc>>| t.map_or(0, |t| (now - t).num_seconds().max(0));
        Self {
            saga_id: s.saga_id,
            order_id: s.order_id,
            status: s.status,
            current_step: non_empty(s.current_step),
            attempts: s.attempts,
            last_error: non_empty(s.last_error),
            failure_reason: non_empty(s.failure_reason),
            age_secs: secs(created_at),
            idle_secs: secs(progressed_at),
            created_at,
            progressed_at,
            trace_id: non_empty(s.trace_id),
        }
    }
}

/// A page of sagas, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct SagaPage {
    pub sagas: Vec<SagaSummary>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `POST /v1/admin/sagas/{saga_id}/{retry,compensate,resolve}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SagaActionInput {
    /// Why (recorded with the action), 1 to 1000 characters.
    #[schema(min_length = 1, max_length = 1000)]
    pub reason: String,
    /// `resolve` of `reserve_stock`: what the reservation would have answered.
    /// Omit it (or null) for every other step, whose output is empty.
    #[serde(default)]
    pub output: Option<ReservationOutput>,
}

/// The output of `reserve_stock`: the order's total and each product's unit price.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReservationOutput {
    #[serde(deserialize_with = "integer")]
    pub total_cents: i64,
    pub prices: Vec<PriceOutput>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PriceOutput {
    /// Product id (UUID).
    #[schema(format = Uuid)]
    pub product_id: String,
    #[serde(deserialize_with = "integer")]
    pub unit_price_cents: i64,
}

/// What an operator's action did, and the saga after it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SagaActionResult {
    /// The step acted on.
    pub step: String,
    /// The key was used before for the same action: nothing was done again.
    pub replayed: bool,
    pub saga: SagaDetail,
}

impl From<ord::Saga> for Saga {
    fn from(s: ord::Saga) -> Self {
        Self {
            saga_id: s.saga_id,
            order_id: s.order_id,
            status: s.status,
            current_step: non_empty(s.current_step),
            steps: s.steps.into_iter().map(Into::into).collect(),
            failure_reason: non_empty(s.failure_reason),
            created_at: time(s.created_at),
            updated_at: time(s.updated_at),
        }
    }
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
            saga: o.saga.map(Into::into),
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
    fn a_replay_names_exactly_one_selection() {
        let parse = |json: &str| serde_json::from_str::<DlqReplayInput>(json);
        assert!(matches!(parse(r#"{"reason":"r","id":"0-1"}"#), Ok(DlqReplayInput::One { .. })));
        assert!(matches!(parse(r#"{"reason":"r","key":"k"}"#), Ok(DlqReplayInput::Key { .. })));
        assert!(matches!(parse(r#"{"reason":"r","all":true}"#), Ok(DlqReplayInput::All { .. })));
        for bad in [
            r#"{"reason":"r"}"#,
            r#"{"reason":"r","all":false}"#,
            r#"{"reason":"r","id":"0-1","key":"k"}"#,
            r#"{"reason":"r","key":""}"#,
            r#"{"reason":"r","all":true,"x":1}"#,
            r#"{"id":"0-1"}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

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

    #[test]
    fn a_saga_detail_links_its_trace() {
        let saga = ord::Saga {
            saga_id: "s".into(),
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            ..Default::default()
        };
        let detail = saga_detail(saga, "http://jaeger:16686/trace/{trace_id}");
        assert_eq!(
            detail.trace_url.as_deref(),
            Some("http://jaeger:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736")
        );
        let untraced = saga_detail(ord::Saga::default(), "http://jaeger:16686/trace/{trace_id}");
        assert_eq!((untraced.trace_id, untraced.trace_url), (None, None));
    }

    #[test]
    fn an_empty_optional_id_is_invalid() {
        assert_eq!(optional_id("id", None).unwrap(), "");
        assert_eq!(optional_id("id", Some("x".into())).unwrap(), "x");
        assert!(optional_id("id", Some(String::new())).is_err());
    }
}

// ---- dead letters (`/v1/admin/dlq`) ----

/// The operated dead-letter topics.
#[derive(Debug, Serialize, ToSchema)]
pub struct DlqTopics {
    pub topics: Vec<DlqTopic>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DlqTopic {
    /// The original topic as configured (`order`): the `{topic}` of the other routes.
    pub topic: String,
    pub dlq_topic: String,
    /// Messages in the dead-letter topic.
    pub messages: u64,
    /// Of those, neither replayed nor discarded.
    pub pending: u64,
}

impl From<dl::ListTopicsResponse> for DlqTopics {
    fn from(r: dl::ListTopicsResponse) -> Self {
        Self {
            topics: r
                .topics
                .into_iter()
                .map(|t| DlqTopic {
                    topic: t.topic,
                    dlq_topic: t.dlq_topic,
                    messages: t.messages,
                    pending: t.pending,
                })
                .collect(),
        }
    }
}

/// Where a message was consumed from before it was dead-lettered.
#[derive(Debug, Serialize, ToSchema)]
pub struct OriginalPosition {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// An operator's replay or discard.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterAction {
    /// `replay` or `discard`.
    pub action: String,
    pub actor: String,
    pub reason: String,
    pub at: Option<DateTime<Utc>>,
}

/// A dead-lettered message.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterView {
    /// `<partition>-<offset>` in the dead-letter topic.
    pub id: String,
    pub topic: String,
    pub dlq_topic: String,
    /// The Kafka key (the aggregate id).
    pub key: Option<String>,
    pub original: Option<OriginalPosition>,
    /// The consumer group that dead-lettered it.
    pub group: Option<String>,
    /// Why it was parked: `invalid_envelope`, `rejected`,
    /// `retries_exhausted` or `unsupported_schema_version`.
    pub reason: Option<String>,
    /// The handler's last error.
    pub error: String,
    pub attempts: u32,
    pub dead_lettered_at: Option<DateTime<Utc>>,
    /// CloudEvents `ce_id` and `ce_type`.
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    /// Every header, values as text.
    pub headers: std::collections::BTreeMap<String, String>,
    /// The payload as text, cut at 64 KiB (`payload_truncated`).
    pub payload: String,
    pub payload_bytes: u64,
    pub payload_truncated: bool,
    /// `pending`, `replayed` or `discarded`.
    pub state: String,
    pub actions: Vec<DeadLetterAction>,
}

impl From<dl::DeadLetter> for DeadLetterView {
    fn from(d: dl::DeadLetter) -> Self {
        Self {
            id: d.id,
            topic: d.topic,
            dlq_topic: d.dlq_topic,
            key: d.key,
            original: d.original.map(|o| OriginalPosition {
                topic: o.topic,
                partition: o.partition,
                offset: o.offset,
            }),
            group: d.group,
            reason: d.reason,
            error: d.error,
            attempts: d.attempts,
            dead_lettered_at: time(d.dead_lettered_at),
            event_id: d.event_id,
            event_type: d.event_type,
            headers: d.headers.into_iter().collect(),
            payload: d.payload,
            payload_bytes: d.payload_bytes,
            payload_truncated: d.payload_truncated,
            state: d.state,
            actions: d
                .actions
                .into_iter()
                .map(|a| DeadLetterAction {
                    action: a.action,
                    actor: a.actor,
                    reason: a.reason,
                    at: time(a.at),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterPage {
    pub messages: Vec<DeadLetterView>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

impl From<dl::ListDeadLettersResponse> for DeadLetterPage {
    fn from(r: dl::ListDeadLettersResponse) -> Self {
        Self {
            messages: r.messages.into_iter().map(Into::into).collect(),
            next_cursor: non_empty(r.next_cursor),
        }
    }
}

/// `POST /v1/admin/dlq/{topic}/messages/{id}/discard`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DlqActionInput {
    /// Why (recorded with the action), 1 to 1000 characters.
    #[schema(min_length = 1, max_length = 1000)]
    pub reason: String,
}

/// `POST /v1/admin/dlq/{topic}/replay`: exactly one of `id`, `key` or `all`.
#[derive(Debug, Deserialize)]
#[serde(try_from = "ReplayFields")]
pub enum DlqReplayInput {
    /// This message (it must be pending).
    One { reason: String, id: String },
    /// The pending messages of this key.
    Key { reason: String, key: String },
    /// Every pending message.
    All { reason: String },
}

/// The body as sent; [`DlqReplayInput`] checks that it names one selection.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayFields {
    reason: String,
    id: Option<String>,
    key: Option<String>,
    all: Option<bool>,
}

impl TryFrom<ReplayFields> for DlqReplayInput {
    type Error = String;

    fn try_from(f: ReplayFields) -> Result<Self, String> {
        match (f.id, f.key, f.all) {
            (Some(id), None, None) => Ok(Self::One { reason: f.reason, id }),
            (None, Some(key), None) if !key.is_empty() && key.chars().count() <= 255 => {
                Ok(Self::Key { reason: f.reason, key })
            }
            (None, Some(_), None) => Err("key must be 1 to 255 characters".into()),
            (None, None, Some(true)) => Ok(Self::All { reason: f.reason }),
            _ => Err("give exactly one of id, key or \"all\": true".into()),
        }
    }
}

/// The schema of [`DlqReplayInput`]: one of three objects, each with `reason`.
impl utoipa::PartialSchema for DlqReplayInput {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Type};
        let variant = |name: &str, selector: ObjectBuilder, description: &str| {
            let reason = ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(1000))
                .description(Some("Why (recorded with the action), 1 to 1000 characters"));
            ObjectBuilder::new()
                .description(Some(description))
                .property("reason", reason)
                .required("reason")
                .property(name, selector)
                .required(name)
                .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        };
        let id = ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(r"^[0-9]{1,10}-[0-9]{1,19}$"))
            .description(Some("`<partition>-<offset>` in the dead-letter topic"));
        let key = ObjectBuilder::new().schema_type(Type::String).min_length(Some(1)).max_length(Some(255));
        let all = ObjectBuilder::new().schema_type(Type::Boolean).enum_values(Some([true]));
        OneOfBuilder::new()
            .item(variant("id", id, "This message (it must be pending)"))
            .item(variant("key", key, "The pending messages of this Kafka key, in their original order"))
            .item(variant("all", all, "Every pending message"))
            .into()
    }
}

impl ToSchema for DlqReplayInput {}

/// What a replay sent.
#[derive(Debug, Serialize, ToSchema)]
pub struct Replayed {
    /// The messages sent back, in the order they were sent.
    pub replayed: Vec<String>,
    /// The Idempotency-Key was used before: the earlier answer, nothing sent again.
    pub replay: bool,
}

/// A discarded message.
#[derive(Debug, Serialize, ToSchema)]
pub struct Discarded {
    pub id: String,
    /// `discarded`.
    pub state: String,
    /// The Idempotency-Key was used before: nothing done again.
    pub replay: bool,
}
