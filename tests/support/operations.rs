//! What the operations tests (`tests/system/operations.rs`, `tests/system/inspector.rs`)
//! need to find: a saga stuck as it would be in production, and messages a
//! consumer cannot handle.

use crate::Stack;
use reqwest::StatusCode;
use serde_json::Value;
use std::time::Duration;

/// Stuck after this long without progress (the order service's `saga.stuck_after_ms`).
pub const STUCK_AFTER_MS: u64 = 200;

/// Moves the saga of `order_id` an hour into the future, unleased (as after
/// a long backoff): nobody drives it until an operator acts. Returns its id.
pub async fn park(stack: &Stack, order_id: &str) -> String {
    let db = stack.order_db.pool().await;
    sqlx::query_scalar(
        "UPDATE saga_instances SET next_attempt_at = now() + interval '1 hour', lease_owner = NULL,
                lease_expires_at = NULL
         WHERE key = $1 AND status IN ('RUNNING', 'COMPENSATING') RETURNING id::text",
    )
    .bind(order_id)
    .fetch_one(&db)
    .await
    .expect("an unfinished saga")
}

/// A saga whose replica stopped dead before `charge_payment` (stock
/// reserved), parked; the order service restarted without faults. Returns
/// the stack, the product, the customer (1 000 cents, buying 2 x 100) and
/// the order.
pub async fn stuck_before_charge() -> (Stack, String, String, String) {
    let mut stack = Stack::start_with(|s| s.saga.crash_point = "before:charge_payment".into()).await;
    let product = stack.product(100, 10).await;
    let customer = stack.customer(1_000).await;
    let (_, order) = stack.place(&customer, &product, 2).await;
    assert_eq!(order["status"], "PENDING", "{order}");
    let order_id = order["order_id"].as_str().unwrap().to_string();
    stack.order.kill();
    park(&stack, &order_id).await;
    stack.restart_order(|s| s.saga.stuck_after_ms = STUCK_AFTER_MS).await;
    (stack, product, customer, order_id)
}

/// Sends `payload` with `key` and `headers` to the stack's `order` topic
/// as it is: without a `ce_id` header it is no CloudEvent, and both of the
/// topic's consumer groups (inventory, order's timeline) dead-letter it.
pub async fn send_raw(stack: &Stack, key: &str, payload: &str, headers: &[(&str, &str)]) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer =
        sagaworks_outbox::kafka::client_config(&stack.kafka, &[]).create().unwrap();
    let topic = sagaworks_outbox::kafka::topic_name(&stack.kafka, "order");
    let headers = headers
        .iter()
        .fold(OwnedHeaders::new(), |h, (key, value)| h.insert(Header { key, value: Some(*value) }));
    let record = FutureRecord::to(&topic).key(key).payload(payload).headers(headers);
    producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).expect("sent");
    sagaworks_outbox::kafka::close(producer, "test-producer", Duration::from_secs(5)).await;
}

/// The dead letters of `topic` that the gateway lists for `query`, or `None` while it
/// answers 503: reading the dead-letter topic waits on the broker, and a broker that
/// answers slowly makes the call unavailable for now (the caller asks again). Any other
/// answer than 200 fails the test.
pub async fn dead_letters(stack: &Stack, topic: &str, query: &str) -> Option<Vec<Value>> {
    let (status, page) = stack.get(&format!("/v1/admin/dlq/{topic}/messages?{query}")).await;
    if status == StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    assert_eq!(status, StatusCode::OK, "{page}");
    Some(page["messages"].as_array().cloned().unwrap_or_default())
}
