//! The resilience stack end to end: a dead participant opens the breaker and orders fail
//! fast without compensating what was never sent; a slow participant hits the timeout
//! and the saga compensates; a flood beyond the bulkhead is shed at once while the
//! caller stays healthy. Participants are made slow with the runtime's fault
//! injection (`PUT /fault`, `sagaworks_runtime::FaultSettings`) or stopped dead (`Running::kill`).
//!
//! No test here measures how long anything took. They synchronise on events: a call
//! *held* by the fault injection (`"hold": true`) is known to be unanswered until the
//! test clears the fault, so whatever answers meanwhile (a timeout, a shed call, a health
//! probe) did so without waiting for it; the breaker's open wait is derived from its
//! configuration. Deadlines ([`WAIT`], the HTTP client's timeout) only turn a hang into a
//! failure.

use reqwest::StatusCode;
use sagaworks_test_support::eventually;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::time::Duration;
use system_tests::faults::{
    clear_fault, metrics, put_fault, restart_inventory_with_faults, sample, set_fault, start_payment_on,
};
use system_tests::{Stack, steps};

const PAYMENT_BREAKER: &str = r#"resilience_breaker_state{downstream="payment"}"#;

/// Generous: only there to fail instead of hanging.
const WAIT: Duration = Duration::from_secs(60);

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

/// `resilience_rejections_total` of `downstream` for `reason`.
fn rejections(text: &str, downstream: &str, reason: &str) -> f64 {
    let series = format!(r#"resilience_rejections_total{{downstream="{downstream}",reason="{reason}"}}"#);
    sample(text, &series).unwrap_or(0.0)
}

/// Logical calls to `downstream` (`resilience_calls_total`), by outcome label, and in all.
fn calls(text: &str, downstream: &str, outcome: Option<&str>) -> f64 {
    let prefix = format!(r#"resilience_calls_total{{downstream="{downstream}","#);
    text.lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter(|rest| outcome.is_none_or(|o| rest.starts_with(&format!(r#"outcome="{o}"}}"#))))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Calls of `method` the fault injection holds right now.
fn held(text: &str, method: &str) -> f64 {
    sample(text, &format!(r#"faults_held_calls{{method="{method}"}}"#)).unwrap_or(0.0)
}

/// Calls of `method` the fault injection has held so far.
fn ever_held(text: &str, method: &str) -> f64 {
    sample(text, &format!(r#"faults_injected_total{{method="{method}",kind="hold"}}"#)).unwrap_or(0.0)
}

/// Sockets of this process still connected to `port` on this host: ESTABLISHED, or
/// CLOSE_WAIT (the peer closed, the owner has not noticed yet). Linux: `/proc/net/tcp*`
/// lists the host's sockets by inode, `/proc/self/fd` names ours.
fn connections_to(port: u16) -> usize {
    let ours: HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(inode)) = (fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let remote_port = remote.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            if remote_port == Some(port) && matches!(*state, "01" | "08") && ours.contains(*inode) {
                n += 1;
            }
        }
    }
    n
}

#[tokio::test]
async fn a_dead_payment_service_opens_the_breaker_orders_fail_fast_and_it_closes_again() {
    // Only has to outlast the five orders that meet the open breaker below; the wait for
    // half-open is derived from it.
    const OPEN_WAIT: Duration = Duration::from_secs(3);
    let mut stack = Stack::start_with(|s| {
        s.payment.breaker.sliding_window_size = 5;
        s.payment.breaker.minimum_calls = 5;
        s.payment.breaker.wait_duration_open_ms = OPEN_WAIT.as_millis() as u64;
        // An order makes two calls to payment (check_account's GetAccount, then the charge):
        // the first order after the open wait is two probes, the next order's first call
        // the third, which closes it.
        s.payment.breaker.permitted_calls_half_open = 3;
        s.payment.retry.base_backoff_ms = 10;
        s.payment.retry.max_backoff_ms = 20;
    })
    .await;
    let product = stack.product(100, 20).await;
    let customer = stack.customer(10_000).await;
    let order_http = stack.order.http_port;
    assert_eq!(order(&stack, &customer, &product).await["status"], "CONFIRMED", "payment is up");
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (19, 1), "reserved, sold once inventory sees it confirmed");

    stack.payment.kill();
    // The next charge must find its connection closed and be refused (never sent), not be
    // written into a connection nobody reads any more (maybe sent, so refunded). The
    // services run in this process: wait until none of its sockets is connected to
    // payment, i.e. every client has seen the close.
    let payment_port = stack.payment.grpc_port;
    eventually("the clients to see payment's connections close", WAIT, || async move {
        (connections_to(payment_port) == 0).then_some(())
    })
    .await;

    // Connections are refused: each order's first call to payment (check_account's) was
    // never sent, so the order is cancelled before any stock is held, with nothing to
    // undo. Five refused attempts open it.
    let mut opening = 0;
    while sample(&metrics(order_http).await, PAYMENT_BREAKER) != Some(1.0) {
        opening += 1;
        assert!(opening <= 3, "5 refused attempts (3 per call) must open the breaker");
        let o = order(&stack, &customer, &product).await;
        assert_eq!(o["status"], "CANCELLED", "{o}");
        assert_eq!(names(&o), ["check_account"], "nothing reserved, nothing to refund: {o}");
    }
    // The breaker opened before we saw it open, so a timer started now ends after its
    // open wait: then the next call is a half-open probe.
    let open_wait_over = tokio::time::sleep(OPEN_WAIT);

    // Open: each account check is rejected by the breaker itself, before any attempt: exactly
    // one rejection per order, and no call with any other outcome (a refused or failed
    // attempt would be one).
    let before = metrics(order_http).await;
    let open = futures::future::join_all((0..5).map(|_| order(&stack, &customer, &product))).await;
    for o in &open {
        assert_eq!(o["status"], "CANCELLED", "{o}");
        let reason = o["failure_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("circuit open"), "{o}");
        assert_eq!(names(o), ["check_account"], "nothing reserved, nothing to refund: {o}");
    }
    let after = metrics(order_http).await;
    assert_eq!(
        rejections(&after, "payment", "circuit_open") - rejections(&before, "payment", "circuit_open"),
        5.0
    );
    assert_eq!(
        calls(&after, "payment", Some("circuit_open")) - calls(&before, "payment", Some("circuit_open")),
        5.0
    );
    assert_eq!(calls(&after, "payment", None) - calls(&before, "payment", None), 5.0, "no attempt was made");
    assert_eq!(sample(&after, PAYMENT_BREAKER), Some(1.0), "open");
    assert_eq!(transitions(&after, "closed", "open"), 1.0);
    assert_eq!(transitions(&after, "open", "half_open"), 0.0, "the five met the open breaker");
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (19, 1), "no cancelled order held any stock");

    // Payment is back on its port; after the open wait three probes close the breaker.
    stack.payment =
        start_payment_on(&stack.payment_db, &stack.kafka_for("payment"), stack.payment.grpc_port).await;
    open_wait_over.await;
    assert_eq!(order(&stack, &customer, &product).await["status"], "CONFIRMED", "first and second probe");
    assert_eq!(sample(&metrics(order_http).await, PAYMENT_BREAKER), Some(2.0), "half-open");
    assert_eq!(order(&stack, &customer, &product).await["status"], "CONFIRMED", "third probe");
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
    let inventory_http = stack.inventory.http_port;
    assert_eq!(
        put_fault(stack.payment.http_port, &json!({ "delay_ms": 1 })).await,
        StatusCode::NOT_FOUND,
        "fault injection is off unless enabled"
    );
    let product = stack.product(100, 10).await;
    let customer = stack.customer(1_000).await;

    // Each reservation is made at once, but its answer is held until the test clears the
    // fault: the order can only finish because the 300 ms route timeout cut both attempts.
    set_fault(inventory_http, json!({ "hold": true, "methods": ["ReserveStock"] })).await;
    let o = order(&stack, &customer, &product).await;
    assert_eq!(o["status"], "CANCELLED", "{o}");
    let reason = o["failure_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("reserve_stock") && reason.contains("timed out"), "{o}");
    assert_eq!(
        steps(&o),
        [
            ("check_account".to_string(), "SUCCEEDED".to_string()),
            ("reserve_stock".into(), "FAILED".into()),
            ("release_stock".into(), "SUCCEEDED".into())
        ],
        "a timed-out reservation may exist, so it is released: {o}"
    );
    assert_eq!(ever_held(&metrics(inventory_http).await, "ReserveStock"), 2.0, "both attempts were held");
    let inventory_db = stack.inventory_db.pool().await;
    let reservation: String = sqlx::query_scalar("SELECT status FROM reservations WHERE order_id = $1")
        .bind(id(&o).parse::<uuid::Uuid>().unwrap())
        .fetch_one(&inventory_db)
        .await
        .expect("the late call did reserve");
    assert_eq!(reservation, "RELEASED");
    clear_fault(inventory_http).await;
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
    set_fault(inventory_http, json!({ "hold": true, "methods": ["GetStock"] })).await;
    let res = stack.http.get(&url).send().await.expect("the gateway answers");
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    // The call reached inventory, which holds its answer until the clear below: the 504
    // is the gateway's timeout, not an answer that came late.
    assert_eq!(ever_held(&metrics(inventory_http).await, "GetStock"), 1.0);
    clear_fault(inventory_http).await;
    let res = stack.http.get(&url).send().await.expect("the gateway answers");
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_flood_beyond_the_bulkhead_is_shed_at_once_and_the_caller_stays_healthy() {
    const LIMIT: usize = 3;
    const FLOOD: usize = 15;
    // The admitted calls are held in inventory until the test releases them, so their
    // slots stay taken: every other call of the flood finds the bulkhead full. Answered
    // while they are still held = shed without waiting for a slot (a call that waited for
    // one would wait until the release).
    let mut stack = Stack::start_with(|s| {
        s.inventory.bulkhead.max_concurrent_calls = LIMIT;
        // Held calls end when the test releases them: not at a timeout, nor when a saga
        // driver's lease runs out and another one runs the step again.
        s.inventory.timeout_ms = 600_000;
        s.saga.lease_ms = 600_000;
        // Enough connections that a shed saga step does not queue for one.
        s.database.max_connections = 40;
    })
    .await;
    restart_inventory_with_faults(&mut stack).await;
    let product = stack.product(100, 100).await;
    let customer = stack.customer(100_000).await;
    let (order_http, inventory_http) = (stack.order.http_port, stack.inventory.http_port);
    let probe = reqwest::Client::new();

    // The order service's inventory bulkhead: FLOOD concurrent orders.
    let shed_before = rejections(&metrics(order_http).await, "inventory", "bulkhead_full");
    set_fault(inventory_http, json!({ "hold": true, "methods": ["ReserveStock"] })).await;
    let live_url = format!("http://127.0.0.1:{order_http}/health/live");
    let (orders, (held_reservations, shed_reservations, live)) = tokio::join!(
        futures::future::join_all((0..FLOOD).map(|_| stack.place(&customer, &product, 1))),
        async {
            // Shed by the order service's bulkhead, held by inventory's fault injection.
            let (held_now, shed) = eventually("reservations held and shed", WAIT, || async move {
                let shed = rejections(&metrics(order_http).await, "inventory", "bulkhead_full") - shed_before;
                let held_now = held(&metrics(inventory_http).await, "ReserveStock");
                (held_now >= LIMIT as f64 && shed >= (FLOOD - LIMIT) as f64).then_some((held_now, shed))
            })
            .await;
            let live = probe.get(&live_url).send().await.expect("order answers").status();
            // Nothing was released meanwhile: the probe was answered during the flood.
            assert_eq!(held(&metrics(inventory_http).await, "ReserveStock"), LIMIT as f64);
            clear_fault(inventory_http).await;
            (held_now, shed, live)
        }
    );
    assert_eq!(held_reservations, LIMIT as f64, "the bulkhead admits LIMIT calls");
    assert_eq!(shed_reservations, (FLOOD - LIMIT) as f64, "all others are shed while those are held");
    assert_eq!(live, StatusCode::OK, "order /health/live during the flood");
    let (mut confirmed, mut shed) = (0, 0);
    for (status, o) in &orders {
        assert_eq!(*status, StatusCode::CREATED, "{o}");
        let o = stack.settled(&id(o)).await;
        match o["status"].as_str() {
            Some("CONFIRMED") => confirmed += 1,
            _ => {
                let reason = o["failure_reason"].as_str().unwrap_or_default();
                assert!(reason.contains("too many calls in flight"), "{o}");
                assert_eq!(
                    names(&o),
                    ["check_account", "reserve_stock"],
                    "never sent, nothing to release: {o}"
                );
                shed += 1;
            }
        }
    }
    assert_eq!((confirmed, shed), (LIMIT, FLOOD - LIMIT), "the held calls complete once released");
    let text = metrics(order_http).await;
    assert_eq!(rejections(&text, "inventory", "bulkhead_full") - shed_before, shed as f64);
    assert_eq!(order(&stack, &customer, &product).await["status"], "CONFIRMED", "works right after");
    let confirmed = confirmed + 1;

    // The gateway's inventory bulkhead: 503 + Retry-After while the admitted reads are held.
    let mut settings = system_tests::gateway_settings(
        &stack.order.grpc_url(),
        &stack.inventory.grpc_url(),
        &stack.payment.grpc_url(),
    );
    settings.inventory.bulkhead.max_concurrent_calls = LIMIT;
    settings.inventory.timeout_ms = 600_000;
    let gateway = system_tests::start_gateway_with(settings).await;
    let url = format!("http://127.0.0.1:{}/v1/products/{product}", gateway.http_port);
    let gateway_live = format!("http://127.0.0.1:{}/health/live", gateway.http_port);
    set_fault(inventory_http, json!({ "hold": true, "methods": ["GetStock"] })).await;
    let answers: Vec<_> = (0..FLOOD)
        .map(|_| {
            let (http, url) = (stack.http.clone(), url.clone());
            tokio::spawn(async move { http.get(url).send().await.expect("the gateway answers") })
        })
        .collect();
    let answers_ref = &answers;
    let (held_reads, answered) = eventually("reads held and answered", WAIT, || async move {
        let held_now = held(&metrics(inventory_http).await, "GetStock");
        let answered = answers_ref.iter().filter(|a| a.is_finished()).count();
        (held_now >= LIMIT as f64 && answered >= FLOOD - LIMIT).then_some((held_now, answered))
    })
    .await;
    assert_eq!((held_reads, answered), (LIMIT as f64, FLOOD - LIMIT), "answered while LIMIT are held");
    let live = probe.get(&gateway_live).send().await.expect("the gateway answers").status();
    assert_eq!(live, StatusCode::OK, "gateway /health/live during the flood");
    assert_eq!(held(&metrics(inventory_http).await, "GetStock"), LIMIT as f64, "still held");
    clear_fault(inventory_http).await;
    let (mut ok, mut unavailable) = (0, 0);
    for answer in answers {
        let res = answer.await.expect("the request task");
        match res.status() {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert!(res.headers().contains_key("retry-after"), "{:?}", res.headers());
                assert_eq!(res.headers()["content-type"], "application/problem+json");
                unavailable += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((ok, unavailable), (LIMIT, FLOOD - LIMIT), "the held reads answer once released");

    let res = stack.http.get(&url).send().await.expect("the gateway answers");
    assert_eq!(res.status(), StatusCode::OK, "the gateway works right after");
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (100 - confirmed as i64, confirmed as i64));
    assert_eq!(stack.balance(&customer).await, 100_000 - 100 * confirmed as i64);
}

/// The gateway retries an admin write whose answer came too late: inventory
/// did the work, but its answer is held (until the test releases it) past the
/// gateway's 1 s timeout. The retry carries the same idempotency key, so the
/// product is created once and its stock added once, and the client gets the
/// first answer (not a 409 for the product it just created, nor stock added
/// twice).
#[tokio::test]
async fn an_admin_write_retried_after_a_timeout_takes_effect_once() {
    let mut stack = Stack::start().await;
    restart_inventory_with_faults(&mut stack).await;
    let inventory_http = stack.inventory.http_port;
    // The gateway's retries, on the gateway's /metrics.
    let gateway_http = stack.gateway.http_port;
    let retries =
        |text: &str| sample(text, r#"resilience_retries_total{downstream="inventory"}"#).unwrap_or(0.0);
    // Only the first attempt (`max_calls`) is held, and it stays held until the clear
    // after the answer: the client's answer can only be the retry's.
    let hold_first_attempt = |method: &str| json!({ "hold": true, "max_calls": 1, "methods": [method] });

    let before = retries(&metrics(gateway_http).await);
    let sku = format!("sku-{}", uuid::Uuid::new_v4().simple());
    let body = json!({ "sku": sku, "name": "Widget", "price_cents": 100, "initial_stock": 5 });
    set_fault(inventory_http, hold_first_attempt("CreateProduct")).await;
    let (status, product) = stack.post("/v1/products", body).await;
    clear_fault(inventory_http).await;
    assert_eq!(status, StatusCode::CREATED, "the retry answers the first call's product: {product}");
    let text = metrics(inventory_http).await;
    assert_eq!(ever_held(&text, "CreateProduct"), 1.0, "the first attempt was held");
    let after_create = retries(&metrics(gateway_http).await);
    assert!(after_create > before, "the gateway did retry ({before} -> {after_create})");
    let (_, list) = stack.get("/v1/products").await;
    let same_sku = list["products"].as_array().unwrap().iter().filter(|p| p["sku"] == sku.as_str()).count();
    assert_eq!(same_sku, 1, "{list}");
    let id = product["id"].as_str().unwrap().to_string();

    set_fault(inventory_http, hold_first_attempt("AddStock")).await;
    let (status, p) = stack.post(&format!("/v1/products/{id}/stock"), json!({ "quantity": 3 })).await;
    clear_fault(inventory_http).await;
    assert_eq!(status, StatusCode::OK, "{p}");
    let text = metrics(inventory_http).await;
    assert_eq!(ever_held(&text, "AddStock"), 1.0, "the first attempt was held");
    assert!(retries(&metrics(gateway_http).await) > after_create, "the gateway did retry");
    assert_eq!(p["available"], 8, "{p}");
    assert_eq!(stack.stock(&id).await, (8, 0, 0), "stock added once");
}
