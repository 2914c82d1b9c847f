//! The order saga's fault matrix, generated from its definition
//! (`sagaworks_saga::testing`), against the whole system: real inventory
//! and payment services, each on its own PostgreSQL database, and a real
//! broker. One case per step and fault, each on a stack of its own, for
//! every version the order service drives: `<step>::<fault>` for version 2
//! (the one new orders start on), `v1::<step>::<fault>` for version 1, whose
//! sagas start on a replica with `saga.start_version = 1` and finish on
//! version 1's shape. A new step in `order::saga::definition` brings its
//! cases here with no change to this file.
//!
//! Each case places one order with the case's faults on the order replica
//! (and, when it crashes, resumes the saga on a fresh replica), then checks
//! the saga's and the order's end and the invariants at rest: nothing stays
//! reserved, stock is sold exactly once for a confirmed order and not at all
//! for a cancelled one, the money charged equals the confirmed order's total,
//! and the compensations that ran are the expected ones.

use sagaworks_resilience::ClientSettings;
use sagaworks_saga::testing::{self, Case};
use sagaworks_saga::{SagaStatus, Shape};
use std::time::Duration;
use system_tests::Stack;

const PRICE: i64 = 150;
const STOCK: i64 = 10;
const CREDIT: i64 = 10_000;
const QUANTITY: i64 = 2;

/// Shorter than the tests' default: a crashed replica's sagas are taken over sooner.
const LEASE_MS: u64 = 1_500;

async fn run_case(case: Case, version: u32) -> Result<(), String> {
    let mut stack = Stack::start_with(|s| {
        case.apply(&mut s.saga);
        s.saga.lease_ms = LEASE_MS;
        s.saga.start_version = version;
    })
    .await;
    let product = stack.product(PRICE, STOCK).await;
    let customer = stack.customer(CREDIT).await;
    let (status, order) = stack.place(&customer, &product, QUANTITY).await;
    assert!(status.is_success(), "placed: {status} {order}");
    let id = order["order_id"].as_str().ok_or("an order id")?.to_string();
    if case.crashes() {
        if !case.ends_before_crash() {
            assert_eq!(order["status"], "PENDING", "the replica stopped dead mid-saga: {order}");
        }
        stack
            .restart_order(|s| {
                s.saga.lease_ms = LEASE_MS;
                s.saga.start_version = version;
                case.apply_resumed(&mut s.saga);
            })
            .await;
    }
    let order = stack.settled(&id).await;
    assert_eq!(
        order["saga"]["version"].as_u64(),
        Some(u64::from(version)),
        "the version it started on: {order}"
    );

    let expect = &case.expect;
    let completed = expect.status == SagaStatus::Completed;
    assert_eq!(order["saga"]["status"], expect.status.as_str(), "{order}");
    assert_eq!(order["status"], if completed { "CONFIRMED" } else { "CANCELLED" }, "{order}");
    assert!(order["saga"].get("current_step").is_none(), "a finished saga has no current step: {order}");
    let steps = system_tests::steps(&order);
    for step in &expect.effective {
        assert!(steps.contains(&(step.to_string(), "SUCCEEDED".into())), "{step} succeeded: {order}");
    }
    let compensations: Vec<&str> = steps
        .iter()
        .filter(|(name, _)| name == "release_stock" || name == "refund_payment")
        .map(|(name, status)| {
            assert_eq!(status, "SUCCEEDED", "{name} ends SUCCEEDED: {order}");
            name.as_str()
        })
        .collect();
    assert_eq!(compensations, expect.compensations, "compensations: {order}");

    // At rest: a confirmed order's reservation is committed (inventory consumes
    // OrderConfirmed), a cancelled one's released; nothing stays reserved.
    let rest = if completed { (STOCK - QUANTITY, 0, QUANTITY) } else { (STOCK, 0, 0) };
    sagaworks_test_support::eventually("stock at rest", Duration::from_secs(30), || async {
        (stack.stock(&product).await == rest).then_some(())
    })
    .await;
    let charged = if completed { PRICE * QUANTITY } else { 0 };
    if completed {
        assert_eq!(
            order["total_cents"].as_i64(),
            Some(charged),
            "the reservation's prices were recorded: {order}"
        );
    }
    assert_eq!(stack.balance(&customer).await, CREDIT - charged, "money charged == confirmed total: {order}");
    Ok(())
}

/// The shapes of every version of the order saga, newest first: its definitions
/// need participant channels, which connect lazily and are never used here.
fn shapes() -> Vec<Shape> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let _guard = runtime.enter();
    let channel = |name| {
        sagaworks_resilience::channel(name, &ClientSettings::with_url("http://127.0.0.1:9"), None)
            .expect("a lazy channel")
    };
    order::saga::versions(channel("inventory"), channel("payment")).shapes()
}

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = Vec::new();
    for (i, shape) in shapes().into_iter().enumerate() {
        let version = shape.version;
        let prefix = if i == 0 { String::new() } else { format!("v{version}::") };
        trials.extend(testing::trials(&prefix, &shape, move |case| run_case(case, version)));
    }
    libtest_mimic::run(&args, trials).exit();
}
