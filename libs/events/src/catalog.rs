//! Every version of every event and every topic: the source of the
//! committed JSON Schemas and of the AsyncAPI document.
//!
//! Adding an event means adding its type to a module, a line to
//! [`contracts`], an [`Example`] and, when a service reads it, its type to
//! the consumer's entry in [`topics`] (see docs/design.md, "Adding an
//! event").

use crate::inventory::*;
use crate::order::{self, *};
use crate::payment::*;
use sagaworks_event::Event;
use schemars::JsonSchema;
use serde_json::Value;
use std::collections::BTreeMap;
use uuid::Uuid;

/// One version of one event.
#[derive(Debug, Clone)]
pub struct Contract {
    /// CloudEvents `type`.
    pub event_type: &'static str,
    pub aggregate: &'static str,
    pub version: i32,
    /// Whether producers write this version (else it is kept for upcasting).
    pub current: bool,
    /// `ce_dataschema`.
    pub data_schema: String,
    /// JSON Schema (draft-07, no `$ref`s) of the payload.
    pub schema: Value,
    pub example: Value,
    /// The example's Kafka key.
    pub example_key: String,
}

impl Contract {
    /// `<Type>.v<version>`: the file stem under `proto/events/` and the
    /// message id in the AsyncAPI document.
    pub fn id(&self) -> String {
        format!("{}.v{}", self.event_type, self.version)
    }

    /// The schema's `description` (the type's doc comment).
    pub fn description(&self) -> &str {
        self.schema.get("description").and_then(Value::as_str).unwrap_or_default()
    }
}

/// A topic (`<prefix>.<aggregate>`) with who writes and who reads it.
#[derive(Debug, Clone, Copy)]
pub struct Topic {
    pub aggregate: &'static str,
    /// The service whose outbox relay publishes it.
    pub producer: &'static str,
    /// What the Kafka key is.
    pub key: &'static str,
    pub consumers: &'static [Reader],
}

/// A consumer group reading a topic, and the event types it handles (it
/// acknowledges the others without handling them).
#[derive(Debug, Clone, Copy)]
pub struct Reader {
    pub service: &'static str,
    pub group: &'static str,
    pub reads: &'static [&'static str],
}

/// The order service's timeline records every event that names an order.
const fn timeline(reads: &'static [&'static str]) -> Reader {
    Reader { service: "order", group: "order-timeline", reads }
}

/// Every topic, in a stable order.
pub fn topics() -> &'static [Topic] {
    TOPICS
}

const TOPICS: &[Topic] = &[
    Topic {
        aggregate: "order",
        producer: "order",
        key: "order id",
        consumers: &[
            Reader { service: "inventory", group: "inventory", reads: &[OrderConfirmed::TYPE] },
            timeline(&[OrderCreated::TYPE, OrderConfirmed::TYPE, OrderCancelled::TYPE]),
        ],
    },
    Topic { aggregate: "product", producer: "inventory", key: "product id", consumers: &[] },
    Topic {
        aggregate: "reservation",
        producer: "inventory",
        key: "reservation id",
        consumers: &[timeline(&[StockReserved::TYPE, StockReleased::TYPE, StockCommitted::TYPE])],
    },
    Topic { aggregate: "account", producer: "payment", key: "customer id", consumers: &[] },
    Topic {
        aggregate: "payment",
        producer: "payment",
        key: "payment id",
        consumers: &[timeline(&[PaymentCharged::TYPE, PaymentRefunded::TYPE])],
    },
];

/// Per topic (aggregate), the event types its publisher writes on it: the only ones a
/// consumer accepts there (`sagaworks_outbox::ConsumerSettings::types`; the services hand
/// this table in, since the outbox does not know the catalog). A topic without events
/// has an empty list.
pub fn topic_types() -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> =
        TOPICS.iter().map(|t| (t.aggregate.to_string(), Vec::new())).collect();
    for (aggregate, event_type) in AnyEvent::ON_TOPICS {
        out.entry(aggregate.to_string()).or_default().push(event_type.to_string());
    }
    out
}

/// Every version of every event, grouped by topic.
pub fn contracts() -> Vec<Contract> {
    vec![
        contract::<OrderCreated>(true),
        contract::<order::v1::OrderConfirmed>(false),
        contract::<OrderConfirmed>(true),
        contract::<OrderCancelled>(true),
        contract::<ProductCreated>(true),
        contract::<StockAdded>(true),
        contract::<StockReserved>(true),
        contract::<StockReleased>(true),
        contract::<StockCommitted>(true),
        contract::<AccountOpened>(true),
        contract::<AccountCredited>(true),
        contract::<PaymentCharged>(true),
        contract::<PaymentRefunded>(true),
    ]
}

fn contract<E: Event + JsonSchema + Example>(current: bool) -> Contract {
    let mut schema = schema_of::<E>();
    // The schema file names itself by the URI its events carry in `ce_dataschema`.
    schema["$id"] = E::data_schema().into();
    let example = E::example();
    Contract {
        event_type: E::TYPE,
        aggregate: E::AGGREGATE,
        version: E::VERSION,
        current,
        data_schema: E::data_schema(),
        schema,
        example: serde_json::to_value(&example).expect("examples serialise"),
        example_key: example.aggregate_id(),
    }
}

crate::dispatch! {
    /// The current version of every event: what a consumer built today reads.
    pub enum AnyEvent {
        OrderCreated, OrderConfirmed, OrderCancelled,
        ProductCreated, StockAdded, StockReserved, StockReleased, StockCommitted,
        AccountOpened, AccountCredited, PaymentCharged, PaymentRefunded,
    }
}

/// The JSON Schema (draft-07, every subschema inlined, so a payload schema
/// stands alone in the AsyncAPI document) of `T`.
pub(crate) fn schema_of<T: JsonSchema>() -> Value {
    let generator =
        schemars::generate::SchemaSettings::draft07().with(|s| s.inline_subschemas = true).into_generator();
    generator.into_root_schema_for::<T>().to_value()
}

/// A representative value, shown in the AsyncAPI document and used by the
/// upcast tests.
pub trait Example {
    fn example() -> Self;
}

fn id(n: u128) -> Uuid {
    Uuid::from_u128(0x0193_a5e0_0000_7000_8000_0000_0000_0000 | n)
}

const ORDER: u128 = 1;
const CUSTOMER: u128 = 2;
const SAGA: u128 = 3;
const PRODUCT: u128 = 4;

fn lines() -> Vec<ReservationLine> {
    vec![ReservationLine { product_id: id(PRODUCT), quantity: 2, unit_price_cents: 625 }]
}

impl Example for OrderCreated {
    fn example() -> Self {
        Self {
            order_id: id(ORDER),
            customer_id: id(CUSTOMER),
            items: vec![OrderLine { product_id: id(PRODUCT), quantity: 2 }],
            saga_id: id(SAGA),
        }
    }
}

impl Example for order::v1::OrderConfirmed {
    fn example() -> Self {
        Self {
            order_id: id(ORDER),
            customer_id: id(CUSTOMER),
            saga_id: id(SAGA),
            reservation_id: id(SAGA),
            payment_id: id(SAGA),
            total_cents: 1250,
        }
    }
}

impl Example for OrderConfirmed {
    fn example() -> Self {
        order::v1::OrderConfirmed::example().into()
    }
}

impl Example for OrderCancelled {
    fn example() -> Self {
        Self {
            order_id: id(ORDER),
            customer_id: id(CUSTOMER),
            saga_id: id(SAGA),
            reservation_id: id(SAGA),
            payment_id: id(SAGA),
            total_cents: 1250,
            reason: "charge_payment: insufficient funds".into(),
        }
    }
}

impl Example for ProductCreated {
    fn example() -> Self {
        Self {
            product_id: id(PRODUCT),
            sku: "MUG-001".into(),
            name: "Mug".into(),
            price_cents: 625,
            initial_stock: 100,
        }
    }
}

impl Example for StockAdded {
    fn example() -> Self {
        Self { product_id: id(PRODUCT), quantity: 20, available: 118 }
    }
}

impl Example for StockReserved {
    fn example() -> Self {
        Self { reservation_id: id(SAGA), order_id: id(ORDER), lines: lines(), total_cents: 1250 }
    }
}

impl Example for StockReleased {
    fn example() -> Self {
        Self {
            reservation_id: id(SAGA),
            order_id: id(ORDER),
            lines: lines(),
            reason: "charge_payment: insufficient funds".into(),
        }
    }
}

impl Example for StockCommitted {
    fn example() -> Self {
        Self { reservation_id: id(SAGA), order_id: id(ORDER), lines: lines(), total_cents: 1250 }
    }
}

impl Example for AccountOpened {
    fn example() -> Self {
        Self { customer_id: id(CUSTOMER), name: "Ada".into(), initial_credit_cents: 10_000 }
    }
}

impl Example for AccountCredited {
    fn example() -> Self {
        Self { customer_id: id(CUSTOMER), amount_cents: 5_000, balance_cents: 13_750 }
    }
}

impl Example for PaymentCharged {
    fn example() -> Self {
        Self { payment_id: id(SAGA), order_id: id(ORDER), customer_id: id(CUSTOMER), amount_cents: 1250 }
    }
}

impl Example for PaymentRefunded {
    fn example() -> Self {
        Self {
            payment_id: id(SAGA),
            order_id: id(ORDER),
            customer_id: id(CUSTOMER),
            amount_cents: 1250,
            reason: "confirm_order: deadline passed".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_contract_is_on_a_topic_with_one_current_version() {
        let contracts = contracts();
        let aggregates: BTreeSet<&str> = topics().iter().map(|t| t.aggregate).collect();
        for c in &contracts {
            assert!(aggregates.contains(c.aggregate), "{} is on no topic", c.id());
        }
        let ids: BTreeSet<String> = contracts.iter().map(Contract::id).collect();
        assert_eq!(ids.len(), contracts.len(), "a (type, version) is listed twice");
        let types: BTreeSet<&str> = contracts.iter().map(|c| c.event_type).collect();
        for t in types {
            let of_t = || contracts.iter().filter(|c| c.event_type == t);
            let current: Vec<i32> = of_t().filter(|c| c.current).map(|c| c.version).collect();
            let versions: Vec<i32> = of_t().map(|c| c.version).collect();
            let expected: Vec<i32> = (1..=versions.len() as i32).collect();
            assert_eq!(versions, expected, "{t}: versions are listed 1, 2, ... in order");
            assert_eq!(
                current,
                vec![*versions.last().unwrap()],
                "{t}: the newest version is the current one"
            );
        }
    }

    #[test]
    fn topic_types_are_exactly_the_contracts_types_per_topic() {
        let mut want: BTreeMap<String, BTreeSet<String>> =
            topics().iter().map(|t| (t.aggregate.to_string(), BTreeSet::new())).collect();
        for c in contracts() {
            want.get_mut(c.aggregate).expect("on a topic").insert(c.event_type.to_string());
        }
        let got: BTreeMap<String, BTreeSet<String>> =
            topic_types().into_iter().map(|(t, types)| (t, types.into_iter().collect())).collect();
        assert_eq!(got, want);
        assert!(!got["reservation"].contains("PaymentRefunded"));
    }

    #[test]
    fn every_type_a_consumer_reads_is_published_on_its_topic() {
        let contracts = contracts();
        for topic in topics() {
            for reader in topic.consumers {
                for t in reader.reads {
                    assert!(
                        contracts.iter().any(|c| c.event_type == *t && c.aggregate == topic.aggregate),
                        "{} reads {t} on {}, where nobody publishes it",
                        reader.group,
                        topic.aggregate
                    );
                }
            }
        }
    }

    #[test]
    fn schemas_are_self_contained_draft_07_with_the_doc_comment() {
        let c = contracts().into_iter().find(|c| c.id() == "StockReserved.v1").unwrap();
        assert_eq!(c.schema["$schema"], "http://json-schema.org/draft-07/schema#");
        assert!(!c.schema.to_string().contains("$ref"), "{}", c.schema);
        assert_eq!(c.schema["properties"]["lines"]["items"]["properties"]["quantity"]["type"], "integer");
        assert!(c.description().starts_with("Stock was set aside"), "{}", c.description());
    }
}
