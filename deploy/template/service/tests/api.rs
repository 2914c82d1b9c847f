//! {{name}} against real infrastructure: a fresh database per service, a real
//! broker and a real inventory service, all in this process (`support`).

mod support;

use sagaworks_events::{OrderConfirmed, OrderCreated, OrderLine};
use sagaworks_outbox::{OutboxWriter, Relay, RelaySettings};
use sagaworks_test_support::{TestDatabase, eventually};
use std::time::Duration;
use support::{WAIT, spawn_app};
use tonic::Code;
use uuid::Uuid;
use {{name}}::pb::CreateItemRequest;

// Multi-threaded so that `TestApp`'s drop can wait for the services to stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_then_create_item_writes_the_item_and_publishes_its_event() {
    let app = spawn_app().await;
    let ready = format!("{}/health/ready", app.http);
    eventually("/health/ready to answer 200", WAIT, || async {
        let res = reqwest::get(&ready).await.ok()?;
        (res.status() == reqwest::StatusCode::OK).then_some(())
    })
    .await;

    let product_id = app.product().await;
    let request =
        CreateItemRequest { product_id: product_id.clone(), name: "first".into(), id: String::new() };
    let item = app.client.clone().create_item(request).await.expect("item created").into_inner();
    assert_eq!(item.product_id, product_id);
    assert_eq!(item.name, "first");

    let id: Uuid = item.id.parse().expect("item id is a UUID");
    let stored: (Uuid, String) = sqlx::query_as("SELECT product_id, name FROM items WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .expect("item row");
    assert_eq!((stored.0.to_string(), stored.1.as_str()), (product_id.clone(), "first"));

    // Its claim saga reserved one unit at inventory before the answer.
    assert_eq!(item.status, "ACTIVE");
    let stock = app.stock(&product_id).await;
    assert_eq!((stock.available, stock.reserved), (4, 1), "one unit claimed");

    let events: Vec<(String, String, Vec<u8>)> = sqlx::query_as(
        "SELECT aggregate_type, event_type, payload FROM outbox_ledger WHERE aggregate_id = $1 ORDER BY seq",
    )
    .bind(id.to_string())
    .fetch_all(&app.pool)
    .await
    .expect("the item's outbox rows");
    let types: Vec<(&str, &str)> = events.iter().map(|(a, t, _)| (a.as_str(), t.as_str())).collect();
    let aggregate = {{name}}::contract::AGGREGATE;
    assert_eq!(types, [(aggregate, "ItemCreated"), (aggregate, "ItemActivated")]);
    let payload: serde_json::Value = serde_json::from_slice(&events[0].2).expect("JSON payload");
    assert_eq!(payload["product_id"], product_id.as_str());

    // The relay runs in the service: the rows get published to the broker,
    // which acked them, and deleted from the outbox.
    eventually("the relay to publish the item's events", WAIT, || async {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE aggregate_id = $1")
            .bind(id.to_string())
            .fetch_one(&app.pool)
            .await
            .ok()?;
        (left == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_items_write_nothing() {
    let app = spawn_app().await;
    let create = |product_id: String| {
        let mut client = app.client.clone();
        async move {
            client.create_item(CreateItemRequest { product_id, name: "x".into(), id: String::new() }).await
        }
    };

    let err = create("not-a-uuid".into()).await.expect_err("malformed id is refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(sagaworks_errors::status::invalid_field(&err), Some("product_id"));

    let err = create(Uuid::new_v4().to_string()).await.expect_err("unknown product is refused");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    // Inventory gone: the caller gets a retryable answer, not an internal error.
    app.inventory_stop.cancel();
    let product = Uuid::new_v4().to_string();
    let err = eventually("inventory to be unreachable", WAIT, || {
        let call = create(product.clone());
        async move { call.await.err().filter(|e| e.code() != Code::FailedPrecondition) }
    })
    .await;
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    assert_eq!(app.count("SELECT count(*) FROM items").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM outbox_ledger").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_confirmed_events_from_kafka_land_in_the_read_model() {
    // Declared first, dropped last: the relay below runs on it until the app stops.
    let order_db = TestDatabase::create("{{name}}_order").await;
    let mut app = spawn_app().await;

    // Another service's outbox and relay publish to `<prefix>.order`, as order does.
    let order_pool = order_db.pool().await;
    sagaworks_runtime::db::migrate(&order_pool, &mut [sagaworks_outbox::migrator()])
        .await
        .expect("outbox tables");
    let order_id = Uuid::new_v4();
    let mut tx = order_pool.begin().await.expect("tx");
    let (customer_id, saga_id) = (Uuid::new_v4(), Uuid::new_v4());
    let outbox = OutboxWriter::new("order");
    let items = vec![OrderLine { product_id: Uuid::new_v4(), quantity: 1 }];
    let created = OrderCreated { order_id, customer_id, items, saga_id };
    outbox.append(&mut tx, &created).await.expect("outbox write");
    let confirmed = OrderConfirmed {
        order_id,
        customer_id,
        saga_id,
        reservation_ids: vec![saga_id],
        payment_id: saga_id,
        total_cents: 1_250,
    };
    outbox.append(&mut tx, &confirmed).await.expect("outbox write");
    tx.commit().await.expect("commit");
    let relay_settings = RelaySettings { service: "order".into(), ..Default::default() };
    let relay = Relay::new(order_pool, &app.kafka, relay_settings).expect("relay");
    app.tasks.push(tokio::spawn(relay.run(app.stop.clone())));

    let total: i64 =
        eventually("the consumer to record the confirmed order", Duration::from_secs(60), || async {
            sqlx::query_scalar("SELECT total_cents FROM confirmed_orders WHERE order_id = $1")
                .bind(order_id)
                .fetch_optional(&app.pool)
                .await
                .ok()
                .flatten()
        })
        .await;
    assert_eq!(total, 1_250);
    assert_eq!(app.count("SELECT count(*) FROM confirmed_orders").await, 1, "OrderCreated is ignored");
}
