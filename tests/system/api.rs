//! The REST surface: validation, problem+json, OpenAPI, health.

use reqwest::StatusCode;
use sagaworks_test_support::Broker;
use serde_json::{Value, json};
use sqlx::AssertSqlSafe;
use system_tests::Stack;

#[tokio::test]
async fn invalid_input_is_a_problem_naming_the_field() {
    let stack = Stack::start().await;
    let product = stack.product(100, 10).await;
    let customer = stack.customer(1_000).await;

    let cases = [
        (
            json!({ "customer_id": "nope", "items": [{ "product_id": product, "quantity": 1 }] }),
            "customer_id",
        ),
        (json!({ "customer_id": customer, "items": [] }), "items"),
        (
            json!({ "customer_id": customer, "items": [{ "product_id": product, "quantity": 0 }] }),
            "items[0].quantity",
        ),
        (
            json!({ "customer_id": customer, "items": [{ "product_id": product, "quantity": "1" }] }),
            "items[0].quantity",
        ),
        (json!({ "customer_id": customer }), "body"),
        // An unknown field in an otherwise valid order is refused, and named.
        (
            json!({ "customer_id": customer, "items": [{ "product_id": product, "quantity": 1 }], "coupon": "FREE" }),
            "coupon",
        ),
    ];
    for (body, field) in cases {
        let res = stack.http.post(stack.url("/v1/orders")).json(&body).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        let problem: serde_json::Value = res.json().await.unwrap();
        assert_eq!(problem["status"], 422);
        let named = problem["errors"][0]["field"].as_str().unwrap_or_default();
        assert!(named.starts_with(field) || (field == "body" && !named.is_empty()), "{body} -> {problem}");
    }

    let res = stack
        .http
        .post(stack.url("/v1/orders"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let res = stack.http.post(stack.url("/v1/orders")).body("{}").send().await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST, "no JSON content type");
    let res = stack
        .http
        .post(stack.url("/v1/orders"))
        .header("content-type", "application/json")
        .body(vec![b' '; 200_000])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);

    // A list limit outside what the document says (1 to 500) is refused, not clamped.
    for limit in ["0", "501", "2147483648"] {
        let (status, problem) = stack.get(&format!("/v1/orders?customer_id={customer}&limit={limit}")).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "limit={limit}: {problem}");
        assert_eq!(problem["errors"][0]["field"], "limit", "{problem}");
    }
    let (status, _) = stack.get(&format!("/v1/orders?customer_id={customer}&limit=500")).await;
    assert_eq!(status, StatusCode::OK);

    // Nothing was accepted along the way.
    assert_eq!(stack.stock(&product).await, (10, 0, 0));
}

#[tokio::test]
async fn unknown_ids_are_404_and_unknown_routes_too() {
    let stack = Stack::start().await;
    let missing = uuid::Uuid::new_v4();
    for path in [
        format!("/v1/orders/{missing}"),
        format!("/v1/sagas/{missing}"),
        format!("/v1/products/{missing}"),
        format!("/v1/customers/{missing}"),
        "/v2/nothing".into(),
    ] {
        let res = stack.http.get(stack.url(&path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
    }
    let (status, _) = stack.get("/v1/orders/not-a-uuid").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, p) = stack.get("/v1/orders").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "customer_id is required: {p}");
}

#[tokio::test]
async fn downstream_unavailable_is_503_with_retry_after() {
    let mut stack = Stack::start().await;
    let customer = stack.customer(1_000).await;
    let product = stack.product(100, 10).await;
    stack.order.kill();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let res = stack
        .http
        .post(stack.url("/v1/orders"))
        .json(&json!({ "customer_id": customer, "items": [{ "product_id": product, "quantity": 1 }] }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(res.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn openapi_document_describes_every_route() {
    let stack = Stack::start().await;
    let (status, doc) = stack.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/orders",
        "/v1/orders/{order_id}",
        "/v1/sagas/{saga_id}",
        "/v1/products",
        "/v1/customers/{customer_id}/credit",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} missing from the document");
    }
    assert!(doc["components"]["schemas"].get("Order").is_some());

    // The API explorer: Swagger UI's page and its files (vendored in the crate), pointed at the document.
    let page = stack.http.get(stack.url("/docs/")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("swagger-ui"), "Swagger UI's page");
    let init = stack.http.get(stack.url("/docs/swagger-initializer.js")).send().await.unwrap();
    assert_eq!(init.status(), StatusCode::OK);
    assert!(
        init.text().await.unwrap().contains("/openapi.json"),
        "the explorer loads the gateway's document"
    );
}

#[tokio::test]
async fn readiness_follows_the_database() {
    let stack = Stack::start().await;
    // GET one of inventory's health routes.
    let health = |route: &'static str| {
        let (http, port) = (stack.http.clone(), stack.inventory.http_port);
        async move { http.get(format!("http://127.0.0.1:{port}/health/{route}")).send().await.unwrap() }
    };
    let res = health("ready").await;
    assert_eq!(res.status(), StatusCode::OK);
    let live = health("live").await;
    assert_eq!(live.status(), StatusCode::OK);

    // Take inventory's database away: connections are terminated and new ones refused.
    let admin = sqlx::PgPool::connect(&sagaworks_test_support::TestDatabase::admin_url()).await.unwrap();
    let db = &stack.inventory_db.name;
    sqlx::query(AssertSqlSafe(format!(r#"ALTER DATABASE "{db}" WITH ALLOW_CONNECTIONS false"#)))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(db)
        .execute(&admin)
        .await
        .unwrap();
    let res = health("ready").await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = res.json().await.unwrap();
    assert!(body["checks"]["database"]["error"].is_string(), "{body}");
    let live = health("live").await;
    assert_eq!(live.status(), StatusCode::OK, "still live");

    sqlx::query(AssertSqlSafe(format!(r#"ALTER DATABASE "{db}" WITH ALLOW_CONNECTIONS true"#)))
        .execute(&admin)
        .await
        .unwrap();
    sagaworks_test_support::eventually("ready again", std::time::Duration::from_secs(10), || async {
        (health("ready").await.status() == StatusCode::OK).then_some(())
    })
    .await;
}

/// Every admin write takes an `Idempotency-Key`: a repeat changes nothing and
/// answers what the first request did; the same key with another body is a
/// 422; the same key on another endpoint is another request.
#[tokio::test]
async fn admin_writes_with_the_same_idempotency_key_take_effect_once() {
    let stack = Stack::start().await;
    let post = |path: String, key: &'static str, body: serde_json::Value| {
        let req = stack.http.post(stack.url(&path)).header("Idempotency-Key", key).json(&body);
        async move {
            let res = req.send().await.expect("gateway answers");
            let status = res.status();
            (status, res.json::<serde_json::Value>().await.unwrap_or_default())
        }
    };
    let sku = format!("sku-{}", uuid::Uuid::new_v4().simple());
    let product = json!({ "sku": sku, "name": "Widget", "price_cents": 100, "initial_stock": 5 });
    let (s1, p1) = post("/v1/products".into(), "k1", product.clone()).await;
    let (s2, p2) = post("/v1/products".into(), "k1", product.clone()).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::CREATED), "{p1} {p2}");
    assert_eq!(p1["id"], p2["id"], "the repeat answers the first product");
    let id = p1["id"].as_str().unwrap().to_string();
    let (status, p) = post(
        "/v1/products".into(),
        "k1",
        json!({ "sku": "other", "name": "W", "price_cents": 1, "initial_stock": 0 }),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "same key, other body: {p}");

    // The same key on another endpoint is a request of its own.
    for _ in 0..2 {
        let (status, p) = post(format!("/v1/products/{id}/stock"), "k1", json!({ "quantity": 3 })).await;
        assert_eq!(status, StatusCode::OK, "{p}");
        assert_eq!(p["available"], 8, "stock added once: {p}");
    }
    assert_eq!(stack.stock(&id).await, (8, 0, 0));

    let (s1, c1) =
        post("/v1/customers".into(), "k2", json!({ "name": "Ada", "initial_credit_cents": 100 })).await;
    let (s2, c2) =
        post("/v1/customers".into(), "k2", json!({ "name": "Ada", "initial_credit_cents": 100 })).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::CREATED), "{c1} {c2}");
    assert_eq!(c1["customer_id"], c2["customer_id"], "one account, not two");
    let customer = c1["customer_id"].as_str().unwrap().to_string();
    for _ in 0..2 {
        let (status, c) =
            post(format!("/v1/customers/{customer}/credit"), "k2", json!({ "amount_cents": 50 })).await;
        assert_eq!(status, StatusCode::OK, "{c}");
        assert_eq!(c["balance_cents"], 150, "credited once: {c}");
    }
    assert_eq!(stack.balance(&customer).await, 150);

    let too_long = "k".repeat(201);
    let req = stack.http.post(stack.url("/v1/customers")).header("Idempotency-Key", too_long);
    let res = req.json(&json!({ "name": "Ada", "initial_credit_cents": 1 })).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY, "a key outside the documented pattern");
}

#[tokio::test]
async fn responses_carry_a_request_id_and_are_gzipped_for_callers_that_accept_it() {
    let stack = Stack::start().await;
    let res =
        stack.http.get(stack.url("/openapi.json")).header("accept-encoding", "gzip").send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-encoding"], "gzip");
    let id = res.headers()["x-request-id"].to_str().unwrap();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "a new request id: {id}");
    // Without Accept-Encoding the body is plain JSON.
    let res = stack.http.get(stack.url("/openapi.json")).send().await.unwrap();
    assert!(res.headers().get("content-encoding").is_none());
    assert!(res.json::<Value>().await.unwrap()["openapi"].is_string());
    // The caller's request id is kept, on errors too.
    let res = stack
        .http
        .get(stack.url(&format!("/v1/orders/{}", uuid::Uuid::new_v4())))
        .header("x-request-id", "req-42")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(res.headers()["x-request-id"], "req-42");
}

#[tokio::test]
async fn cors_answers_the_configured_origins_only() {
    let nowhere = "https://127.0.0.1:9";
    let mut settings = system_tests::gateway_settings(nowhere, nowhere, nowhere);
    settings.api.cors_allowed_origins = vec!["https://shop.example".into()];
    let gateway = system_tests::start_gateway_with(settings).await;
    let plain = system_tests::start_gateway(nowhere, nowhere, nowhere).await;
    let http = reqwest::Client::new();
    let preflight = |port: u16, origin: &'static str| {
        http.request(reqwest::Method::OPTIONS, format!("http://127.0.0.1:{port}/v1/orders"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "authorization,content-type,idempotency-key")
            .send()
    };
    let res = preflight(gateway.http_port, "https://shop.example").await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["access-control-allow-origin"], "https://shop.example");
    let allowed = res.headers()["access-control-allow-headers"].to_str().unwrap().to_string();
    assert!(allowed.contains("idempotency-key") && allowed.contains("authorization"), "{allowed}");
    for (port, origin) in
        [(gateway.http_port, "https://evil.example"), (plain.http_port, "https://shop.example")]
    {
        let res = preflight(port, origin).await.unwrap();
        assert!(res.headers().get("access-control-allow-origin").is_none(), "{origin} on {port}");
    }
    // A simple request from the allowed origin gets the header and can read the request id.
    let res = http
        .get(format!("http://127.0.0.1:{}/health/live", gateway.http_port))
        .header("origin", "https://shop.example")
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["access-control-allow-origin"], "https://shop.example");
    assert!(res.headers()["access-control-expose-headers"].to_str().unwrap().contains("x-request-id"));
}

#[tokio::test]
async fn an_origin_that_is_no_header_value_stops_the_gateway_at_start() {
    let nowhere = "https://127.0.0.1:9";
    let mut settings = system_tests::gateway_settings(nowhere, nowhere, nowhere);
    settings.api.cors_allowed_origins = vec!["https://ok.example".into(), "bad\norigin".into()];
    let err = gateway::startup::Application::build(settings).await.err().expect("refused");
    assert_eq!(
        err.to_string(),
        "invalid api.cors_allowed_origins entry \"bad\\norigin\": not a header value"
    );
}

#[tokio::test]
async fn without_the_broker_every_service_stays_ready_reports_degraded_and_still_takes_orders() {
    let mut stack = Stack::start_on(Broker::private().await, |_| {}).await;
    let product = stack.product(100, 10).await;
    let customer = stack.customer(1_000).await;
    let ready = |port: u16| {
        let http = stack.http.clone();
        async move {
            let res = http.get(format!("http://127.0.0.1:{port}/health/ready")).send().await.unwrap();
            (res.status(), res.json::<Value>().await.unwrap())
        }
    };
    let backends = [stack.order.http_port, stack.inventory.http_port, stack.payment.http_port];
    // Probed until ready, as a kubelet probes: a first probe may meet the broker check's
    // connection still opening (TLS and SCRAM) on a busy machine.
    for port in backends {
        sagaworks_test_support::eventually(
            "every backend ready",
            std::time::Duration::from_secs(60),
            || async {
                let (status, body) = ready(port).await;
                (status == StatusCode::OK && body["status"] == "ready").then_some(())
            },
        )
        .await;
    }

    stack.broker.stop();
    for port in backends {
        let (status, body) = ready(port).await;
        assert_eq!(status, StatusCode::OK, "still in its load balancer: {body}");
        assert_eq!(body["status"], "degraded", "{body}");
        assert_eq!(body["checks"]["database"], "ok", "{body}");
        assert_eq!(body["checks"]["kafka"]["critical"], false, "{body}");
        assert!(body["checks"]["kafka"]["error"].is_string(), "{body}");
        let metrics = stack.http.get(format!("http://127.0.0.1:{port}/metrics")).send().await.unwrap();
        let metrics = metrics.text().await.unwrap();
        assert!(metrics.contains("health_check_up{check=\"kafka\"} 0"), "{metrics}");
    }
    // The request path does not need the broker: an order still completes, its
    // events wait in the outbox.
    let (status, order) = stack.place(&customer, &product, 2).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    let order = stack.settled(order["order_id"].as_str().unwrap()).await;
    assert_eq!(order["status"], "CONFIRMED", "{order}");
    let pool = stack.order_db.pool().await;
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(&pool).await.unwrap();
    assert!(waiting >= 2, "OrderCreated and OrderConfirmed wait for the broker: {waiting}");
}

/// The `service` label values of every sample in a `/metrics` text.
fn service_labels(text: &str) -> std::collections::BTreeSet<String> {
    let mut services = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        for prefix in ["{service=\"", ",service=\""] {
            if let Some(start) = line.find(prefix) {
                let rest = &line[start + prefix.len()..];
                services.insert(rest[..rest.find('"').unwrap_or(rest.len())].to_owned());
            }
        }
    }
    services
}

#[tokio::test]
async fn each_service_in_the_test_process_shows_only_its_own_metrics() {
    // The four services share this process; each has its own recorder, as it
    // has its own process in production. Otherwise the gateway's /metrics
    // would also show the order service's series, and an assertion on one
    // service could be met by another's.
    let stack = Stack::start().await;
    let product = stack.product(100, 10).await;
    let customer = stack.customer(1_000).await;
    let (status, order) = stack.place(&customer, &product, 1).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    let order = stack.settled(order["order_id"].as_str().unwrap()).await;
    assert_eq!(order["status"], "CONFIRMED", "{order}");

    let services = [
        ("gateway", stack.gateway.http_port),
        ("order", stack.order.http_port),
        ("inventory", stack.inventory.http_port),
        ("payment", stack.payment.http_port),
    ];
    for (name, port) in services {
        let res = stack.http.get(format!("http://127.0.0.1:{port}/metrics")).send().await.unwrap();
        let text = res.text().await.unwrap();
        let labels = service_labels(&text);
        assert_eq!(labels, [name.to_owned()].into(), "{name}'s /metrics:\n{text}");
    }
}
