//! Shared helpers of the system tests: the whole system in one process.
//!
//! [`Stack::start`] runs inventory, payment, order and the gateway as real
//! servers on free local ports, each service with a fresh database of its
//! own on the local PostgreSQL server. Each service runs on a Tokio runtime
//! of its own ([`Running`]), so killing it ends everything it started (saga
//! drivers, connections, its pool) at once, as `kill -9` ends a process, and
//! it can be started again on the same database and port.

pub mod auth;
pub mod faults;
pub mod operations;
pub mod processes;

use futures::future::BoxFuture;
use reqwest::StatusCode;
use sagaworks_config::{KafkaSettings, ListenSettings};
use sagaworks_resilience::ClientSettings;
use sagaworks_test_support::{Broker, TestDatabase};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What the helpers need of a service's `startup::Application`.
pub trait App: Sized + Send + 'static {
    type Settings: Clone + Send + 'static;
    type Error: std::fmt::Debug + Send + 'static;
    fn build(settings: Self::Settings) -> BoxFuture<'static, Result<Self, Self::Error>>;
    /// gRPC and HTTP ports (the gateway has no gRPC port: 0).
    fn ports(&self) -> (u16, u16);
    /// Serves until `stop` is cancelled.
    fn run(self, stop: CancellationToken) -> BoxFuture<'static, ()>;
}

macro_rules! app {
    ($service:ident, |$app:ident| $ports:expr, |$stop:ident| $run:expr) => {
        impl App for $service::startup::Application {
            type Settings = $service::config::Settings;
            type Error = $service::startup::StartupError;
            fn build(settings: Self::Settings) -> BoxFuture<'static, Result<Self, Self::Error>> {
                Box::pin(Self::build(settings))
            }
            fn ports(&self) -> (u16, u16) {
                let $app = self;
                $ports
            }
            fn run(self, $stop: CancellationToken) -> BoxFuture<'static, ()> {
                let $app = self;
                Box::pin(async move { $run })
            }
        }
    };
}

app!(inventory, |app| (app.grpc_port(), app.http_port()), |stop| {
    app.run_until_stopped(stop).await.expect("inventory runs")
});
app!(payment, |app| (app.grpc_port(), app.http_port()), |stop| {
    app.run_until_stopped(stop).await.expect("payment runs")
});
// A crashed (fault-injected) replica may be killed at any point.
app!(order, |app| (app.grpc_port(), app.http_port()), |stop| {
    let _ = app.run_until_stopped(stop).await;
});
app!(gateway, |app| (0, app.port()), |stop| app.run_until_stopped(stop).await.expect("gateway runs"));

/// A service running on a Tokio runtime of its own, as in a process of its own.
pub struct Running {
    token: CancellationToken,
    task: Option<JoinHandle<()>>,
    runtime: Option<tokio::runtime::Runtime>,
    pub grpc_port: u16,
    pub http_port: u16,
}

impl Running {
    /// Builds (connects, migrates, binds) and runs `A` on a runtime of its own.
    pub async fn start<A: App>(settings: A::Settings) -> Result<Self, A::Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("service")
            .enable_all()
            .build()
            .expect("a runtime for the service");
        let app = match runtime.spawn(A::build(settings)).await.expect("start-up does not panic") {
            Ok(app) => app,
            Err(e) => {
                runtime.shutdown_background();
                return Err(e);
            }
        };
        let (grpc_port, http_port) = app.ports();
        let token = CancellationToken::new();
        let task = runtime.spawn(app.run(token.clone()));
        Ok(Self { token, task: Some(task), runtime: Some(runtime), grpc_port, http_port })
    }

    /// Like [`Running::start`], retrying while the port of a service that was
    /// just killed is still taken.
    pub async fn start_on_same_port<A: App>(what: &str, settings: A::Settings) -> Self {
        let mut last = None;
        for _ in 0..50 {
            match Self::start::<A>(settings.clone()).await {
                Ok(running) => return running,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what} did not start again on its port: {last:?}");
    }

    /// Stops dead, like `kill -9`: the service's runtime goes, and with it
    /// every task it spawned (saga drivers, connections, its pool): no
    /// draining, leases stay held, open transactions roll back.
    pub fn kill(&mut self) {
        self.task.take();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Graceful shutdown.
    pub async fn stop(&mut self) {
        self.token.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        self.kill();
    }

    pub fn grpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

fn local(port: u16) -> ListenSettings {
    ListenSettings::new("127.0.0.1", port)
}

/// Fast-failing client settings for tests.
pub fn client(url: &str) -> ClientSettings {
    let mut c = ClientSettings::with_url(url);
    c.timeout_ms = 1_000;
    c
}

pub async fn start_inventory(db: &TestDatabase, kafka: &KafkaSettings, grpc_port: u16) -> Running {
    let settings = inventory::config::Settings {
        grpc: local(grpc_port),
        http: local(0),
        database: db.settings(),
        kafka: kafka.clone(),
        ..Default::default()
    };
    Running::start::<inventory::startup::Application>(settings).await.expect("inventory starts")
}

pub async fn start_payment(db: &TestDatabase, kafka: &KafkaSettings, grpc_port: u16) -> Running {
    let settings = payment::config::Settings {
        grpc: local(grpc_port),
        http: local(0),
        database: db.settings(),
        kafka: kafka.clone(),
        ..Default::default()
    };
    Running::start::<payment::startup::Application>(settings).await.expect("payment starts")
}

/// Order settings for tests: short leases and polls so resumption is quick.
pub fn order_settings(
    db: &TestDatabase,
    kafka: &KafkaSettings,
    inventory_url: &str,
    payment_url: &str,
) -> order::config::Settings {
    let mut s = order::config::Settings {
        grpc: local(0),
        http: local(0),
        database: db.settings(),
        kafka: kafka.clone(),
        inventory: client(inventory_url),
        payment: client(payment_url),
        ..Default::default()
    };
    // Longer than a step's worst case here (3 attempts of 1 s), so a live
    // driver never loses its lease; short enough for quick resumption.
    s.saga.lease_ms = 4_000;
    s.saga.poll_interval_ms = 100;
    s.saga.retry_base_ms = 20;
    s.saga.retry_max_ms = 200;
    s.saga.max_wait_ms = 10_000;
    s
}

pub async fn start_order(settings: order::config::Settings) -> Running {
    Running::start::<order::startup::Application>(settings).await.expect("order starts")
}

/// Gateway settings for tests, with test auth ([`auth::use_test_auth`]).
pub fn gateway_settings(
    order_url: &str,
    inventory_url: &str,
    payment_url: &str,
) -> gateway::config::Settings {
    let mut order = client(order_url);
    // CreateOrder waits for the saga (up to `api.order_wait_ms`).
    order.routes.insert("CreateOrder".into(), 15_000);
    let mut settings = gateway::config::Settings {
        http: local(0),
        order,
        inventory: client(inventory_url),
        payment: client(payment_url),
        ..Default::default()
    };
    auth::use_test_auth(&mut settings);
    settings
}

pub async fn start_gateway(order_url: &str, inventory_url: &str, payment_url: &str) -> Running {
    start_gateway_with(gateway_settings(order_url, inventory_url, payment_url)).await
}

pub async fn start_gateway_with(settings: gateway::config::Settings) -> Running {
    Running::start::<gateway::startup::Application>(settings).await.expect("gateway starts")
}

/// The whole system.
pub struct Stack {
    pub broker: Broker,
    pub kafka: KafkaSettings,
    pub order_db: TestDatabase,
    pub inventory_db: TestDatabase,
    pub payment_db: TestDatabase,
    pub inventory: Running,
    pub payment: Running,
    pub order: Running,
    pub gateway: Running,
    pub http: reqwest::Client,
}

impl Stack {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Starts everything, letting `tweak` adjust the order service's settings.
    pub async fn start_with(tweak: impl FnOnce(&mut order::config::Settings)) -> Self {
        sagaworks_test_support::init_logs();
        sagaworks_test_support::watch_runtime();
        let (order_db, inventory_db, payment_db) = tokio::join!(
            TestDatabase::create("order"),
            TestDatabase::create("inventory"),
            TestDatabase::create("payment")
        );
        let broker = Broker::start().await;
        let kafka = broker.kafka_settings();
        let inventory = start_inventory(&inventory_db, &kafka, 0).await;
        let payment = start_payment(&payment_db, &kafka, 0).await;
        let mut settings = order_settings(&order_db, &kafka, &inventory.grpc_url(), &payment.grpc_url());
        tweak(&mut settings);
        let order = start_order(settings).await;
        let gateway = start_gateway(&order.grpc_url(), &inventory.grpc_url(), &payment.grpc_url()).await;
        // Calls carry an admin token unless they set their own Authorization header.
        let mut headers = reqwest::header::HeaderMap::new();
        let bearer = format!("Bearer {}", auth::admin_token());
        headers.insert(reqwest::header::AUTHORIZATION, bearer.parse().expect("header value"));
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .default_headers(headers)
            .build()
            .unwrap();
        Self { broker, kafka, order_db, inventory_db, payment_db, inventory, payment, order, gateway, http }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.gateway.http_port)
    }

    /// Replaces the order service (after a kill) with a fresh one on the same
    /// database and port.
    pub async fn restart_order(&mut self, tweak: impl FnOnce(&mut order::config::Settings)) {
        self.order.kill();
        let mut settings =
            order_settings(&self.order_db, &self.kafka, &self.inventory.grpc_url(), &self.payment.grpc_url());
        settings.grpc.port = self.order.grpc_port;
        tweak(&mut settings);
        self.order = Running::start_on_same_port::<order::startup::Application>("order", settings).await;
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let res = self.http.post(self.url(path)).json(&body).send().await.expect("gateway answers");
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let res = self.http.get(self.url(path)).send().await.expect("gateway answers");
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    /// Creates a product; returns its id.
    pub async fn product(&self, price_cents: i64, stock: i64) -> String {
        let sku = format!("sku-{}", uuid::Uuid::new_v4().simple());
        let body =
            json!({ "sku": sku, "name": "Widget", "price_cents": price_cents, "initial_stock": stock });
        let (status, p) = self.post("/v1/products", body).await;
        assert_eq!(status, StatusCode::CREATED, "{p}");
        p["id"].as_str().unwrap().to_string()
    }

    /// Opens a customer account; returns its id.
    pub async fn customer(&self, credit_cents: i64) -> String {
        let body = json!({ "name": "Ada", "initial_credit_cents": credit_cents });
        let (status, c) = self.post("/v1/customers", body).await;
        assert_eq!(status, StatusCode::CREATED, "{c}");
        c["customer_id"].as_str().unwrap().to_string()
    }

    /// Places an order as the customer (with the customer's own token).
    pub async fn place(&self, customer: &str, product: &str, quantity: i64) -> (StatusCode, Value) {
        let body =
            json!({ "customer_id": customer, "items": [{ "product_id": product, "quantity": quantity }] });
        let req =
            self.http.post(self.url("/v1/orders")).bearer_auth(auth::customer_token(customer)).json(&body);
        let res = req.send().await.expect("gateway answers");
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    pub async fn stock(&self, product: &str) -> (i64, i64, i64) {
        let (status, p) = self.get(&format!("/v1/products/{product}")).await;
        assert_eq!(status, StatusCode::OK, "{p}");
        (p["available"].as_i64().unwrap(), p["reserved"].as_i64().unwrap(), p["sold"].as_i64().unwrap())
    }

    pub async fn balance(&self, customer: &str) -> i64 {
        let (status, c) = self.get(&format!("/v1/customers/{customer}")).await;
        assert_eq!(status, StatusCode::OK, "{c}");
        c["balance_cents"].as_i64().unwrap()
    }

    /// Waits until the order is CONFIRMED or CANCELLED; returns it.
    pub async fn settled(&self, order_id: &str) -> Value {
        sagaworks_test_support::eventually("order to settle", Duration::from_secs(40), || async {
            let (_, o) = self.get(&format!("/v1/orders/{order_id}")).await;
            matches!(o["status"].as_str(), Some("CONFIRMED" | "CANCELLED")).then_some(o)
        })
        .await
    }
}

/// A server that accepts connections and never answers (a hung participant):
/// its URL, and the task holding the connections open.
pub async fn unanswering_server() -> (String, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let url = format!("http://{}", listener.local_addr().expect("a bound address"));
    let held = tokio::spawn(async move {
        let mut conns = vec![];
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c);
        }
    });
    (url, held)
}

/// Points order's payment client at `url` (e.g. an [`unanswering_server`]),
/// with a short per-attempt timeout.
pub fn payment_at(settings: &mut order::config::Settings, url: &str) {
    settings.payment = client(url);
    settings.payment.timeout_ms = 300;
}

/// The saga's step names in the order they ran, with their statuses.
pub fn steps(order: &Value) -> Vec<(String, String)> {
    order["saga"]["steps"]
        .as_array()
        .map(|s| {
            s.iter()
                .map(|st| {
                    (st["name"].as_str().unwrap().to_string(), st["status"].as_str().unwrap().to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}
