//! The resilience stack end to end: a dead participant opens the breaker and orders fail
//! fast without compensating what was never sent; a slow participant hits the timeout
//! and the saga compensates; a flood beyond the bulkhead is shed at once while the
//! caller stays healthy. Participants are made slow with the fault injection of
//! `sagaworks_runtime::fault` (`PUT /fault`) or stopped dead (`Running::kill`).

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use system_tests::faults::{
    clear_fault, metrics, put_fault, restart_inventory_with_faults, sample, set_fault, start_payment_on,
    step_duration,
};
use system_tests::{Stack, steps};

const PAYMENT_BREAKER: &str = r#"resilience_breaker_state{downstream="payment"}"#;

fn names(order: &Value) -> Vec<String> {
    steps(order).into_iter().map(|(name, _)| name).collect()
}

fn id(order: &Value) -> String {
    order["order_id"].as_str().expect("an order id").to_string()
}

/// Places an order and waits for it to settle.
async fn order(stack: &Stack, customer: &str, product: &str) -> Value {
    let (status, order) = stack.place(customer, product, 1).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    stack.settled(&id(&order)).await
}

fn transitions(text: &str, from: &str, to: &str) -> f64 {
    let series =
        format!(r#"resilience_breaker_transitions_total{{downstream="payment",from="{from}",to="{to}"}}"#);
    sample(text, &series).unwrap_or(0.0)
}

/// GET `url`, timed.
async fn timed_get(http: &reqwest::Client, url: &str) -> (reqwest::Response, Duration) {
    let started = Instant::now();
    let res = http.get(url).send().await.expect("answers");
    (res, started.elapsed())
}

#[tokio::test]
async fn a_dead_payment_service_opens_the_breaker_orders_fail_fast_and_it_closes_again() {
    let mut stack = Stack::start_with(|s| {
        s.payment.breaker.sliding_window_size = 5;
        s.payment.breaker.minimum_calls = 5;
        // Long enough for the five orders below to meet an open breaker.
        s.payment.breaker.wait_duration_open_ms = 3_000;
        s.payment.breaker.permitted_calls_half_open = 2;
        s.payment.retry.base_backoff_ms = 10;
        s.payment.retry.max_backoff_ms = 20;
    })
    .await;
    let product = stack.product(100, 20).await;
    let customer = stack.customer(10_000).await;
    let db = stack.order_db.pool().await;
    let order_http = stack.order.http_port;
    assert_eq!(order(&stack, &customer, &product).await["status"], "CONFIRMED", "payment is up");
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (19, 1), "reserved, sold once inventory sees it confirmed");

    stack.payment.kill();
    // Let the order service see the closed connection (GOAWAY) before the next call.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Connections are refused: each charge was never sent, so the order is cancelled
    // with its stock released and nothing to refund. Five refused attempts open it.
    let mut opening = 0;
    while sample(&metrics(order_http).await, PAYMENT_BREAKER) != Some(1.0) {
        opening += 1;
        assert!(opening <= 3, "5 refused attempts (3 per call) must open the breaker");
        let o = order(&stack, &customer, &product).await;
        assert_eq!(o["status"], "CANCELLED", "{o}");
        assert_eq!(names(&o), ["reserve_stock", "charge_payment", "release_stock"], "no refund: {o}");
    }

    let opened = tokio::time::Instant::now();

    // Open: each charge is rejected at once.
    let mut posts = vec![];
    let mut charges = vec![];
    for _ in 0..5 {
        let started = Instant::now();
        let (status, o) = stack.place(&customer, &product, 1).await;
        posts.push(started.elapsed());
        assert_eq!(status, StatusCode::CREATED, "{o}");
        let o = stack.settled(&id(&o)).await;
        assert_eq!(o["status"], "CANCELLED", "{o}");
        let reason = o["failure_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("circuit open"), "{o}");
        assert_eq!(names(&o), ["reserve_stock", "charge_payment", "release_stock"], "no refund: {o}");
        let charge = step_duration(&db, &id(&o), "charge_payment").await;
        assert!(charge < Duration::from_millis(50), "charge_payment took {charge:?} with the breaker open");
        charges.push(charge);
    }
    println!("breaker open: charge_payment steps {charges:?}, whole POST /v1/orders {posts:?}");
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (19, 1), "every cancelled order's stock is back");

    let text = metrics(order_http).await;
    assert_eq!(sample(&text, PAYMENT_BREAKER), Some(1.0), "open");
    assert_eq!(transitions(&text, "closed", "open"), 1.0);
    let rejected =
        sample(&text, r#"resilience_rejections_total{downstream="payment",reason="circuit_open"}"#);
    assert!(rejected >= Some(5.0), "{rejected:?}");

    // Payment is back on its port; after the open wait two probes close the breaker.
    stack.payment = start_payment_on(&stack.payment_db, &stack.kafka, stack.payment.grpc_port).await;
    tokio::time::sleep_until(opened + Duration::from_millis(3_100)).await;
    assert_eq!(order(&stack, &customer, &product).await["status"], "CONFIRMED", "first probe");
    assert_eq!(sample(&metrics(order_http).await, PAYMENT_BREAKER), Some(2.0), "half-open");
    assert_eq!(order(&stack, &customer, &product).await["status"], "CONFIRMED", "second probe");
    let text = metrics(order_http).await;
    assert_eq!(sample(&text, PAYMENT_BREAKER), Some(0.0), "closed");
    assert_eq!(transitions(&text, "open", "half_open"), 1.0);
    assert_eq!(transitions(&text, "half_open", "closed"), 1.0);
    assert_eq!(order(&stack, &customer, &product).await["status"], "CONFIRMED");

    assert_eq!(stack.balance(&customer).await, 10_000 - 4 * 100, "only the confirmed orders were charged");
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (16, 4));
}

#[tokio::test]
async fn a_slow_inventory_hits_the_timeout_and_the_reservation_is_released() {
    let mut stack = Stack::start_with(|s| {
        s.inventory.routes.insert("ReserveStock".into(), 300);
        s.inventory.retry.max_attempts = 2;
    })
    .await;
    restart_inventory_with_faults(&mut stack).await;
    assert_eq!(
        put_fault(stack.payment.http_port, &json!({ "delay_ms": 1 })).await,
        StatusCode::NOT_FOUND,
        "fault injection is off unless enabled"
    );
    let product = stack.product(100, 10).await;
    let customer = stack.customer(1_000).await;

    // The reservation is made at once; only its answer is late.
    set_fault(stack.inventory.http_port, json!({ "delay_ms": 800, "methods": ["ReserveStock"] })).await;
    let o = order(&stack, &customer, &product).await;
    assert_eq!(o["status"], "CANCELLED", "{o}");
    let reason = o["failure_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("reserve_stock") && reason.contains("timed out"), "{o}");
    assert_eq!(
        steps(&o),
        [("reserve_stock".to_string(), "FAILED".to_string()), ("release_stock".into(), "SUCCEEDED".into())],
        "a timed-out reservation may exist, so it is released: {o}"
    );
    let inventory_db = stack.inventory_db.pool().await;
    let reservation: String = sqlx::query_scalar("SELECT status FROM reservations WHERE order_id = $1")
        .bind(id(&o).parse::<uuid::Uuid>().unwrap())
        .fetch_one(&inventory_db)
        .await
        .expect("the late call did reserve");
    assert_eq!(reservation, "RELEASED");
    assert_eq!(stack.stock(&product).await, (10, 0, 0));
    assert_eq!(stack.balance(&customer).await, 1_000);

    // Through the gateway a slow downstream is a 504.
    let mut settings = system_tests::gateway_settings(
        &stack.order.grpc_url(),
        &stack.inventory.grpc_url(),
        &stack.payment.grpc_url(),
    );
    settings.inventory.timeout_ms = 200;
    settings.inventory.retry.max_attempts = 1;
    let gateway = system_tests::start_gateway_with(settings).await;
    let url = format!("http://127.0.0.1:{}/v1/products/{product}", gateway.http_port);
    set_fault(stack.inventory.http_port, json!({ "delay_ms": 600, "methods": ["GetStock"] })).await;
    let (res, took) = timed_get(&stack.http, &url).await;
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert!(took < Duration::from_millis(550), "cut at the 200 ms timeout, took {took:?}");
    println!("slow GetStock through the gateway: 504 after {took:?}");
    clear_fault(stack.inventory.http_port).await;
    let (res, _) = timed_get(&stack.http, &url).await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_flood_beyond_the_bulkhead_is_shed_at_once_and_the_caller_stays_healthy() {
    const LIMIT: usize = 3;
    const FLOOD: usize = 15;
    // Each admitted call holds its slot for DELAY; a call that waited for a slot would take
    // at least that long, a shed one answers at once.
    const DELAY: Duration = Duration::from_millis(1_000);
    let mut stack = Stack::start_with(|s| {
        s.inventory.bulkhead.max_concurrent_calls = LIMIT;
        s.inventory.timeout_ms = 3_000;
        // Enough connections that a shed saga step does not queue for one.
        s.database.max_connections = 40;
    })
    .await;
    restart_inventory_with_faults(&mut stack).await;
    let product = stack.product(100, 100).await;
    let customer = stack.customer(100_000).await;
    let db = stack.order_db.pool().await;
    let order_http = stack.order.http_port;
    let fault = json!({ "delay_ms": DELAY.as_millis() as u64, "methods": ["ReserveStock", "GetStock"] });
    set_fault(stack.inventory.http_port, fault).await;

    // The order service's inventory bulkhead: FLOOD concurrent orders.
    let live_url = format!("http://127.0.0.1:{order_http}/health/live");
    let probe = reqwest::Client::new();
    let (orders, (live, live_took)) = tokio::join!(
        futures::future::join_all((0..FLOOD).map(|_| stack.place(&customer, &product, 1))),
        async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            timed_get(&probe, &live_url).await
        }
    );
    assert_eq!(live.status(), StatusCode::OK);
    assert!(live_took < Duration::from_millis(250), "order /health/live took {live_took:?} during the flood");
    let (mut confirmed, mut shed, mut shed_steps) = (0, 0, vec![]);
    for (status, o) in &orders {
        assert_eq!(*status, StatusCode::CREATED, "{o}");
        let o = stack.settled(&id(o)).await;
        match o["status"].as_str() {
            Some("CONFIRMED") => confirmed += 1,
            _ => {
                let reason = o["failure_reason"].as_str().unwrap_or_default();
                assert!(reason.contains("too many calls in flight"), "{o}");
                assert_eq!(names(&o), ["reserve_stock"], "never sent, nothing to release: {o}");
                let took = step_duration(&db, &id(&o), "reserve_stock").await;
                assert!(took < DELAY / 2, "a shed reservation took {took:?}, as if it waited for a slot");
                shed_steps.push(took);
                shed += 1;
            }
        }
    }
    println!(
        "order flood: {confirmed} confirmed, {shed} shed; shed reserve_stock steps {shed_steps:?}; \
         /health/live {live_took:?}"
    );
    assert!(confirmed >= LIMIT, "the admitted calls complete: {confirmed}");
    assert!(shed >= FLOOD / 2, "the excess is shed: {shed}");
    let text = metrics(order_http).await;
    let bulkhead = r#"resilience_rejections_total{downstream="inventory",reason="bulkhead_full"}"#;
    assert_eq!(sample(&text, bulkhead), Some(shed as f64));
    assert_eq!(order(&stack, &customer, &product).await["status"], "CONFIRMED", "works right after");
    let confirmed = confirmed + 1;

    // The gateway's inventory bulkhead: 503 + Retry-After at once.
    let mut settings = system_tests::gateway_settings(
        &stack.order.grpc_url(),
        &stack.inventory.grpc_url(),
        &stack.payment.grpc_url(),
    );
    settings.inventory.bulkhead.max_concurrent_calls = LIMIT;
    settings.inventory.timeout_ms = 3_000;
    let gateway = system_tests::start_gateway_with(settings).await;
    let url = format!("http://127.0.0.1:{}/v1/products/{product}", gateway.http_port);
    let gateway_live = format!("http://127.0.0.1:{}/health/live", gateway.http_port);
    let (answers, (live, live_took)) =
        tokio::join!(futures::future::join_all((0..FLOOD).map(|_| timed_get(&stack.http, &url))), async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            timed_get(&probe, &gateway_live).await
        });
    assert_eq!(live.status(), StatusCode::OK);
    assert!(
        live_took < Duration::from_millis(250),
        "gateway /health/live took {live_took:?} during the flood"
    );
    let (mut ok, mut unavailable, mut shed_times) = (0, 0, vec![]);
    for (res, took) in answers {
        match res.status() {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert!(res.headers().contains_key("retry-after"), "{:?}", res.headers());
                assert_eq!(res.headers()["content-type"], "application/problem+json");
                assert!(took < DELAY / 2, "shed without waiting for a slot, took {took:?}");
                shed_times.push(took);
                unavailable += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    println!("gateway flood: {ok} ok, {unavailable} shed in {shed_times:?}; /health/live {live_took:?}");
    assert!(ok >= LIMIT, "{ok}");
    assert!(unavailable >= FLOOD / 2, "{unavailable}");

    clear_fault(stack.inventory.http_port).await;
    let (res, took) = timed_get(&stack.http, &url).await;
    assert_eq!(res.status(), StatusCode::OK, "the gateway works right after ({took:?})");
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (100 - confirmed as i64, confirmed as i64));
    assert_eq!(stack.balance(&customer).await, 100_000 - 100 * confirmed as i64);
}

/// The gateway retries an admin write whose answer came too late: inventory
/// did the work, but its answer is held back past the gateway's 1 s timeout.
/// The retry carries the same idempotency key, so the product is created
/// once and its stock added once, and the client gets the first answer (not
/// a 409 for the product it just created, nor stock added twice).
#[tokio::test]
async fn an_admin_write_retried_after_a_timeout_takes_effect_once() {
    let mut stack = Stack::start().await;
    restart_inventory_with_faults(&mut stack).await;
    let inventory_http = stack.inventory.http_port;
    let retries =
        |text: &str| sample(text, r#"resilience_retries_total{downstream="inventory"}"#).unwrap_or(0.0);
    // The first attempt's answer is held back 1.5 s; the fault is gone long
    // before the gateway times out (1 s) and retries.
    let first_answer_late = |method: &'static str| async move {
        set_fault(inventory_http, json!({ "delay_ms": 1_500, "methods": [method] })).await;
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            clear_fault(inventory_http).await;
        }
    };

    let before = retries(&metrics(inventory_http).await);
    let sku = format!("sku-{}", uuid::Uuid::new_v4().simple());
    let body = json!({ "sku": sku, "name": "Widget", "price_cents": 100, "initial_stock": 5 });
    let clear = first_answer_late("CreateProduct").await;
    let ((status, product), ()) = tokio::join!(stack.post("/v1/products", body), clear);
    assert_eq!(status, StatusCode::CREATED, "the retry answers the first call's product: {product}");
    let after_create = retries(&metrics(inventory_http).await);
    assert!(after_create > before, "the gateway did retry ({before} -> {after_create})");
    let (_, list) = stack.get("/v1/products").await;
    let same_sku = list["products"].as_array().unwrap().iter().filter(|p| p["sku"] == sku.as_str()).count();
    assert_eq!(same_sku, 1, "{list}");
    let id = product["id"].as_str().unwrap().to_string();

    let clear = first_answer_late("AddStock").await;
    let path = format!("/v1/products/{id}/stock");
    let ((status, p), ()) = tokio::join!(stack.post(&path, json!({ "quantity": 3 })), clear);
    assert_eq!(status, StatusCode::OK, "{p}");
    assert!(retries(&metrics(inventory_http).await) > after_create, "the gateway did retry");
    assert_eq!(p["available"], 8, "{p}");
    assert_eq!(stack.stock(&id).await, (8, 0, 0), "stock added once");
}
