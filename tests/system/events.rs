//! The event contracts through the running services: the gateway serves the
//! AsyncAPI document, the order service writes `OrderConfirmed` v2, and
//! inventory, built with v2, still commits the reservation named by a v1
//! `OrderConfirmed` that an order service not yet upgraded wrote.

use reqwest::StatusCode;
use sagaworks_events::order::v1;
use sagaworks_outbox::{OutboxWriter, Relay, RelaySettings};
use sagaworks_proto::inventory::v1 as inv;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_test_support::{TestDatabase, eventually};
use std::time::Duration;
use system_tests::operations::dead_letters;
use system_tests::{Stack, channel_as};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A stack with a product of 10 units, 3 of them reserved by inventory (called as order
/// calls it) for a new order: the stack, the product, the order and the reservation.
async fn three_reserved() -> (Stack, String, Uuid, Uuid) {
    let stack = Stack::start().await;
    let product = stack.product(100, 10).await;
    let (order_id, reservation_id) = (Uuid::now_v7(), Uuid::now_v7());
    let mut inventory =
        InventoryServiceClient::new(channel_as("order", "inventory", &stack.inventory.grpc_url()).await);
    inventory
        .reserve_stock(inv::ReserveStockRequest {
            idempotency_key: format!("{reservation_id}:reserve_stock"),
            reservation_id: reservation_id.to_string(),
            order_id: order_id.to_string(),
            items: vec![inv::ReserveItem { product_id: product.clone(), quantity: 3 }],
        })
        .await
        .unwrap();
    (stack, product, order_id, reservation_id)
}

/// A database with an outbox of its own and a relay publishing it to the stack's
/// Kafka: a producer outside the stack (an order service not yet upgraded, a forger).
/// Each row is published with the source of the `OutboxWriter` that wrote it.
struct OwnOutbox {
    pool: sqlx::PgPool,
    stop: CancellationToken,
    relaying: tokio::task::JoinHandle<()>,
    _db: TestDatabase,
}

impl OwnOutbox {
    async fn start(stack: &Stack, name: &str) -> Self {
        let db = TestDatabase::create(name).await;
        let pool = db.pool().await;
        sagaworks_runtime::db::migrate(&pool, &mut [sagaworks_outbox::migrator()]).await.unwrap();
        let settings = RelaySettings { service: "order".into(), ..Default::default() };
        let relay = Relay::new(pool.clone(), &stack.kafka, settings).unwrap();
        let stop = CancellationToken::new();
        let relaying = tokio::spawn(relay.run(stop.clone()));
        Self { pool, stop, relaying, _db: db }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.relaying.await.unwrap();
    }
}

#[tokio::test]
async fn inventory_commits_the_reservation_of_a_v1_order_confirmed_from_a_producer_not_yet_upgraded() {
    let (stack, product, order_id, reservation_id) = three_reserved().await;
    assert_eq!(stack.stock(&product).await, (7, 3, 0));

    // The old order service: its own database, outbox and relay, writing v1.
    let old_order = OwnOutbox::start(&stack, "old_order").await;
    let pool = &old_order.pool;
    let mut tx = pool.begin().await.unwrap();
    let confirmed = v1::OrderConfirmed {
        order_id,
        customer_id: Uuid::now_v7(),
        saga_id: reservation_id,
        reservation_id,
        payment_id: reservation_id,
        total_cents: 300,
    };
    OutboxWriter::new("order").append(&mut tx, &confirmed).await.unwrap();
    tx.commit().await.unwrap();

    eventually("the v1 event's reservation sold", Duration::from_secs(60), || async {
        (stack.stock(&product).await == (7, 0, 3)).then_some(())
    })
    .await;
    old_order.stop().await;
}

#[tokio::test]
async fn the_gateway_serves_the_asyncapi_document_and_orders_confirm_with_v2() {
    let stack = Stack::start().await;
    let (status, doc) = stack.get("/asyncapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["asyncapi"], "3.0.0");
    assert_eq!(doc["channels"]["order"]["address"], "{prefix}.order");
    let v2 = &doc["components"]["messages"]["OrderConfirmed.v2"];
    assert_eq!(v2["headers"]["properties"]["ce_schemaversion"]["const"], "2", "{v2}");
    assert!(v2["payload"]["schema"]["required"].as_array().unwrap().contains(&"reservation_ids".into()));

    // What the order service writes is that message.
    let product = stack.product(100, 10).await;
    let customer = stack.customer(1_000).await;
    let (status, order) = stack.place(&customer, &product, 2).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    let order = stack.settled(order["order_id"].as_str().unwrap()).await;
    assert_eq!(order["status"], "CONFIRMED", "{order}");
    let pool = stack.order_db.pool().await;
    let (version, schema, payload): (i32, Option<String>, Vec<u8>) = sqlx::query_as(
        "SELECT schema_version, data_schema, payload FROM outbox_ledger WHERE event_type = 'OrderConfirmed'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((version, schema.as_deref()), (2, Some("urn:sagaworks:event:OrderConfirmed:v2")));
    let payload: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    // The reservation is the saga's (keyed by its id).
    assert_eq!(payload["reservation_ids"], serde_json::json!([payload["saga_id"]]), "{payload}");
    assert_eq!(payload["order_id"], order["order_id"], "{payload}");
    eventually("the reservation sold", Duration::from_secs(60), || async {
        (stack.stock(&product).await == (8, 0, 2)).then_some(())
    })
    .await;
}

/// A forged `OrderConfirmed` commits nothing. Published by another service than order
/// (its `ce_source`), both consumer groups of the topic park it as `untrusted_source`;
/// from order's source but naming another order's reservation, inventory rejects it.
/// The genuine event then sells the stock.
#[tokio::test]
async fn a_forged_order_confirmed_is_parked_not_applied() {
    let (stack, product, order_id, reservation_id) = three_reserved().await;
    assert_eq!(stack.stock(&product).await, (7, 3, 0));

    // An outbox of the forger's own, published by a relay: each row keeps its writer's source.
    let forger = OwnOutbox::start(&stack, "forger").await;
    let pool = &forger.pool;
    let confirmed = |order_id: Uuid| sagaworks_events::OrderConfirmed {
        order_id,
        customer_id: Uuid::now_v7(),
        saga_id: reservation_id,
        reservation_ids: vec![reservation_id],
        payment_id: reservation_id,
        total_cents: 300,
    };
    let other_order = Uuid::now_v7();
    let mut tx = pool.begin().await.unwrap();
    OutboxWriter::new("payment").append(&mut tx, &confirmed(order_id)).await.unwrap();
    OutboxWriter::new("order").append(&mut tx, &confirmed(other_order)).await.unwrap();
    tx.commit().await.unwrap();

    let parked = |key: Uuid, group: &'static str| {
        let stack = &stack;
        async move {
            let found = dead_letters(stack, "order", &format!("key={key}")).await?;
            found.into_iter().find(|m| m["group"] == group)
        }
    };
    for group in ["inventory", "order-timeline"] {
        let m =
            eventually("the event from payment parked", Duration::from_secs(60), || parked(order_id, group))
                .await;
        assert_eq!(m["reason"], "untrusted_source", "{m}");
        assert!(m["error"].as_str().unwrap().contains("/sagaworks/payment"), "{m}");
    }
    let m = eventually("another order's event rejected", Duration::from_secs(60), || {
        parked(other_order, "inventory")
    })
    .await;
    assert_eq!(m["reason"], "rejected", "{m}");
    assert!(m["error"].as_str().unwrap().contains(&format!("does not belong to order {other_order}")), "{m}");
    assert_eq!(stack.stock(&product).await, (7, 3, 0), "nothing was sold");

    let mut tx = pool.begin().await.unwrap();
    OutboxWriter::new("order").append(&mut tx, &confirmed(order_id)).await.unwrap();
    tx.commit().await.unwrap();
    eventually("the genuine event's reservation sold", Duration::from_secs(60), || async {
        (stack.stock(&product).await == (7, 0, 3)).then_some(())
    })
    .await;
    forger.stop().await;
}

/// A topic's rightful publisher cannot put another topic's events on it: inventory's
/// `PaymentRefunded` on its `reservation` topic, naming a real order, is parked by the
/// timeline's group as `unexpected_type` and never shows in the order's timeline.
#[tokio::test]
async fn an_event_type_of_another_topic_is_parked_not_put_in_the_timeline() {
    let stack = Stack::start().await;
    let product = stack.product(100, 10).await;
    let customer = stack.customer(10_000).await;
    let (status, order) = stack.place(&customer, &product, 3).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    let order_id: Uuid = order["order_id"].as_str().unwrap().parse().unwrap();
    // The timeline's group has consumed the order's own events first (they come on another
    // topic, in no order with the forged one), so that what it shows at the end is settled.
    let types = |order: &serde_json::Value| -> Vec<String> {
        let timeline = order["timeline"].as_array().cloned().unwrap_or_default();
        timeline.iter().filter_map(|e| e["event_type"].as_str().map(String::from)).collect()
    };
    eventually("the order's creation in its timeline", Duration::from_secs(60), || async {
        let (_, order) = stack.get(&format!("/v1/orders/{order_id}")).await;
        types(&order).iter().any(|t| t == "OrderCreated").then_some(())
    })
    .await;

    let forger = OwnOutbox::start(&stack, "typeforger").await;
    let refunded = sagaworks_events::PaymentRefunded {
        payment_id: Uuid::now_v7(),
        order_id,
        customer_id: customer.parse().unwrap(),
        amount_cents: 300,
        reason: "forged".into(),
    };
    let reservation = Uuid::now_v7();
    let event =
        sagaworks_outbox::NewEvent::new("reservation", reservation, "PaymentRefunded", &refunded).unwrap();
    let mut tx = forger.pool.begin().await.unwrap();
    OutboxWriter::new("inventory").append(&mut tx, event).await.unwrap();
    tx.commit().await.unwrap();

    let m = eventually("the refund on reservation parked", Duration::from_secs(60), || async {
        let found = dead_letters(&stack, "reservation", &format!("key={reservation}")).await?;
        found.into_iter().next()
    })
    .await;
    assert_eq!(
        (m["group"].as_str(), m["reason"].as_str(), m["event_type"].as_str()),
        (Some("order-timeline"), Some("unexpected_type"), Some("PaymentRefunded")),
        "{m}"
    );
    assert!(m["error"].as_str().unwrap().contains("is not an event of topic"), "{m}");
    let (_, order) = stack.get(&format!("/v1/orders/{order_id}")).await;
    let types = types(&order);
    assert!(types.iter().any(|t| t == "OrderCreated"), "{types:?}");
    assert!(!types.iter().any(|t| t == "PaymentRefunded"), "{types:?}");
    forger.stop().await;
}
