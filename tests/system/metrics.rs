//! RED metrics of the real binaries: after real traffic, each service's own
//! `/metrics` counts its requests per HTTP route (the matched template, not
//! the raw path) and per gRPC method, server and client side, with the
//! status.
//!
//! Needs the service binaries built (`cargo build --workspace`, which
//! `scripts/test` does first).

use reqwest::StatusCode;
use serde_json::{Value, json};
use system_tests::auth::customer_token;
use system_tests::processes::{ProcessStack, ServiceProcess};

/// The value of the sample `name{labels}` in `metrics` (labels in any order),
/// if there is one.
fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metrics.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
        let wanted = metric == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        if wanted { value.parse().ok() } else { None }
    })
}

async fn metrics_of(system: &ProcessStack, service: &ServiceProcess) -> String {
    let url = format!("http://127.0.0.1:{}/metrics", service.http_port);
    let res = system.http.get(url).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.text().await.unwrap()
}

fn count(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let count = format!("{name}_count");
    sample(metrics, &count, labels).unwrap_or_else(|| panic!("no {count}{labels:?} in\n{metrics}"))
}

#[tokio::test]
async fn every_service_counts_its_requests_per_route_and_method_with_their_status() {
    let system = ProcessStack::start(&[]).await;
    let sku = format!("sku-{}", uuid::Uuid::new_v4().simple());
    let product = json!({ "sku": sku, "name": "Widget", "price_cents": 250, "initial_stock": 10 });
    let res = system.http.post(system.url("/v1/products")).json(&product).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let product: Value = res.json().await.unwrap();
    let customer = json!({ "name": "Ada", "initial_credit_cents": 10_000 });
    let res = system.http.post(system.url("/v1/customers")).json(&customer).send().await.unwrap();
    let customer: Value = res.json().await.unwrap();
    let customer = customer["customer_id"].as_str().unwrap();
    let body = json!({ "customer_id": customer, "items": [{ "product_id": product["id"], "quantity": 2 }] });
    let res = system
        .http
        .post(system.url("/v1/orders"))
        .bearer_auth(customer_token(customer))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    // Two reads of unknown orders: one series (the route's template), status 404.
    for _ in 0..2 {
        let res = system
            .http
            .get(system.url(&format!("/v1/orders/{}", uuid::Uuid::new_v4())))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
    }

    // Invented methods, before any authentication: one `_OTHER` series, not one per method.
    for invented in ["FOO", "BAR"] {
        let method = reqwest::Method::from_bytes(invented.as_bytes()).unwrap();
        let res = system.http.request(method, system.url("/v1/orders")).send().await.unwrap();
        assert!(res.status().is_client_error(), "{invented}: {}", res.status());
    }

    let gateway = metrics_of(&system, &system.gateway).await;
    let http = "http_server_request_duration_seconds";
    let other = [("service", "gateway"), ("method", "_OTHER"), ("route", "/v1/orders")];
    assert_eq!(count(&gateway, http, &other), 2.0, "{gateway}");
    assert!(
        !gateway.contains("method=\"FOO\"") && !gateway.contains("method=\"BAR\""),
        "no series per invented method"
    );
    let post_orders =
        [("service", "gateway"), ("method", "POST"), ("route", "/v1/orders"), ("status", "201")];
    assert_eq!(count(&gateway, http, &post_orders), 1.0);
    let get_order =
        [("service", "gateway"), ("method", "GET"), ("route", "/v1/orders/{order_id}"), ("status", "404")];
    assert_eq!(count(&gateway, http, &get_order), 2.0);
    assert!(!gateway.contains("route=\"/v1/orders/0"), "raw paths are no label values");
    let order_client = "sagaworks.order.v1.OrderService";
    let create = [
        ("service", "gateway"),
        ("rpc_service", order_client),
        ("rpc_method", "CreateOrder"),
        ("code", "OK"),
    ];
    assert_eq!(count(&gateway, "rpc_client_duration_seconds", &create), 1.0);
    let not_found = [
        ("service", "gateway"),
        ("rpc_service", order_client),
        ("rpc_method", "GetOrder"),
        ("code", "NOT_FOUND"),
    ];
    assert_eq!(count(&gateway, "rpc_client_duration_seconds", &not_found), 2.0);

    let order = metrics_of(&system, &system.order).await;
    let served =
        [("service", "order"), ("rpc_service", order_client), ("rpc_method", "CreateOrder"), ("code", "OK")];
    assert_eq!(count(&order, "rpc_server_duration_seconds", &served), 1.0);
    let reserve = [
        ("service", "order"),
        ("rpc_service", "sagaworks.inventory.v1.InventoryService"),
        ("rpc_method", "ReserveStock"),
        ("code", "OK"),
    ];
    assert!(count(&order, "rpc_client_duration_seconds", &reserve) >= 1.0);

    let inventory = metrics_of(&system, &system.inventory).await;
    let reserved = [
        ("service", "inventory"),
        ("rpc_service", "sagaworks.inventory.v1.InventoryService"),
        ("rpc_method", "ReserveStock"),
        ("code", "OK"),
    ];
    assert!(count(&inventory, "rpc_server_duration_seconds", &reserved) >= 1.0);
    assert!(sample(&inventory, "rpc_server_duration_seconds_count", &[("service", "order")]).is_none());

    let payment = metrics_of(&system, &system.payment).await;
    let charged = [
        ("service", "payment"),
        ("rpc_service", "sagaworks.payment.v1.PaymentService"),
        ("rpc_method", "Charge"),
        ("code", "OK"),
    ];
    assert!(count(&payment, "rpc_server_duration_seconds", &charged) >= 1.0);
    system.stop().await;
}
