//! Shared helpers of the system tests: the whole system in one process.
//!
//! [`Stack::start`] runs inventory, payment, order and the gateway as real
//! servers on free local ports, each service with a fresh database of its
//! own on the local PostgreSQL server. Each service runs on a Tokio runtime
//! of its own ([`Running`], from `sagaworks_test_support`), so killing it ends
//! everything it started (saga drivers, connections, its pool) at once, as
//! `kill -9` ends a process, and it can be started again on the same database
//! and port.

pub mod auth;
pub mod faults;
pub mod operations;
pub mod processes;
pub mod services;

use reqwest::StatusCode;
use sagaworks_config::{KafkaSettings, ListenSettings};
use sagaworks_resilience::ClientSettings;
pub use sagaworks_test_support::{App, Running};
use sagaworks_test_support::{Broker, TestDatabase, certs};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The services' applications as [`App`]s ([`Running`] comes from
/// `sagaworks_test_support`; a newtype each, as the orphan rule requires).
macro_rules! app {
    ($name:ident, $service:ident, |$app:ident| $ports:expr, |$stop:ident| $run:expr) => {
        pub struct $name($service::startup::Application);

        impl App for $name {
            type Settings = $service::config::Settings;
            type Error = $service::startup::StartupError;
            async fn build(settings: Self::Settings) -> Result<Self, Self::Error> {
                $service::startup::Application::build(settings).await.map($name)
            }
            fn ports(&self) -> (u16, u16) {
                let $app = &self.0;
                $ports
            }
            async fn run(self, $stop: CancellationToken) {
                let $app = self.0;
                $run
            }
        }
    };
}

app!(Inventory, inventory, |app| (app.grpc_port(), app.http_port()), |stop| {
    app.run_until_stopped(stop).await.expect("inventory runs")
});
app!(Payment, payment, |app| (app.grpc_port(), app.http_port()), |stop| {
    app.run_until_stopped(stop).await.expect("payment runs")
});
// A crashed (fault-injected) replica may be killed at any point.
app!(Order, order, |app| (app.grpc_port(), app.http_port()), |stop| {
    let _ = app.run_until_stopped(stop).await;
});
app!(Gateway, gateway, |app| (0, app.port()), |stop| app
    .run_until_stopped(stop)
    .await
    .expect("gateway runs"));

fn local(port: u16) -> ListenSettings {
    ListenSettings::new("127.0.0.1", port)
}

/// A plain tonic channel to the service `downstream` at `url` that shows the
/// certificate of `caller` (issued by the test CA, [`certs::tls`]): the test calls as
/// that service would, or as an identity no allow-list names.
pub async fn channel_as(caller: &str, downstream: &str, url: &str) -> tonic::transport::Channel {
    let identity = sagaworks_mtls::Identity::load(&certs::tls(caller), caller)
        .expect("the test certificate loads")
        .expect("TLS is configured");
    tonic::transport::Endpoint::from_shared(url.to_owned())
        .expect("a valid URL")
        .tls_config(identity.client_tls(downstream))
        .expect("a TLS configuration")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{caller} connects to {downstream} at {url}: {e:?}"))
}

/// Fast-failing client settings for tests.
pub fn client(url: &str) -> ClientSettings {
    let mut c = ClientSettings::with_url(url);
    c.timeout_ms = 1_000;
    c
}

pub async fn start_inventory(db: &TestDatabase, kafka: &KafkaSettings, grpc_port: u16) -> Running {
    let settings = inventory::config::Settings {
        tls: certs::tls("inventory"),
        grpc: local(grpc_port),
        http: local(0),
        database: db.settings(),
        kafka: kafka.clone(),
        ..Default::default()
    };
    Running::start::<Inventory>(settings).await.expect("inventory starts")
}

pub async fn start_payment(db: &TestDatabase, kafka: &KafkaSettings, grpc_port: u16) -> Running {
    let settings = payment::config::Settings {
        tls: certs::tls("payment"),
        grpc: local(grpc_port),
        http: local(0),
        database: db.settings(),
        kafka: kafka.clone(),
        ..Default::default()
    };
    Running::start::<Payment>(settings).await.expect("payment starts")
}

/// Calls from order to inventory and payment that may take 10 s, for tests that start many
/// sagas or several replicas at once: on a busy machine those calls can take longer than
/// [`client`]'s 1 s, and timed-out calls open the caller's circuit breaker, which cancels
/// orders (the order saga's steps have one attempt). For the tests that are not about that.
pub fn patient_calls(settings: &mut order::config::Settings) {
    for client in [&mut settings.inventory, &mut settings.payment] {
        client.timeout_ms = 10_000;
        client.breaker.slow_call_duration_ms = 10_000;
    }
}

/// Order settings for tests: short leases and polls so resumption is quick.
pub fn order_settings(
    db: &TestDatabase,
    kafka: &KafkaSettings,
    inventory_url: &str,
    payment_url: &str,
) -> order::config::Settings {
    let mut s = order::config::Settings {
        tls: certs::tls("order"),
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
    Running::start::<Order>(settings).await.expect("order starts")
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
        tls: certs::tls("gateway"),
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
    Running::start::<Gateway>(settings).await.expect("gateway starts")
}

/// The whole system.
pub struct Stack {
    pub broker: Broker,
    /// The stack's topic prefix, logged in as `admin` (the test's own clients); each
    /// service logs in as its own user ([`Stack::kafka_for`]).
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
        Self::start_on(Broker::start().await, tweak).await
    }

    /// Starts everything on `broker` (e.g. [`Broker::private`], for a test that
    /// stops it), letting `tweak` adjust the order service's settings.
    pub async fn start_on(broker: Broker, tweak: impl FnOnce(&mut order::config::Settings)) -> Self {
        sagaworks_test_support::init_logs();
        sagaworks_test_support::watch_runtime();
        let (order_db, inventory_db, payment_db) = tokio::join!(
            TestDatabase::create("order"),
            TestDatabase::create("inventory"),
            TestDatabase::create("payment")
        );
        let kafka = broker.kafka_settings();
        let inventory = start_inventory(&inventory_db, &broker.login(&kafka, "inventory"), 0).await;
        let payment = start_payment(&payment_db, &broker.login(&kafka, "payment"), 0).await;
        let mut settings = order_settings(
            &order_db,
            &broker.login(&kafka, "order"),
            &inventory.grpc_url(),
            &payment.grpc_url(),
        );
        tweak(&mut settings);
        let order = start_order(settings).await;
        let gateway = start_gateway(&order.grpc_url(), &inventory.grpc_url(), &payment.grpc_url()).await;
        // The relays delete what they published: a test reads what was written
        // from the ledger (`outbox_ledger`), installed before anything is.
        for db in [&order_db, &inventory_db, &payment_db] {
            sagaworks_outbox::ledger::install(&db.pool().await).await.expect("the outbox ledger");
        }
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

    /// [`Self::kafka`] logged in as `service`'s own Kafka user.
    pub fn kafka_for(&self, service: &str) -> KafkaSettings {
        self.broker.login(&self.kafka, service)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.gateway.http_port)
    }

    /// Replaces the order service (after a kill) with a fresh one on the same
    /// database and port.
    pub async fn restart_order(&mut self, tweak: impl FnOnce(&mut order::config::Settings)) {
        self.order.kill();
        let mut settings = order_settings(
            &self.order_db,
            &self.kafka_for("order"),
            &self.inventory.grpc_url(),
            &self.payment.grpc_url(),
        );
        settings.grpc.port = self.order.grpc_port;
        tweak(&mut settings);
        self.order = Running::start_on_same_port::<Order>("order", settings).await;
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
    // https: the caller's TLS handshake is what never gets an answer.
    let url = format!("https://{}", listener.local_addr().expect("a bound address"));
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

/// The order saga's charge, and every later call to payment, sent to `url` (e.g.
/// [`unanswering_server`]): on version 1, whose first call to payment is the charge.
/// Version 2 calls payment first in `check_account`, which would end the saga before the
/// charge (the fault matrix covers that: `check_account::deadline_passed`). Goes with
/// version 1's code (docs/known-issues.md).
pub fn charges_at_on_v1(settings: &mut order::config::Settings, url: &str) {
    payment_at(settings, url);
    settings.saga.start_version = 1;
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
