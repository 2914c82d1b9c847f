//! {{name}} against real infrastructure: a fresh database per service, a real
//! broker and a real inventory service, all in this process.

use sagaworks_config::{KafkaSettings, ListenSettings};
use sagaworks_outbox::{NewEvent, OutboxWriter, Relay, RelaySettings};
use sagaworks_proto::inventory::v1::CreateProductRequest;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_resilience::ClientSettings;
use sagaworks_test_support::{Broker, TestDatabase, eventually};
use {{name}}::pb::CreateItemRequest;
use {{name}}::pb::{{name}}_service_client::{{Name}}ServiceClient;
use sqlx::PgPool;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);

/// {{Name}} and the inventory it calls, serving until dropped.
struct TestApp {
    client: {{Name}}ServiceClient<Channel>,
    inventory: InventoryServiceClient<Channel>,
    http: String,
    pool: PgPool,
    kafka: KafkaSettings,
    inventory_stop: CancellationToken,
    stop: CancellationToken,
    /// Everything spawned; stopped before the broker and the databases go.
    tasks: Vec<JoinHandle<()>>,
    _dbs: (TestDatabase, TestDatabase),
    _broker: Broker,
}

impl Drop for TestApp {
    /// Stops the services while the broker still runs (also when a test fails): a Kafka
    /// consumer dropped after its broker is gone can block forever in librdkafka's close.
    fn drop(&mut self) {
        self.stop.cancel();
        self.inventory_stop.cancel();
        let tasks = std::mem::take(&mut self.tasks);
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                for task in tasks {
                    let _ = tokio::time::timeout(WAIT, task).await;
                }
            })
        });
    }
}

fn local() -> ListenSettings {
    ListenSettings::new("127.0.0.1", 0)
}

async fn spawn_app() -> TestApp {
    let broker = Broker::start().await;
    let kafka = broker.kafka_settings();

    let inventory_db = TestDatabase::create("{{name}}_inventory").await;
    let inventory = inventory::startup::Application::build(inventory::config::Settings {
        grpc: local(),
        http: local(),
        database: inventory_db.settings(),
        kafka: kafka.clone(),
        ..Default::default()
    })
    .await
    .expect("inventory starts");
    let inventory_url = format!("http://127.0.0.1:{}", inventory.grpc_port());
    let inventory_stop = CancellationToken::new();
    let inventory_task = tokio::spawn({
        let stop = inventory_stop.clone();
        async move { inventory.run_until_stopped(stop).await.expect("inventory runs") }
    });

    let db = TestDatabase::create("{{name}}").await;
    let mut downstream = ClientSettings::with_url(&inventory_url);
    downstream.timeout_ms = 1_000;
    let settings = {{name}}::config::Settings {
        grpc: local(),
        http: local(),
        database: db.settings(),
        kafka: kafka.clone(),
        inventory: downstream,
        ..Default::default()
    };
    let app = {{name}}::startup::Application::build(settings).await.expect("{{name}} starts");
    let (grpc, http, pool) = (app.grpc_port(), app.http_port(), app.pool().clone());
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { app.run_until_stopped(stop).await.expect("{{name}} runs") }
    });

    TestApp {
        client: {{Name}}ServiceClient::connect(format!("http://127.0.0.1:{grpc}")).await.expect("connects"),
        inventory: InventoryServiceClient::connect(inventory_url).await.expect("connects to inventory"),
        http: format!("http://127.0.0.1:{http}"),
        pool,
        kafka,
        inventory_stop,
        stop,
        tasks: vec![task, inventory_task],
        _dbs: (db, inventory_db),
        _broker: broker,
    }
}

impl TestApp {
    async fn product(&self) -> String {
        let request = CreateProductRequest {
            sku: format!("SKU-{}", Uuid::new_v4().simple()),
            name: "Widget".into(),
            price_cents: 250,
            initial_stock: 5,
            id: String::new(),
            idempotency_key: Uuid::new_v4().to_string(),
        };
        self.inventory.clone().create_product(request).await.expect("product created").into_inner().id
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.expect("count")
    }
}

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

    let (aggregate_type, event_type, payload): (String, String, Vec<u8>) =
        sqlx::query_as("SELECT aggregate_type, event_type, payload FROM outbox WHERE aggregate_id = $1")
            .bind(id.to_string())
            .fetch_one(&app.pool)
            .await
            .expect("exactly one outbox row for the item");
    assert_eq!((aggregate_type.as_str(), event_type.as_str()), ({{name}}::items::AGGREGATE, "ItemCreated"));
    let payload: serde_json::Value = serde_json::from_slice(&payload).expect("JSON payload");
    assert_eq!(payload["product_id"], product_id.as_str());

    // The relay runs in the service: the row gets published to the broker.
    eventually("the relay to publish ItemCreated", WAIT, || async {
        let published: bool =
            sqlx::query_scalar("SELECT published_at IS NOT NULL FROM outbox WHERE aggregate_id = $1")
                .bind(id.to_string())
                .fetch_one(&app.pool)
                .await
                .ok()?;
        published.then_some(())
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
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 0);
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
    for (event_type, total) in [("OrderCreated", 0), ("OrderConfirmed", 1_250)] {
        let payload = serde_json::json!({ "order_id": order_id, "total_cents": total });
        let event = NewEvent::new("order", order_id, event_type, payload).expect("event");
        OutboxWriter::new("order").write(&mut tx, event).await.expect("outbox write");
    }
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
