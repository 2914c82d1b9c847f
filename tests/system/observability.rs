//! A real Prometheus (Debian's `prometheus` package) scrapes the four real
//! service binaries while they serve traffic, and evaluates the alert rules
//! (`deploy/observability/prometheus/alerts.yml`). Every metric that a
//! Grafana dashboard or an alert queries must then exist with data, and every
//! rule must evaluate without error: no panel or alert on a metric name that
//! does not exist.
//!
//! Needs the service binaries built (`cargo build --workspace`, which
//! `scripts/test` does first) and `prometheus` on PATH (`scripts/install-deps`).

use reqwest::StatusCode;
use sagaworks_test_support::{eventually, free_port};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use system_tests::auth::customer_token;
use system_tests::processes::{ProcessStack, ServiceProcess};

const WAIT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A Prometheus server scraping `targets` (job name, HTTP port) every second.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start(targets: &[(&str, u16)]) -> Self {
        let dir = std::env::temp_dir().join(format!("sw-prometheus-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let rules = repo().join("deploy/observability/prometheus/alerts.yml").canonicalize().unwrap();
        let jobs: String = targets
            .iter()
            .map(|(job, port)| {
                format!("  - job_name: {job}\n    static_configs:\n      - targets: [\"127.0.0.1:{port}\"]\n")
            })
            .collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\nscrape_configs:\n{jobs}",
            rules.display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start prometheus ({e}): run scripts/install-deps"));
        Self { child, port, dir }
    }

    /// `GET /api/v1/<path>`'s `data`.
    async fn api(&self, http: &reqwest::Client, path: &str, query: &[(&str, &str)]) -> Option<Value> {
        let url = format!("http://127.0.0.1:{}/api/v1/{path}", self.port);
        let res = http.get(url).query(query).send().await.ok()?;
        let body: Value = res.json().await.ok()?;
        (body["status"] == "success").then(|| body["data"].clone())
    }

    /// The number of series of `query` (an instant vector) now.
    async fn series(&self, http: &reqwest::Client, query: &str) -> usize {
        let data = self.api(http, "query", &[("query", query)]).await.unwrap_or(Value::Null);
        data["result"].as_array().map_or(0, Vec::len)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The metric names the dashboards and the alert rules query (the checker's
/// list, `_bucket`/`_count`/`_sum` removed).
fn queried_metrics() -> Vec<String> {
    let root = repo();
    let out = Command::new("python3")
        .current_dir(&root)
        .args([
            "deploy/observability/check-dashboards.py",
            "--rules",
            "deploy/observability/prometheus/alerts.yml",
        ])
        .arg("deploy/observability/grafana/dashboards")
        .output()
        .expect("python3 runs the dashboards checker");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    assert!(names.len() >= 20, "the checker lists the queried metrics: {names:?}");
    names
}

async fn post(system: &ProcessStack, path: &str, body: Value) -> Value {
    let res = system.http.post(system.url(path)).json(&body).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED, "{path}");
    res.json().await.unwrap()
}

/// Places an order of one unit; its status.
async fn place(system: &ProcessStack, customer: &str, product: &str) -> StatusCode {
    let body = json!({ "customer_id": customer, "items": [{ "product_id": product, "quantity": 1 }] });
    let req = system.http.post(system.url("/v1/orders")).bearer_auth(customer_token(customer)).json(&body);
    req.send().await.unwrap().status()
}

async fn fault(system: &ProcessStack, service: &ServiceProcess, rule: Option<Value>) {
    let url = format!("http://127.0.0.1:{}/fault", service.http_port);
    let res = match rule {
        Some(rule) => system.http.put(url).json(&rule).send().await.unwrap(),
        None => system.http.delete(url).send().await.unwrap(),
    };
    assert!(res.status().is_success(), "{}", res.status());
}

/// A message without the CloudEvents headers: both groups of the `order` topic park it.
async fn poison(system: &ProcessStack) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer =
        sagaworks_outbox::kafka::client_config(&system.kafka, &[]).create().unwrap();
    let topic = sagaworks_outbox::kafka::topic_name(&system.kafka, "order");
    let record = FutureRecord::to(&topic).key("poison").payload("not an event");
    producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).expect("sent");
    sagaworks_outbox::kafka::close(producer, "test-producer", Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_real_prometheus_finds_every_metric_the_dashboards_and_alerts_query() {
    let system = ProcessStack::start(&[
        ("APP_FAULT__ENABLED", "true"),
        ("APP_DEAD_LETTERS__GAUGE_INTERVAL_MS", "500"),
        ("APP_CONSUMER__LAG_INTERVAL_MS", "500"),
    ])
    .await;
    let prometheus = Prometheus::start(&[
        ("gateway", system.gateway.http_port),
        ("order", system.order.http_port),
        ("inventory", system.inventory.http_port),
        ("payment", system.payment.http_port),
    ]);

    // Traffic of every kind: confirmed and cancelled orders, a participant
    // failing for a while (retries, injected faults), a poison message (DLQ).
    let sku = format!("sku-{}", uuid::Uuid::new_v4().simple());
    let product = post(
        &system,
        "/v1/products",
        json!({ "sku": sku, "name": "W", "price_cents": 100, "initial_stock": 50 }),
    )
    .await;
    let product = product["id"].as_str().unwrap().to_string();
    let rich = post(&system, "/v1/customers", json!({ "name": "Ada", "initial_credit_cents": 10_000 })).await;
    let rich = rich["customer_id"].as_str().unwrap().to_string();
    let poor = post(&system, "/v1/customers", json!({ "name": "Bob", "initial_credit_cents": 1 })).await;
    let poor = poor["customer_id"].as_str().unwrap().to_string();
    for _ in 0..3 {
        assert_eq!(place(&system, &rich, &product).await, StatusCode::CREATED);
    }
    assert_eq!(place(&system, &poor, &product).await, StatusCode::CREATED);
    fault(
        &system,
        &system.payment,
        Some(json!({ "error": "unavailable", "error_rate": 1.0, "methods": ["Charge"] })),
    )
    .await;
    // Answered whether or not its saga has ended by then.
    assert!(place(&system, &rich, &product).await.is_success());
    fault(&system, &system.payment, None).await;
    poison(&system).await;

    let http = reqwest::Client::new();
    eventually("prometheus scraping all four services", WAIT, || async {
        (prometheus.series(&http, "up == 1").await == 4).then_some(())
    })
    .await;
    // Polled (gauges refresh on their own intervals), with an overall deadline.
    let wanted = queried_metrics();
    let deadline = std::time::Instant::now() + WAIT;
    let missing = loop {
        let mut missing = Vec::new();
        for name in &wanted {
            let query = format!(r#"count({{__name__=~"{name}|{name}_bucket|{name}_count"}})"#);
            if prometheus.series(&http, &query).await == 0 {
                missing.push(name.clone());
            }
        }
        if missing.is_empty() || std::time::Instant::now() > deadline {
            break missing;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(missing.is_empty(), "queried by a dashboard or an alert, but not scraped: {missing:?}");

    // Every alert rule is loaded and evaluates without error.
    let rules = eventually("every alert rule evaluated", WAIT, || async {
        let data = prometheus.api(&http, "rules", &[]).await?;
        let rules: Vec<Value> = data["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated =
            rules.iter().all(|r| r["lastEvaluation"].as_str().is_some_and(|t| !t.starts_with("0001")));
        (!rules.is_empty() && evaluated).then_some(rules)
    })
    .await;
    assert_eq!(rules.len(), 9, "{rules:?}");
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{}: {}", rule["name"], rule["lastError"]);
    }
    system.stop().await;
}
