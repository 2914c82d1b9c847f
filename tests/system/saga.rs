//! The order-placement saga end to end, through the REST gateway, against
//! real PostgreSQL databases (one per service).

use reqwest::StatusCode;
use sagaworks_proto::inventory::v1 as inv;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_proto::payment::v1 as pay;
use sagaworks_proto::payment::v1::payment_service_client::PaymentServiceClient;
use serde_json::json;
use sqlx::AssertSqlSafe;
use system_tests::{Stack, channel_as, steps};
use tonic::Code;

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[tokio::test]
async fn happy_path_confirms_reserves_and_charges() {
    let stack = Stack::start().await;
    let product = stack.product(250, 10).await;
    let customer = stack.customer(10_000).await;

    let (status, order) = stack.place(&customer, &product, 2).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    assert_eq!(order["status"], "CONFIRMED", "{order}");
    assert_eq!(order["total_cents"], 500);
    assert_eq!(order["items"][0]["unit_price_cents"], 250);
    assert_eq!(
        steps(&order),
        pairs(&[
            ("check_account", "SUCCEEDED"),
            ("reserve_stock", "SUCCEEDED"),
            ("charge_payment", "SUCCEEDED"),
            ("confirm_order", "SUCCEEDED")
        ])
    );
    assert_eq!(stack.balance(&customer).await, 9_500);
    // Inventory consumes OrderConfirmed from Kafka and turns the reservation into a sale.
    sagaworks_test_support::eventually(
        "reservation committed",
        std::time::Duration::from_secs(30),
        || async { (stack.stock(&product).await == (8, 0, 2)).then_some(()) },
    )
    .await;

    let id = order["order_id"].as_str().unwrap();
    let (status, fetched) = stack.get(&format!("/v1/orders/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fetched["status"], "CONFIRMED");
    let saga_id = fetched["saga"]["saga_id"].as_str().unwrap();
    let (status, saga) = stack.get(&format!("/v1/sagas/{saga_id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(saga["status"], "COMPLETED");
    assert!(saga["steps"][0]["started_at"].is_string() && saga["steps"][0]["finished_at"].is_string());

    // The order's timeline is fed from every service's events on Kafka.
    let timeline =
        sagaworks_test_support::eventually("timeline", std::time::Duration::from_secs(30), || async {
            let (_, o) = stack.get(&format!("/v1/orders/{id}")).await;
            let types: Vec<String> = o["timeline"]
                .as_array()?
                .iter()
                .map(|e| e["event_type"].as_str().unwrap().to_string())
                .collect();
            ["OrderCreated", "StockReserved", "PaymentCharged", "OrderConfirmed", "StockCommitted"]
                .iter()
                .all(|t| types.iter().any(|x| x == t))
                .then_some(types)
        })
        .await;
    assert_eq!(timeline.iter().filter(|t| *t == "OrderConfirmed").count(), 1, "deduplicated: {timeline:?}");

    let (status, list) = stack.get(&format!("/v1/orders?customer_id={customer}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["orders"].as_array().unwrap().len(), 1);
    assert_eq!(list["orders"][0]["order_id"], id);
}

#[tokio::test]
async fn out_of_stock_cancels_without_charging() {
    let stack = Stack::start().await;
    let product = stack.product(100, 3).await;
    let customer = stack.customer(10_000).await;

    let (status, order) = stack.place(&customer, &product, 4).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(order["status"], "CANCELLED", "{order}");
    assert!(order["failure_reason"].as_str().unwrap().contains("insufficient stock"), "{order}");
    assert_eq!(
        steps(&order),
        pairs(&[("check_account", "SUCCEEDED"), ("reserve_stock", "FAILED")]),
        "no payment step, nothing to compensate"
    );
    assert_eq!(stack.stock(&product).await, (3, 0, 0));
    assert_eq!(stack.balance(&customer).await, 10_000);
}

#[tokio::test]
async fn insufficient_funds_cancels_and_releases_stock() {
    let stack = Stack::start().await;
    let product = stack.product(300, 5).await;
    let customer = stack.customer(500).await;

    let (_, order) = stack.place(&customer, &product, 2).await;
    assert_eq!(order["status"], "CANCELLED", "{order}");
    assert!(order["failure_reason"].as_str().unwrap().contains("insufficient funds"), "{order}");
    assert_eq!(
        steps(&order),
        pairs(&[
            ("check_account", "SUCCEEDED"),
            ("reserve_stock", "SUCCEEDED"),
            ("charge_payment", "FAILED"),
            ("release_stock", "SUCCEEDED")
        ])
    );
    assert_eq!(order["saga"]["status"], "COMPENSATED");
    assert_eq!(stack.stock(&product).await, (5, 0, 0), "stock released");
    assert_eq!(stack.balance(&customer).await, 500, "never overdrawn, nothing charged");
}

/// Version 2's check: an order of a customer without an account, or with nothing on
/// it, is cancelled before any stock is held for it (version 1 reserved, failed the
/// charge and released).
#[tokio::test]
async fn a_customer_without_an_account_or_credit_is_cancelled_before_stock_is_held() {
    let stack = Stack::start().await;
    let product = stack.product(300, 5).await;
    let broke = stack.customer(0).await;
    let unknown = uuid::Uuid::now_v7().to_string();
    for (customer, why) in [(&broke, "no credit"), (&unknown, "not found")] {
        let (status, order) = stack.place(customer, &product, 1).await;
        assert_eq!(status, StatusCode::CREATED, "{order}");
        assert_eq!(order["status"], "CANCELLED", "{why}: {order}");
        assert_eq!(order["saga"]["version"], 2, "{order}");
        let reason = order["failure_reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("check_account: ") && reason.contains(why), "{why}: {order}");
        assert_eq!(steps(&order), pairs(&[("check_account", "FAILED")]), "nothing to undo: {order}");
    }
    let inventory = stack.inventory_db.pool().await;
    let reservations: i64 = sqlx::query_scalar("SELECT count(*) FROM reservations")
        .fetch_one(&inventory)
        .await
        .expect("the reservations");
    assert_eq!(reservations, 0, "inventory was never asked");
    assert_eq!(stack.stock(&product).await, (5, 0, 0));
}

#[tokio::test]
async fn same_idempotency_key_returns_the_same_order() {
    let stack = Stack::start().await;
    let product = stack.product(100, 10).await;
    let customer = stack.customer(10_000).await;
    let body = json!({ "customer_id": customer, "items": [{ "product_id": product, "quantity": 1 }] });
    let post = |body: serde_json::Value| {
        stack.http.post(stack.url("/v1/orders")).header("Idempotency-Key", "order-42").json(&body).send()
    };

    let first = post(body.clone()).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: serde_json::Value = first.json().await.unwrap();
    let second = post(body.clone()).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    let second: serde_json::Value = second.json().await.unwrap();
    assert_eq!(first["order_id"], second["order_id"]);
    assert_eq!(second["status"], "CONFIRMED");
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (9, 1), "one reservation");
    assert_eq!(stack.balance(&customer).await, 9_900, "one charge");

    // Keys are scoped per customer: another customer's "order-42" is a new order.
    let neighbour = stack.customer(10_000).await;
    let theirs =
        post(json!({ "customer_id": neighbour, "items": [{ "product_id": product, "quantity": 1 }] }));
    let theirs = theirs.await.unwrap();
    assert_eq!(theirs.status(), StatusCode::CREATED);
    let theirs: serde_json::Value = theirs.json().await.unwrap();
    assert_ne!(theirs["order_id"], first["order_id"]);

    let other = json!({ "customer_id": customer, "items": [{ "product_id": product, "quantity": 2 }] });
    let reused = post(other).await.unwrap();
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem: serde_json::Value = reused.json().await.unwrap();
    assert_eq!(problem["errors"][0]["field"], "idempotency_key", "{problem}");
}

/// One saga's forward calls, made straight to the participants: a product
/// (10 units at 100 cents), a customer (1 000 cents), clients of inventory and
/// payment, and the saga's reserve (3 units) and charge (300 cents).
struct ForwardCalls {
    stack: Stack,
    product: String,
    customer: String,
    order: String,
    inventory: InventoryServiceClient<tonic::transport::Channel>,
    payment: PaymentServiceClient<tonic::transport::Channel>,
    reserve: inv::ReserveStockRequest,
    charge: pay::ChargeRequest,
}

impl ForwardCalls {
    async fn start() -> Self {
        let stack = Stack::start().await;
        let product = stack.product(100, 10).await;
        let customer = stack.customer(1_000).await;
        let inventory =
            InventoryServiceClient::new(channel_as("order", "inventory", &stack.inventory.grpc_url()).await);
        let payment =
            PaymentServiceClient::new(channel_as("order", "payment", &stack.payment.grpc_url()).await);
        let saga = uuid::Uuid::new_v4().to_string();
        let order = uuid::Uuid::new_v4().to_string();
        let reserve = inv::ReserveStockRequest {
            idempotency_key: format!("{saga}:reserve_stock"),
            reservation_id: saga.clone(),
            order_id: order.clone(),
            items: vec![inv::ReserveItem { product_id: product.clone(), quantity: 3 }],
        };
        let charge = pay::ChargeRequest {
            idempotency_key: format!("{saga}:charge_payment"),
            payment_id: saga,
            customer_id: customer.clone(),
            order_id: order.clone(),
            amount_cents: 300,
        };
        Self { stack, product, customer, order, inventory, payment, reserve, charge }
    }
}

/// A participant call retried after its response was lost: same key, so the
/// first result comes back and nothing changes twice.
#[tokio::test]
async fn participant_calls_are_idempotent_per_key() {
    let ForwardCalls { stack, product, customer, order, mut inventory, mut payment, reserve, charge } =
        ForwardCalls::start().await;

    let a = inventory.reserve_stock(reserve.clone()).await.unwrap().into_inner();
    let b = inventory.reserve_stock(reserve.clone()).await.unwrap().into_inner();
    assert_eq!(a, b);
    assert_eq!(stack.stock(&product).await, (7, 3, 0), "reserved once");

    let a = payment.charge(charge.clone()).await.unwrap().into_inner();
    let b = payment.charge(charge.clone()).await.unwrap().into_inner();
    assert_eq!(a, b);
    assert_eq!(stack.balance(&customer).await, 700, "charged once");

    // The same key for a different request is refused.
    let mut changed = charge.clone();
    changed.amount_cents = 1;
    assert_eq!(payment.charge(changed).await.unwrap_err().code(), Code::InvalidArgument);

    // A rejection is replayed too, even once it would succeed.
    let big = pay::ChargeRequest {
        idempotency_key: "big".into(),
        payment_id: uuid::Uuid::new_v4().to_string(),
        amount_cents: 5_000,
        ..charge.clone()
    };
    assert_eq!(payment.charge(big.clone()).await.unwrap_err().code(), Code::FailedPrecondition);
    // Credit comes from the gateway (services.toml): its certificate, not order's.
    PaymentServiceClient::new(channel_as("gateway", "payment", &stack.payment.grpc_url()).await)
        .add_credit(pay::AddCreditRequest {
            customer_id: customer.clone(),
            amount_cents: 10_000,
            idempotency_key: "credit".into(),
        })
        .await
        .unwrap();
    assert_eq!(payment.charge(big).await.unwrap_err().code(), Code::FailedPrecondition);

    // Compensation before the forward call arrived leaves a tombstone.
    let late = uuid::Uuid::new_v4().to_string();
    let release = inv::ReleaseReservationRequest {
        idempotency_key: format!("{late}:release_stock"),
        reservation_id: late.clone(),
        order_id: order.clone(),
        reason: "saga gave up".into(),
    };
    inventory.release_reservation(release).await.unwrap();
    let late_reserve = inv::ReserveStockRequest {
        idempotency_key: format!("{late}:reserve_stock"),
        reservation_id: late.clone(),
        ..reserve.clone()
    };
    assert_eq!(inventory.reserve_stock(late_reserve).await.unwrap_err().code(), Code::Aborted);
    assert_eq!(stack.stock(&product).await, (7, 3, 0), "the late reserve changed nothing");
}

/// `call` made `n` times at once.
async fn at_once<T, F, Fut>(n: usize, call: F) -> Vec<Result<T, tonic::Status>>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    futures::future::join_all((0..n).map(|_| call()))
        .await
        .into_iter()
        .map(|r| r.map(|r| r.into_inner()))
        .collect()
}

/// Duplicates of one call that arrive together (a client retrying while the
/// first is still running) take effect once, and every one of them answers
/// with that one outcome.
#[tokio::test]
async fn concurrent_duplicates_take_effect_once() {
    let ForwardCalls { stack, product, customer, inventory, payment, reserve, charge, .. } =
        ForwardCalls::start().await;

    let reserved = at_once(8, || {
        let (mut client, request) = (inventory.clone(), reserve.clone());
        async move { client.reserve_stock(request).await }
    })
    .await;
    let first = reserved[0].clone().unwrap();
    assert!(reserved.iter().all(|r| r.as_ref().ok() == Some(&first)), "{reserved:?}");
    assert_eq!(stack.stock(&product).await, (7, 3, 0), "reserved once");

    let charged = at_once(8, || {
        let (mut client, request) = (payment.clone(), charge.clone());
        async move { client.charge(request).await }
    })
    .await;
    let first = charged[0].clone().unwrap();
    assert!(charged.iter().all(|r| r.as_ref().ok() == Some(&first)), "{charged:?}");
    assert_eq!(stack.balance(&customer).await, 700, "charged once");

    // Duplicates of a rejected call all see the rejection, and nothing moved.
    let too_much = pay::ChargeRequest {
        idempotency_key: "too-much".into(),
        payment_id: uuid::Uuid::new_v4().to_string(),
        amount_cents: 5_000,
        ..charge.clone()
    };
    let refused = at_once(8, || {
        let (mut client, request) = (payment.clone(), too_much.clone());
        async move { client.charge(request).await }
    })
    .await;
    let rejected =
        |r: &Result<_, tonic::Status>| r.as_ref().is_err_and(|s| s.code() == Code::FailedPrecondition);
    assert!(refused.iter().all(rejected), "{refused:?}");
    assert_eq!(stack.balance(&customer).await, 700);
}

/// A reservation of several lines moves every line's units or none: a short
/// or unknown product leaves every counter as it was, and a release gives
/// every line back.
#[tokio::test]
async fn a_reservation_moves_every_line_or_none() {
    let stack = Stack::start().await;
    let (plenty, scarce) = (stack.product(100, 10).await, stack.product(250, 2).await);
    let mut inventory =
        InventoryServiceClient::new(channel_as("order", "inventory", &stack.inventory.grpc_url()).await);
    let reserve = |key: &str, lines: &[(&str, i64)]| inv::ReserveStockRequest {
        idempotency_key: key.into(),
        reservation_id: uuid::Uuid::new_v4().to_string(),
        order_id: uuid::Uuid::new_v4().to_string(),
        items: lines
            .iter()
            .map(|(p, q)| inv::ReserveItem { product_id: p.to_string(), quantity: *q })
            .collect(),
    };

    let short = inventory.reserve_stock(reserve("short", &[(&plenty, 3), (&scarce, 5)])).await.unwrap_err();
    assert_eq!(short.code(), Code::FailedPrecondition, "{short:?}");
    assert!(short.message().contains(&scarce) && short.message().contains("available 2"), "{short:?}");
    let unknown = uuid::Uuid::new_v4().to_string();
    let missing =
        inventory.reserve_stock(reserve("missing", &[(&plenty, 3), (&unknown, 1)])).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    assert_eq!(stack.stock(&plenty).await, (10, 0, 0), "a refused reservation moved nothing");
    assert_eq!(stack.stock(&scarce).await, (2, 0, 0));

    let request = reserve("both", &[(&plenty, 3), (&scarce, 2)]);
    let reservation = inventory.reserve_stock(request.clone()).await.unwrap().into_inner();
    assert_eq!(reservation.total_cents, 3 * 100 + 2 * 250);
    let mut lines: Vec<_> =
        reservation.lines.iter().map(|l| (l.product_id.clone(), l.quantity, l.unit_price_cents)).collect();
    lines.sort();
    let mut expected = vec![(plenty.clone(), 3, 100), (scarce.clone(), 2, 250)];
    expected.sort();
    assert_eq!(lines, expected);
    assert_eq!((stack.stock(&plenty).await, stack.stock(&scarce).await), ((7, 3, 0), (0, 2, 0)));

    let release = inv::ReleaseReservationRequest {
        idempotency_key: "both:release".into(),
        reservation_id: request.reservation_id.clone(),
        order_id: request.order_id.clone(),
        reason: "test".into(),
    };
    inventory.release_reservation(release).await.unwrap();
    let stock = (stack.stock(&plenty).await, stack.stock(&scarce).await);
    assert_eq!(stock, ((10, 0, 0), (2, 0, 0)), "every line released");
}

/// Kills the order service at each point of a saga; a fresh instance on the
/// same database resumes every saga to its end, with no double effect.
#[tokio::test]
async fn crashed_orchestrator_resumes_at_every_step() {
    // A charge that succeeded commits with confirm_order (one statement), so
    // there is no point between the two commits: a crash before confirm_order
    // commits resumes at charge_payment, which payment answers from its
    // idempotency record.
    let points = [
        "before:check_account",
        "after_call:check_account",
        "after_commit:check_account",
        "before:reserve_stock",
        "after_call:reserve_stock",
        "after_commit:reserve_stock",
        "before:charge_payment",
        "after_call:charge_payment",
        "before:confirm_order",
        "after_call:confirm_order",
    ];
    let mut stack = Stack::start().await;
    let product = stack.product(100, 100).await;
    let customer = stack.customer(100_000).await;
    for point in points {
        stack.restart_order(|s| s.saga.crash_point = point.into()).await;
        let (status, order) = stack.place(&customer, &product, 1).await;
        assert_eq!(status, StatusCode::CREATED, "{point}: {order}");
        assert_eq!(order["status"], "PENDING", "{point}: the replica stopped dead mid-saga: {order}");
        stack.restart_order(|_| {}).await;
        let order = stack.settled(order["order_id"].as_str().unwrap()).await;
        assert_eq!(order["status"], "CONFIRMED", "{point}: {order}");
    }
    let n = points.len() as i64;
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (100 - n, n), "each order reserved exactly once");
    assert_eq!(stack.balance(&customer).await, 100_000 - 100 * n, "each order charged exactly once");

    // And in the middle of a compensation.
    let poor = stack.customer(50).await;
    stack.restart_order(|s| s.saga.crash_point = "after_call:release_stock".into()).await;
    let (_, order) = stack.place(&poor, &product, 1).await;
    assert_eq!(order["status"], "PENDING", "{order}");
    stack.restart_order(|_| {}).await;
    let order = stack.settled(order["order_id"].as_str().unwrap()).await;
    assert_eq!(order["status"], "CANCELLED", "{order}");
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (100 - n, n), "released exactly once");
    assert_eq!(stack.balance(&poor).await, 50);
}

/// Several replicas resuming the same crashed sagas never run one twice.
#[tokio::test]
async fn replicas_do_not_run_a_saga_twice() {
    let mut stack = Stack::start_with(|s| s.saga.crash_point = "before:check_account".into()).await;
    let product = stack.product(10, 1_000).await;
    let customer = stack.customer(1_000_000).await;
    let mut ids = vec![];
    for _ in 0..20 {
        let (_, order) = stack.place(&customer, &product, 1).await;
        ids.push(order["order_id"].as_str().unwrap().to_string());
    }
    stack.order.kill();
    // Two fresh replicas race for the 20 sagas (three replicas starting at once: patient calls).
    let patient = system_tests::patient_calls;
    let settings = || {
        let mut s = system_tests::order_settings(
            &stack.order_db,
            &stack.kafka_for("order"),
            &stack.inventory.grpc_url(),
            &stack.payment.grpc_url(),
        );
        patient(&mut s);
        s
    };
    let _a = system_tests::start_order(settings()).await;
    let _b = system_tests::start_order(settings()).await;
    stack.restart_order(patient).await;
    for id in &ids {
        let order = stack.settled(id).await;
        assert_eq!(order["status"], "CONFIRMED", "{order}");
        for step in order["saga"]["steps"].as_array().unwrap() {
            // CreateOrder recorded check_account's first attempt before the
            // crash point; the one replica that took the saga over recorded
            // the second. A saga driven twice would show a third.
            let expected = if step["name"] == "check_account" { 2 } else { 1 };
            assert_eq!(step["attempts"], expected, "a step ran twice: {order}");
        }
    }
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (980, 20));
    assert_eq!(stack.balance(&customer).await, 1_000_000 - 200);
}

/// A participant that accepts connections and never answers: the charge's
/// deadline passes and the saga compensates instead of hanging. The charge
/// may have happened, so the refund must reach payment before the order is
/// cancelled: it retries until payment is reachable again.
#[tokio::test]
async fn a_participant_that_never_answers_leads_to_compensation() {
    let (url, held) = system_tests::unanswering_server().await;
    let mut stack = Stack::start_with(|s| system_tests::charges_at_on_v1(s, &url)).await;
    let product = stack.product(100, 5).await;
    let customer = stack.customer(1_000).await;
    let (_, order) = stack.place(&customer, &product, 1).await;
    let id = order["order_id"].as_str().unwrap().to_string();
    let order = sagaworks_test_support::eventually(
        "compensation to start",
        std::time::Duration::from_secs(20),
        || async {
            let (_, o) = stack.get(&format!("/v1/orders/{id}")).await;
            (o["saga"]["status"] == "COMPENSATING").then_some(o)
        },
    )
    .await;
    assert_eq!(order["status"], "PENDING", "{order}");
    let charge =
        order["saga"]["steps"].as_array().unwrap().iter().find(|s| s["name"] == "charge_payment").unwrap();
    assert_eq!(charge["status"], "FAILED", "{order}");
    assert_eq!(
        order["saga"]["current_step"], "refund_payment",
        "an unanswered charge may have happened: {order}"
    );

    // Payment answers again (the order service is restarted pointing at the real one).
    stack.restart_order(|s| s.saga.start_version = 1).await;
    let order = stack.settled(&id).await;
    assert_eq!(order["status"], "CANCELLED", "{order}");
    assert_eq!(
        steps(&order).into_iter().map(|(n, _)| n).collect::<Vec<_>>(),
        ["reserve_stock", "charge_payment", "refund_payment", "release_stock"]
    );
    assert_eq!(stack.stock(&product).await, (5, 0, 0), "stock released");
    assert_eq!(stack.balance(&customer).await, 1_000, "nothing charged");
    held.abort();
}

/// 50 concurrent orders for 10 units: exactly 10 confirmed, stock never
/// negative, and money is conserved.
#[tokio::test]
async fn concurrent_orders_never_oversell() {
    // 50 orders at once: patient calls, so that only the stock decides which are confirmed.
    let stack = Stack::start_with(system_tests::patient_calls).await;
    let product = stack.product(700, 10).await;
    let mut customers = vec![];
    for _ in 0..5 {
        customers.push(stack.customer(100_000).await);
    }
    let orders = futures::future::join_all((0..50).map(|i| {
        let customer = customers[i % customers.len()].clone();
        let stack = &stack;
        let product = product.clone();
        async move { stack.place(&customer, &product, 1).await }
    }))
    .await;
    let mut confirmed = 0;
    let mut confirmed_total = 0;
    let mut reasons = std::collections::BTreeSet::new();
    for (status, order) in &orders {
        assert_eq!(*status, StatusCode::CREATED, "{order}");
        let order = stack.settled(order["order_id"].as_str().unwrap()).await;
        if order["status"] == "CONFIRMED" {
            confirmed += 1;
            confirmed_total += order["total_cents"].as_i64().unwrap();
        } else {
            reasons.insert(order["failure_reason"].to_string());
        }
    }
    assert_eq!(confirmed, 10, "the others cancelled for: {reasons:?}");
    let (available, reserved, sold) = stack.stock(&product).await;
    assert_eq!((available, reserved + sold), (0, 10), "never oversold, never negative");
    // Inventory commits the confirmed orders' reservations in batches (one
    // product in many of them): every unit ends sold, once.
    let stock = sagaworks_test_support::eventually(
        "every reservation committed",
        std::time::Duration::from_secs(30),
        || async {
            let stock = stack.stock(&product).await;
            (stock.1 == 0).then_some(stock)
        },
    )
    .await;
    assert_eq!(stock, (0, 0, 10));
    let mut spent = 0;
    for c in &customers {
        spent += 100_000 - stack.balance(c).await;
    }
    assert_eq!(spent, confirmed_total, "charges - refunds = confirmed totals");
    assert_eq!(confirmed_total, 10 * 700);
}

/// Runs `second` on its own transaction while `first`'s transaction (already
/// holding its write) is open; checks that `second` waits, commits `first`,
/// and returns what `second` answered once it could go on (then committed).
async fn while_in_flight<T: Send + 'static>(
    url: &str,
    first: impl for<'c> FnOnce(&'c mut sqlx::PgConnection) -> futures::future::BoxFuture<'c, ()>,
    second: impl for<'c> FnOnce(&'c mut sqlx::PgConnection) -> futures::future::BoxFuture<'c, T> + Send + 'static,
) -> T {
    use sqlx::Connection;
    let mut a = sqlx::PgConnection::connect(url).await.unwrap();
    let mut tx = a.begin().await.unwrap();
    first(&mut tx).await;
    let url = url.to_string();
    let other = tokio::spawn(async move {
        let mut b = sqlx::PgConnection::connect(&url).await.unwrap();
        let mut tx = b.begin().await.unwrap();
        let answer = second(&mut tx).await;
        tx.commit().await.unwrap();
        answer
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!other.is_finished(), "the second operation waits for the first one's transaction");
    tx.commit().await.unwrap();
    other.await.unwrap()
}

/// A new reservation or charge takes no advisory lock (it is one statement;
/// the primary key serialises it). A release or refund that arrives while it
/// is still in flight waits for it and undoes it; a reserve or charge that
/// arrives while a release or refund of the same id (a tombstone) is in
/// flight waits for it and is refused.
#[tokio::test]
async fn a_compensation_racing_its_forward_call_waits_for_it() {
    use inventory::stock;
    use payment::ledger;
    let stack = Stack::start().await;
    let product: uuid::Uuid = stack.product(100, 10).await.parse().unwrap();
    let customer: uuid::Uuid = stack.customer(1_000).await.parse().unwrap();
    let items = std::collections::BTreeMap::from([(product, 3)]);
    let (inventory_db, payment_db) = (stack.inventory_db.url.clone(), stack.payment_db.url.clone());

    // Reserve in flight, then a release of the same reservation.
    let (id, order) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let outbox = sagaworks_outbox::OutboxWriter::new("inventory");
    let (o1, o2, items1) = (outbox.clone(), outbox.clone(), items.clone());
    let released = while_in_flight(
        &inventory_db,
        move |c| {
            Box::pin(async move {
                stock::reserve(c, &o1, id, order, &items1).await.unwrap();
            })
        },
        move |c| Box::pin(async move { stock::release(c, &o2, id, order, "gave up").await }),
    )
    .await
    .unwrap();
    assert_eq!(released.status, stock::ReservationStatus::Released);
    assert_eq!(released.lines.len(), 1, "it released the reservation it waited for");
    assert_eq!(stack.stock(&product.to_string()).await, (10, 0, 0));

    // A release (tombstone) in flight, then the late reserve.
    let id = uuid::Uuid::new_v4();
    let (o1, o2, items2) = (outbox.clone(), outbox.clone(), items.clone());
    let late = while_in_flight(
        &inventory_db,
        move |c| {
            Box::pin(async move {
                stock::release(c, &o1, id, order, "gave up").await.unwrap();
            })
        },
        move |c| Box::pin(async move { stock::reserve(c, &o2, id, order, &items2).await.map(|_| ()) }),
    )
    .await;
    assert!(matches!(late, Err(inventory::error::Error::AlreadyReleased(_))), "{late:?}");
    assert_eq!(stack.stock(&product.to_string()).await, (10, 0, 0));

    // An existing reservation: a release in flight holds its row, and the
    // commit (the confirmed order's) waits for it and is refused.
    let id = uuid::Uuid::new_v4();
    {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&inventory_db).await.unwrap();
        let mut tx = c.begin().await.unwrap();
        stock::reserve(&mut tx, &outbox, id, order, &items).await.unwrap();
        tx.commit().await.unwrap();
    }
    let (o1, o2) = (outbox.clone(), outbox.clone());
    let committed = while_in_flight(
        &inventory_db,
        move |c| {
            Box::pin(async move {
                stock::release(c, &o1, id, order, "gave up").await.unwrap();
            })
        },
        move |c| Box::pin(async move { stock::commit(c, &o2, id, order).await.map(|_| ()) }),
    )
    .await;
    assert!(matches!(committed, Err(inventory::error::Error::AlreadyReleased(_))), "{committed:?}");
    assert_eq!(stack.stock(&product.to_string()).await, (10, 0, 0));

    // The same two races at payment.
    let outbox = sagaworks_outbox::OutboxWriter::new("payment");
    let charge = move |id| ledger::Charge {
        payment_id: id,
        customer_id: customer,
        order_id: order,
        amount_cents: 300,
    };
    let id = uuid::Uuid::new_v4();
    let (o1, o2) = (outbox.clone(), outbox.clone());
    let refunded = while_in_flight(
        &payment_db,
        move |c| {
            Box::pin(async move {
                ledger::charge(c, &o1, charge(id)).await.unwrap();
            })
        },
        move |c| Box::pin(async move { ledger::refund(c, &o2, id, order, "gave up").await }),
    )
    .await
    .unwrap();
    assert_eq!(refunded.status, ledger::PaymentStatus::Refunded, "it refunded the charge it waited for");
    assert_eq!(stack.balance(&customer.to_string()).await, 1_000);

    let id = uuid::Uuid::new_v4();
    let (o1, o2) = (outbox.clone(), outbox.clone());
    let late = while_in_flight(
        &payment_db,
        move |c| {
            Box::pin(async move {
                ledger::refund(c, &o1, id, order, "gave up").await.unwrap();
            })
        },
        move |c| Box::pin(async move { ledger::charge(c, &o2, charge(id)).await.map(|_| ()) }),
    )
    .await;
    assert!(matches!(late, Err(payment::error::Error::AlreadyRefunded(_))), "{late:?}");
    assert_eq!(stack.balance(&customer.to_string()).await, 1_000);
}

/// Inventory commits a batch of confirmed orders' reservations in two
/// statements: every line's units move once (a product in several
/// reservations too), each reservation gets its own event, a repeat changes
/// nothing, and one released or unknown reservation fails the whole batch.
#[tokio::test]
async fn reservations_are_committed_in_batches_all_or_nothing() {
    use inventory::stock::{self, ReservationStatus, ToCommit};
    use sqlx::Connection;
    let stack = Stack::start().await;
    let p: uuid::Uuid = stack.product(100, 20).await.parse().unwrap();
    let q: uuid::Uuid = stack.product(300, 20).await.parse().unwrap();
    let outbox = sagaworks_outbox::OutboxWriter::new("inventory");
    let mut conn = sqlx::PgConnection::connect(&stack.inventory_db.url).await.unwrap();
    let mut reserve = async |items: &[(uuid::Uuid, i64)]| {
        let id = uuid::Uuid::new_v4();
        let items = items.iter().copied().collect();
        // The reservation's order: its own id, so the commits below can name it.
        stock::reserve(&mut conn, &outbox, id, id, &items).await.unwrap();
        id
    };
    let batch = [reserve(&[(p, 1)]).await, reserve(&[(p, 2), (q, 1)]).await, reserve(&[(q, 3)]).await];
    let (released, fresh) = (reserve(&[(p, 4)]).await, reserve(&[(q, 5)]).await);
    stock::release(&mut conn, &outbox, released, uuid::Uuid::new_v4(), "gave up").await.unwrap();
    assert_eq!(stack.stock(&p.to_string()).await, (17, 3, 0));
    assert_eq!(stack.stock(&q.to_string()).await, (11, 9, 0));
    let requests = |ids: &[uuid::Uuid]| -> Vec<ToCommit> {
        ids.iter()
            .map(|&reservation_id| ToCommit {
                reservation_id,
                order_id: reservation_id,
                span: tracing::Span::none(),
            })
            .collect()
    };
    let events = async |conn: &mut sqlx::PgConnection| -> Vec<String> {
        sqlx::query_scalar(
            "SELECT aggregate_id FROM outbox_ledger WHERE event_type = 'StockCommitted' ORDER BY seq",
        )
        .fetch_all(conn)
        .await
        .unwrap()
    };

    let committed = stock::commit_all(&mut conn, &outbox, &requests(&batch)).await.unwrap();
    assert!(committed.iter().all(|r| r.status == ReservationStatus::Committed));
    assert_eq!(stack.stock(&p.to_string()).await, (17, 0, 3), "both lines of p moved");
    assert_eq!(stack.stock(&q.to_string()).await, (11, 5, 4), "q's reservation of 5 stays");
    let mut expected: Vec<String> = batch.iter().map(|id| id.to_string()).collect();
    expected.sort();
    assert_eq!(events(&mut conn).await, expected, "one event per reservation, in lock order");

    // Committing them again (a redelivery that the inbox missed) changes nothing.
    stock::commit_all(&mut conn, &outbox, &requests(&batch)).await.unwrap();
    assert_eq!(stack.stock(&p.to_string()).await, (17, 0, 3));
    assert_eq!(events(&mut conn).await.len(), 3);

    // A batch with a released or an unknown reservation: an error, and the
    // caller's transaction is rolled back, the fresh reservation's commit with it.
    for bad in [released, uuid::Uuid::new_v4()] {
        let mut tx = conn.begin().await.unwrap();
        let failed = stock::commit_all(&mut tx, &outbox, &requests(&[fresh, bad])).await;
        match failed {
            Err(inventory::error::Error::AlreadyReleased(id)) if bad == released => assert_eq!(id, bad),
            Err(inventory::error::Error::ReservationNotFound(id)) if bad != released => assert_eq!(id, bad),
            other => panic!("{other:?}"),
        }
        tx.rollback().await.unwrap();
        assert_eq!(stack.stock(&q.to_string()).await, (11, 5, 4), "nothing of the batch took effect");
    }
}

/// Sagas of the release before the saga library (tables `sagas` and
/// `saga_steps`), finished and in flight, move to the library's tables when
/// the new order service migrates, and the in-flight ones are resumed where
/// they stood: one mid-saga (reserved, about to be charged, its reservation's
/// prices read from the migrated data) and one not yet started.
#[tokio::test]
async fn sagas_of_the_previous_release_are_migrated_and_resumed() {
    let mut calls = ForwardCalls::start().await;
    calls.inventory.reserve_stock(calls.reserve.clone()).await.expect("the old saga's reservation");
    calls.stack.order.kill();
    let db = calls.stack.order_db.pool().await;
    // The order database as the previous release left it.
    sqlx::raw_sql(
        "DROP TABLE saga_operator_actions; DROP TABLE saga_instance_steps; DROP TABLE saga_instance_inputs;
         DROP TABLE saga_instances; DROP TABLE saga_versions;
         DELETE FROM _sqlx_migrations
         WHERE version IN (20261204000000, 20261204000001, 20261204000003, 20261205000000, 20261206000000);
         CREATE TABLE sagas (
             id UUID PRIMARY KEY, order_id UUID NOT NULL UNIQUE REFERENCES orders (id),
             status TEXT NOT NULL, current_step TEXT NOT NULL, failure_reason TEXT,
             lease_owner TEXT, lease_expires_at TIMESTAMPTZ, next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
             created_at TIMESTAMPTZ NOT NULL DEFAULT now(), updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
             finished_at TIMESTAMPTZ);
         CREATE TABLE saga_steps (
             saga_id UUID NOT NULL REFERENCES sagas (id), name TEXT NOT NULL, status TEXT NOT NULL,
             attempts INT NOT NULL DEFAULT 0, error TEXT, started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
             finished_at TIMESTAMPTZ, PRIMARY KEY (saga_id, name));",
    )
    .execute(&db)
    .await
    .expect("the previous schema");
    let customer: uuid::Uuid = calls.customer.parse().unwrap();
    let product: uuid::Uuid = calls.product.parse().unwrap();
    let old = |order: uuid::Uuid, status: &'static str, quantity: i64, price: i64, key: &'static str| {
        let db = db.clone();
        async move {
            sqlx::query(
                "WITH o AS (
                     INSERT INTO orders (id, customer_id, status, total_cents, idempotency_key, request_hash)
                     VALUES ($1, $2, $3, $4 * $5, $6, '\\x00') RETURNING id)
                 INSERT INTO order_items (order_id, product_id, quantity, unit_price_cents)
                 SELECT id, $7, $4, $5 FROM o",
            )
            .bind(order)
            .bind(customer)
            .bind(status)
            .bind(quantity)
            .bind(price)
            .bind(key)
            .bind(product)
            .execute(&db)
            .await
            .expect("an order of the previous release");
        }
    };
    // Reserved (3 units at 100), about to be charged.
    let (charging, charging_saga) = (calls.order.parse().unwrap(), calls.reserve.reservation_id.clone());
    old(charging, "PENDING", 3, 100, "old-1").await;
    // Not started yet.
    let (fresh, fresh_saga) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    old(fresh, "PENDING", 1, 0, "old-2").await;
    // Finished long ago (the previous release left current_step at the pivot).
    let (done, done_saga) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    old(done, "CONFIRMED", 1, 100, "old-3").await;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO sagas (id, order_id, status, current_step) VALUES
             ('{charging_saga}', '{charging}', 'RUNNING', 'charge_payment'),
             ('{fresh_saga}', '{fresh}', 'RUNNING', 'reserve_stock'),
             ('{done_saga}', '{done}', 'COMPLETED', 'charge_payment');
         INSERT INTO saga_steps (saga_id, name, status, attempts, finished_at) VALUES
             ('{charging_saga}', 'reserve_stock', 'SUCCEEDED', 1, now()),
             ('{done_saga}', 'reserve_stock', 'SUCCEEDED', 1, now()),
             ('{done_saga}', 'charge_payment', 'SUCCEEDED', 1, now()),
             ('{done_saga}', 'confirm_order', 'SUCCEEDED', 1, now());
         INSERT INTO saga_steps (saga_id, name, status, attempts) VALUES ('{charging_saga}', 'charge_payment', 'RUNNING', 1);"
    )))
    .execute(&db)
    .await
    .expect("sagas of the previous release");

    calls.stack.restart_order(|_| {}).await;
    let stack = &calls.stack;
    let order = stack.settled(&charging.to_string()).await;
    assert_eq!(order["status"], "CONFIRMED", "{order}");
    assert_eq!(order["total_cents"], 300, "{order}");
    let charge = system_tests::faults::step(&order, "charge_payment").expect("a charge step");
    assert_eq!(charge["attempts"], 2, "the charge resumed: {order}");
    let order = stack.settled(&fresh.to_string()).await;
    assert_eq!(order["status"], "CONFIRMED", "{order}");
    assert_eq!(order["total_cents"], 100, "{order}");
    assert_eq!(stack.balance(&calls.customer).await, 1_000 - 400, "charged once each");
    sagaworks_test_support::eventually(
        "both reservations committed",
        std::time::Duration::from_secs(30),
        || async { (stack.stock(&calls.product).await == (6, 0, 4)).then_some(()) },
    )
    .await;
    let (status, saga) = stack.get(&format!("/v1/sagas/{done_saga}")).await;
    assert_eq!(status, StatusCode::OK, "{saga}");
    assert_eq!(saga["status"], "COMPLETED");
    assert!(saga.get("current_step").is_none(), "finished: {saga}");
    assert_eq!(saga["steps"].as_array().map(Vec::len), Some(3), "{saga}");
}
