//! The tests' harness: {{name}} against real infrastructure, a fresh database
//! per service, a real broker and a real inventory service, all in this process.
//! Each test binary uses part of it.
#![allow(dead_code)]

use sagaworks_config::{KafkaSettings, ListenSettings};
use sagaworks_proto::inventory::v1::{CreateProductRequest, GetStockRequest, Product};
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_resilience::ClientSettings;
use sagaworks_test_support::{Broker, TestDatabase};
use {{name}}::config::Settings;
use {{name}}::pb::{{name}}_service_client::{{Name}}ServiceClient;
use sqlx::PgPool;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use uuid::Uuid;

pub const WAIT: Duration = Duration::from_secs(30);

/// {{Name}} and the inventory it calls, serving until dropped.
pub struct TestApp {
    pub client: {{Name}}ServiceClient<Channel>,
    pub inventory: InventoryServiceClient<Channel>,
    pub http: String,
    pub pool: PgPool,
    pub kafka: KafkaSettings,
    /// The settings {{name}} was started with.
    pub settings: Settings,
    pub inventory_stop: CancellationToken,
    pub stop: CancellationToken,
    /// Everything spawned; stopped before the broker and the databases go.
    pub tasks: Vec<JoinHandle<()>>,
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

pub fn local() -> ListenSettings {
    ListenSettings::new("127.0.0.1", 0)
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Starts {{name}} (`tweak` adjusts its settings) with inventory, a broker and their databases.
pub async fn spawn_app_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let broker = Broker::start().await;
    let kafka = broker.kafka_settings();

    let inventory_db = TestDatabase::create("{{name}}_inventory").await;
    let inventory = inventory::startup::Application::build(inventory::config::Settings {
        grpc: local(),
        http: local(),
        database: inventory_db.settings(),
        kafka: broker.login(&kafka, "inventory"),
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
    let mut settings = Settings {
        grpc: local(),
        http: local(),
        database: db.settings(),
        // As `admin`: a broker gets a user per backend of services.toml when it is made,
        // and the test run's shared one may be older than this service.
        kafka: kafka.clone(),
        inventory: downstream,
        ..Default::default()
    };
    tweak(&mut settings);
    let stop = CancellationToken::new();
    let (grpc, http, pool, task) = start(settings.clone(), &stop).await;
    // The relay deletes what it published: the tests read what was written
    // from the ledger (`outbox_ledger`), installed before anything is.
    sagaworks_outbox::ledger::install(&db.pool().await).await.expect("the outbox ledger");

    TestApp {
        client: {{Name}}ServiceClient::connect(format!("http://127.0.0.1:{grpc}")).await.expect("connects"),
        inventory: InventoryServiceClient::connect(inventory_url).await.expect("connects to inventory"),
        http: format!("http://127.0.0.1:{http}"),
        pool,
        kafka,
        settings,
        inventory_stop,
        stop,
        tasks: vec![task, inventory_task],
        _dbs: (db, inventory_db),
        _broker: broker,
    }
}

/// Builds and runs {{name}} with `settings` until `stop`: its gRPC and HTTP ports, pool and task.
async fn start(settings: Settings, stop: &CancellationToken) -> (u16, u16, PgPool, JoinHandle<()>) {
    let app = {{name}}::startup::Application::build(settings).await.expect("{{name}} starts");
    let (grpc, http, pool) = (app.grpc_port(), app.http_port(), app.pool().clone());
    let stop = stop.clone();
    let task = tokio::spawn(async move { app.run_until_stopped(stop).await.expect("{{name}} runs") });
    (grpc, http, pool, task)
}

impl TestApp {
    /// Another replica of {{name}} on the same database, with `settings`.
    pub async fn start_replica(&mut self, settings: Settings) {
        let (.., task) = start(settings, &self.stop).await;
        self.tasks.push(task);
    }

    /// A product with 5 units in stock.
    pub async fn product(&self) -> String {
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

    /// The product as inventory has it (available, reserved, sold).
    pub async fn stock(&self, product_id: &str) -> Product {
        let request = GetStockRequest { product_id: product_id.into() };
        self.inventory.clone().get_stock(request).await.expect("product found").into_inner()
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.expect("count")
    }
}

