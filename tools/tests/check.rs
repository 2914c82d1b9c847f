//! The invariant checks against real PostgreSQL databases carrying the
//! services' own migrations, and a real broker fed by the real outbox relay.
//! Each test starts from one consistent state (which passes every check),
//! injects exactly one kind of drift, and shows the check for it fails and
//! says why.

use chrono::{DateTime, TimeDelta, Utc};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sagaworks_config::KafkaSettings;
use sagaworks_outbox::{Relay, RelaySettings};
use sagaworks_test_support::{Broker, TestDatabase};
use sagaworks_tools::check::coverage::{self, Kill, Minimums};
use sagaworks_tools::check::{Verdict, events, money, orders, stock};
use sagaworks_tools::pg::Databases;
use sagaworks_tools::{FixtureCustomer, FixtureProduct};
use sqlx::migrate::Migrator;
use sqlx::{AssertSqlSafe, PgPool};
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

async fn service_db(service: &str) -> (TestDatabase, PgPool) {
    let db = TestDatabase::create(&format!("tools_{service}")).await;
    let pool = db.pool().await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations").join(service);
    // As the service runs them: order's start with the saga library's tables.
    let mut migrators = Vec::new();
    if service == "order" {
        migrators.push(sagaworks_saga::migrator());
    }
    migrators.extend([Migrator::new(dir).await.unwrap(), sagaworks_outbox::migrator()]);
    sagaworks_runtime::db::migrate(&pool, &mut migrators).await.unwrap();
    // As a verification run sets up: the relay deletes what it published.
    sagaworks_outbox::ledger::install(&pool).await.unwrap();
    (db, pool)
}

async fn exec(pool: &PgPool, sql: &str) {
    // The tests' own statements, drift injected on purpose.
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned())).execute(pool).await.unwrap();
}

const PRODUCT: &str = "00000000-0000-0000-0000-0000000000a1";
const CUSTOMER: &str = "00000000-0000-0000-0000-0000000000c1";
/// Orders: confirmed; cancelled after its reservation and charge (released,
/// refunded); cancelled before reserving anything.
const CONFIRMED: &str = "00000000-0000-0000-0000-0000000000d1";
const CANCELLED: &str = "00000000-0000-0000-0000-0000000000d2";
const REFUSED: &str = "00000000-0000-0000-0000-0000000000d3";
/// Their sagas (= reservation and payment ids).
const SAGA_CONFIRMED: &str = "00000000-0000-0000-0000-0000000000e1";
const SAGA_CANCELLED: &str = "00000000-0000-0000-0000-0000000000e2";
const SAGA_REFUSED: &str = "00000000-0000-0000-0000-0000000000e3";

/// The three service databases in one consistent state, kept alive with it.
struct Ledger {
    _dbs: [TestDatabase; 3],
    dbs: Databases,
}

impl Ledger {
    fn order(&self) -> &PgPool {
        &self.dbs.order
    }
    fn inventory(&self) -> &PgPool {
        &self.dbs.inventory
    }
    fn payment(&self) -> &PgPool {
        &self.dbs.payment
    }
}

/// A product stocked with 10: 2 sold to the confirmed order (a committed
/// reservation), 1 reserved and released by the cancelled one, 8 available,
/// nothing reserved. A customer with 10000 cents: 500 charged for the
/// confirmed order, 250 charged and refunded for the cancelled one. Each
/// order's saga finished to match, and every service wrote its events to its
/// outbox (not published yet).
async fn consistent_ledger() -> Ledger {
    let (order, inventory, payment) =
        tokio::join!(service_db("order"), service_db("inventory"), service_db("payment"));
    exec(&inventory.1, &format!(
        "INSERT INTO products (id, sku, name, price_cents, available, reserved, sold) VALUES ('{PRODUCT}', 's', 'n', 250, 8, 0, 2);
         INSERT INTO reservations (id, order_id, status, total_cents) VALUES
           ('{SAGA_CONFIRMED}', '{CONFIRMED}', 'COMMITTED', 500), ('{SAGA_CANCELLED}', '{CANCELLED}', 'RELEASED', 250);
         INSERT INTO reservation_lines VALUES ('{SAGA_CONFIRMED}', '{PRODUCT}', 2, 250), ('{SAGA_CANCELLED}', '{PRODUCT}', 1, 250);"
    )).await;
    exec(
        &order.1,
        &format!(
            "INSERT INTO orders (id, customer_id, status, total_cents, idempotency_key, request_hash) VALUES
           ('{CONFIRMED}', '{CUSTOMER}', 'CONFIRMED', 500, 'k1', '\\x00'),
           ('{CANCELLED}', '{CUSTOMER}', 'CANCELLED', 250, 'k2', '\\x00'),
           ('{REFUSED}', '{CUSTOMER}', 'CANCELLED', 300, 'k3', '\\x00');
         INSERT INTO saga_instances (id, saga_type, key, status, current_step, data, finished_at) VALUES
           ('{SAGA_CONFIRMED}', 'place_order', '{CONFIRMED}', 'COMPLETED', NULL, '{{}}', now()),
           ('{SAGA_CANCELLED}', 'place_order', '{CANCELLED}', 'COMPENSATED', NULL, '{{}}', now()),
           ('{SAGA_REFUSED}', 'place_order', '{REFUSED}', 'COMPENSATED', NULL, '{{}}', now());"
        ),
    )
    .await;
    exec(
        &payment.1,
        &format!(
            "INSERT INTO accounts (customer_id, name, balance_cents) VALUES ('{CUSTOMER}', 'c', 9500);
         INSERT INTO payments (id, customer_id, order_id, amount_cents, status) VALUES
           ('{SAGA_CONFIRMED}', '{CUSTOMER}', '{CONFIRMED}', 500, 'CHARGED'),
           ('{SAGA_CANCELLED}', '{CUSTOMER}', '{CANCELLED}', 250, 'REFUNDED');"
        ),
    )
    .await;
    for (pool, aggregate, id, event) in [
        (&order.1, "order", CONFIRMED, "OrderCreated"),
        (&order.1, "order", CANCELLED, "OrderCreated"),
        (&order.1, "order", REFUSED, "OrderCreated"),
        (&order.1, "order", CONFIRMED, "OrderConfirmed"),
        (&order.1, "order", CANCELLED, "OrderCancelled"),
        (&order.1, "order", REFUSED, "OrderCancelled"),
        (&inventory.1, "product", PRODUCT, "ProductCreated"),
        (&inventory.1, "reservation", SAGA_CONFIRMED, "StockReserved"),
        (&inventory.1, "reservation", SAGA_CANCELLED, "StockReserved"),
        (&inventory.1, "reservation", SAGA_CONFIRMED, "StockCommitted"),
        (&inventory.1, "reservation", SAGA_CANCELLED, "StockReleased"),
        (&payment.1, "account", CUSTOMER, "AccountOpened"),
        (&payment.1, "payment", SAGA_CONFIRMED, "PaymentCharged"),
        (&payment.1, "payment", SAGA_CANCELLED, "PaymentCharged"),
        (&payment.1, "payment", SAGA_CANCELLED, "PaymentRefunded"),
    ] {
        outbox_row(pool, aggregate, id, event, false).await;
    }
    let dbs =
        Databases { order: order.1.clone(), inventory: inventory.1.clone(), payment: payment.1.clone() };
    Ledger { _dbs: [order.0, inventory.0, payment.0], dbs }
}

/// Writes an event to an outbox as the writer would (`published`: as if
/// the relay had sent it, and so deleted it); returns its id.
async fn outbox_row(
    pool: &PgPool,
    aggregate: &str,
    aggregate_id: &str,
    event: &str,
    published: bool,
) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, schema_version, source, content_type,
                             payload)
         VALUES ($1, $2, $3, $4, 1, '/test', 'application/json', '\\x7b7d')",
    )
    .bind(id)
    .bind(aggregate)
    .bind(aggregate_id)
    .bind(event)
    .execute(pool)
    .await
    .unwrap();
    if published {
        sqlx::query("DELETE FROM outbox WHERE id = $1").bind(id).execute(pool).await.unwrap();
    }
    id
}

fn products() -> Vec<FixtureProduct> {
    vec![FixtureProduct { id: PRODUCT.into(), price_cents: 250, initial_stock: 10 }]
}

fn customers() -> Vec<FixtureCustomer> {
    vec![FixtureCustomer { id: CUSTOMER.into(), initial_credit_cents: 10_000 }]
}

fn ids(s: &[&str]) -> Vec<Uuid> {
    s.iter().map(|s| Uuid::parse_str(s).unwrap()).collect()
}

fn accepted() -> Vec<Uuid> {
    ids(&[CONFIRMED, CANCELLED, REFUSED])
}

/// A short settle time: the state is at rest already (or never will be).
const SETTLE: Duration = Duration::from_millis(200);

async fn orders_check(l: &Ledger) -> Verdict {
    orders::terminal(l.order(), &ids(&[CUSTOMER]), &accepted(), SETTLE).await.unwrap()
}

async fn stock_check(l: &Ledger) -> Verdict {
    stock::conserved(&l.dbs, &products(), &ids(&[CUSTOMER]), SETTLE).await.unwrap()
}

async fn money_check(l: &Ledger) -> Verdict {
    money::balanced(l.order(), l.payment(), &customers()).await.unwrap()
}

fn failed_with(v: &Verdict, needle: &str) {
    assert!(!v.ok, "expected a failure naming {needle:?}: {v}");
    assert!(v.detail.contains(needle), "expected {needle:?} in: {v}");
}

#[tokio::test]
async fn the_ledger_checks_pass_on_a_consistent_state() {
    let l = consistent_ledger().await;
    let v = orders_check(&l).await;
    assert!(v.ok, "{v}");
    assert!(
        v.detail.contains("3 orders (3 accepted by the API): 1 CONFIRMED, 2 CANCELLED, 0 PENDING"),
        "{v}"
    );
    let v = stock_check(&l).await;
    assert!(v.ok, "{v}");
    assert!(
        v.detail.contains("0 units reserved, 2 sold; 2 reservations (1 COMMITTED, 1 RELEASED) of 3 orders"),
        "{v}"
    );
    let v = money_check(&l).await;
    assert!(v.ok, "{v}");
}

// ---- orders and sagas ----

#[tokio::test]
async fn a_stuck_order_fails_the_orders_check() {
    let l = consistent_ledger().await;
    let stuck = "00000000-0000-0000-0000-0000000000d4";
    exec(l.order(), &format!(
        "INSERT INTO orders (id, customer_id, status, idempotency_key, request_hash) VALUES ('{stuck}', '{CUSTOMER}', 'PENDING', 'k4', '\\x00');
         INSERT INTO saga_instances (id, saga_type, key, status, current_step, data) VALUES
           ('00000000-0000-0000-0000-0000000000e4', 'place_order', '{stuck}', 'RUNNING', 'charge_payment', '{{}}');"
    )).await;
    failed_with(&orders_check(&l).await, &format!("{stuck} PENDING (saga RUNNING at charge_payment)"));
}

#[tokio::test]
async fn a_stuck_saga_of_a_finished_order_fails_the_orders_check() {
    let l = consistent_ledger().await;
    exec(
        l.order(),
        &format!(
            "UPDATE saga_instances SET status = 'COMPENSATING', current_step = 'refund_payment', finished_at = NULL
              WHERE id = '{SAGA_CANCELLED}'"
        ),
    )
    .await;
    failed_with(
        &orders_check(&l).await,
        &format!("{CANCELLED} CANCELLED but its saga is COMPENSATING at refund_payment"),
    );
}

#[tokio::test]
async fn an_accepted_order_that_is_absent_fails_the_orders_check() {
    let l = consistent_ledger().await;
    let ghost = Uuid::new_v4();
    let v = orders::terminal(l.order(), &ids(&[CUSTOMER]), &[accepted(), vec![ghost]].concat(), SETTLE)
        .await
        .unwrap();
    failed_with(&v, &format!("{ghost} accepted but absent"));
}

// ---- stock ----

#[tokio::test]
async fn vanished_stock_fails_the_stock_check() {
    let l = consistent_ledger().await;
    exec(l.inventory(), &format!("UPDATE products SET available = 7 WHERE id = '{PRODUCT}'")).await;
    failed_with(&stock_check(&l).await, "available 7 + reserved 0 + sold 2 != initial 10");
}

#[tokio::test]
async fn counters_that_disagree_with_the_lines_fail_the_stock_check() {
    let l = consistent_ledger().await;
    exec(l.inventory(), &format!("UPDATE products SET available = 9, sold = 1 WHERE id = '{PRODUCT}'")).await;
    failed_with(&stock_check(&l).await, "reserved 0 / sold 1 but reservation lines say 0 / 2");
}

#[tokio::test]
async fn stock_left_reserved_at_rest_fails_the_stock_check() {
    let l = consistent_ledger().await;
    // A reservation held for good, its units counted as reserved (the sum
    // and the lines agree): only "nothing reserved at rest" sees it.
    let held = "00000000-0000-0000-0000-0000000000e9";
    exec(l.inventory(), &format!(
        "INSERT INTO reservations (id, order_id, status, total_cents) VALUES ('{held}', '{REFUSED}', 'RESERVED', 250);
         INSERT INTO reservation_lines VALUES ('{held}', '{PRODUCT}', 1, 250);
         UPDATE products SET available = 7, reserved = 1 WHERE id = '{PRODUCT}';"
    )).await;
    let v = stock_check(&l).await;
    failed_with(&v, &format!("{PRODUCT}: 1 units still reserved at rest"));
    assert!(
        v.detail.contains(&format!("order {REFUSED} CANCELLED but its reservations: {held} RESERVED")),
        "{v}"
    );
}

#[tokio::test]
async fn a_reservation_released_for_a_confirmed_order_fails_the_stock_check() {
    let l = consistent_ledger().await;
    // The confirmed order's units went back to the shelf: every count adds
    // up, only the reservation disagrees with its order.
    exec(
        l.inventory(),
        &format!(
            "UPDATE reservations SET status = 'RELEASED' WHERE id = '{SAGA_CONFIRMED}';
         UPDATE products SET available = 10, sold = 0 WHERE id = '{PRODUCT}';"
        ),
    )
    .await;
    failed_with(
        &stock_check(&l).await,
        &format!("order {CONFIRMED} CONFIRMED but its reservations: {SAGA_CONFIRMED} RELEASED"),
    );
}

#[tokio::test]
async fn a_reservation_committed_for_a_cancelled_order_fails_the_stock_check() {
    let l = consistent_ledger().await;
    exec(
        l.inventory(),
        &format!(
            "UPDATE reservations SET status = 'COMMITTED' WHERE id = '{SAGA_CANCELLED}';
         UPDATE products SET available = 7, sold = 3 WHERE id = '{PRODUCT}';"
        ),
    )
    .await;
    failed_with(
        &stock_check(&l).await,
        &format!("order {CANCELLED} CANCELLED but its reservations: {SAGA_CANCELLED} COMMITTED"),
    );
}

#[tokio::test]
async fn a_reservation_of_an_unknown_order_fails_the_stock_check() {
    let l = consistent_ledger().await;
    let (orphan, nobody) = (Uuid::new_v4(), Uuid::new_v4());
    exec(
        l.inventory(),
        &format!(
            "INSERT INTO reservations (id, order_id, status, total_cents) VALUES ('{orphan}', '{nobody}', 'RELEASED', 0)"
        ),
    )
    .await;
    failed_with(
        &stock_check(&l).await,
        &format!("reservation {orphan} (RELEASED) of unknown order {nobody}"),
    );
}

// ---- money ----

#[tokio::test]
async fn a_lost_refund_fails_the_money_check() {
    let l = consistent_ledger().await;
    exec(
        l.payment(),
        &format!(
            "UPDATE payments SET status = 'CHARGED' WHERE id = '{SAGA_CANCELLED}';
         UPDATE accounts SET balance_cents = 9250 WHERE customer_id = '{CUSTOMER}';"
        ),
    )
    .await;
    let v = money_check(&l).await;
    failed_with(&v, &format!("order {CANCELLED} CANCELLED but net charge 250"));
    assert!(v.detail.contains("charges - refunds 750, confirmed totals 500"), "{v}");
}

#[tokio::test]
async fn a_double_charge_fails_the_money_check() {
    let l = consistent_ledger().await;
    exec(
        l.payment(),
        &format!(
            "INSERT INTO payments (id, customer_id, order_id, amount_cents, status)
           VALUES ('{}', '{CUSTOMER}', '{CONFIRMED}', 500, 'CHARGED');
         UPDATE accounts SET balance_cents = 9000 WHERE customer_id = '{CUSTOMER}';",
            Uuid::new_v4()
        ),
    )
    .await;
    failed_with(
        &money_check(&l).await,
        &format!("order {CONFIRMED} CONFIRMED with total 500 but net charge 1000"),
    );
}

#[tokio::test]
async fn a_confirmed_order_never_charged_fails_the_money_check() {
    let l = consistent_ledger().await;
    exec(
        l.payment(),
        &format!(
            "DELETE FROM payments WHERE id = '{SAGA_CONFIRMED}';
         UPDATE accounts SET balance_cents = 10000 WHERE customer_id = '{CUSTOMER}';"
        ),
    )
    .await;
    failed_with(
        &money_check(&l).await,
        &format!("order {CONFIRMED} CONFIRMED with total 500 but net charge 0"),
    );
}

#[tokio::test]
async fn a_balance_that_moved_without_a_payment_fails_the_money_check() {
    let l = consistent_ledger().await;
    exec(l.payment(), &format!("UPDATE accounts SET balance_cents = 9400 WHERE customer_id = '{CUSTOMER}'"))
        .await;
    failed_with(&money_check(&l).await, "charges - refunds 500, confirmed totals 500, credit - balance 600");
}

// ---- events ----

/// Runs a real relay on `pool` until its outbox is published.
async fn publish_all(pool: &PgPool, kafka: &KafkaSettings) {
    let token = CancellationToken::new();
    let relay =
        Relay::new(pool.clone(), kafka, RelaySettings { poll_interval_ms: 100, ..Default::default() })
            .unwrap();
    let task = tokio::spawn(relay.run(token.clone()));
    sagaworks_test_support::eventually("outbox published", Duration::from_secs(30), || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(pool).await.unwrap();
        (n == 0).then_some(())
    })
    .await;
    token.cancel();
    task.await.unwrap();
}

/// The consistent ledger with every outbox published to the test run's broker.
async fn published_ledger() -> (Ledger, Broker, KafkaSettings) {
    published_to(Broker::start().await).await
}

/// The consistent ledger with every outbox published to `broker`.
async fn published_to(broker: Broker) -> (Ledger, Broker, KafkaSettings) {
    let l = consistent_ledger().await;
    let kafka = broker.kafka_settings();
    let v = events::drained(&l.dbs, Duration::ZERO).await.unwrap();
    failed_with(&v, "order: 6 unpublished");
    for pool in [l.order(), l.inventory(), l.payment()] {
        publish_all(pool, &kafka).await;
    }
    let v = events::drained(&l.dbs, Duration::ZERO).await.unwrap();
    assert!(v.ok, "{v}");
    (l, broker, kafka)
}

const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends a message with `ce_id` = `id` to `<prefix>.order` under `key` (to
/// `partition`, or where the key hashes), as a producer other than the relay would.
async fn send_order_event(kafka: &KafkaSettings, id: Uuid, key: &str, partition: Option<i32>) {
    let producer: FutureProducer = sagaworks_outbox::kafka::client_config(kafka, &[]).create().unwrap();
    let topic = format!("{}.order", kafka.topic_prefix);
    let id = id.to_string();
    let headers = OwnedHeaders::new().insert(Header { key: "ce_id", value: Some(&id) });
    let mut record = FutureRecord::to(&topic).key(key).payload("{}").headers(headers);
    if let Some(p) = partition {
        record = record.partition(p);
    }
    producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
}

/// A death of `target`'s process at `at`.
fn death(target: &str, at: DateTime<Utc>) -> Kill {
    Kill { target: target.into(), how: "kill-9".into(), killed_at: at, restarted_at: at, load_running: true }
}

#[tokio::test]
async fn every_event_on_kafka_passes_and_a_copy_needs_a_death_of_its_publisher() {
    let (l, _broker, kafka) = published_ledger().await;
    let v = events::exactly_once(&l.dbs, &kafka, &[], KAFKA_TIMEOUT).await.unwrap();
    assert!(v.ok, "{v}");
    assert!(
        v.detail.contains("15 events written, 15 messages, 15 distinct ids, 0 missing, 0 unknown, 0 out of order, 0 emitted twice; 0 copies"),
        "{v}"
    );
    // The same event again: a relay that died between the ack and the delete,
    // or a producer that wrote a retried batch twice.
    let confirmed: Uuid =
        sqlx::query_scalar("SELECT id FROM outbox_ledger WHERE event_type = 'OrderConfirmed'")
            .fetch_one(l.order())
            .await
            .unwrap();
    let sent = Utc::now();
    send_order_event(&kafka, confirmed, CONFIRMED, None).await;
    // No death of the order service between the two sends: not explained.
    let before = sent - TimeDelta::minutes(10);
    for deaths in [vec![], vec![death("order", before)], vec![death("payment", sent)]] {
        let v = events::exactly_once(&l.dbs, &kafka, &deaths, KAFKA_TIMEOUT).await.unwrap();
        failed_with(&v, &format!("{confirmed} (order outbox) sent again at"));
        assert!(v.detail.contains("1 copies: 0 after a death of their publisher, 0 after a change of their partition's leader, 1 unexplained"), "{v}");
    }
    // The order service died after the first send: its successor sent it again.
    let v = events::exactly_once(
        &l.dbs,
        &kafka,
        &[death("order", sent - TimeDelta::milliseconds(10))],
        KAFKA_TIMEOUT,
    )
    .await
    .unwrap();
    assert!(v.ok, "{v}");
    assert!(v.detail.contains("16 messages, 15 distinct ids"), "{v}");
    assert!(v.detail.contains("1 copies: 1 after a death of their publisher, 0 after a change of their partition's leader, 0 unexplained"), "{v}");
}

#[tokio::test]
async fn a_copy_written_under_a_new_partition_leader_is_explained() {
    let (l, mut broker, kafka) = published_to(Broker::private().await).await;
    let confirmed: Uuid =
        sqlx::query_scalar("SELECT id FROM outbox_ledger WHERE event_type = 'OrderConfirmed'")
            .fetch_one(l.order())
            .await
            .unwrap();
    // The node restarts: every partition gets a leader again, in a new leader epoch.
    broker.stop();
    broker.restart().await;
    send_order_event(&kafka, confirmed, CONFIRMED, None).await;
    let v = events::exactly_once(&l.dbs, &kafka, &[], KAFKA_TIMEOUT).await.unwrap();
    assert!(v.ok, "{v}");
    assert!(v.detail.contains("1 copies: 0 after a death of their publisher, 1 after a change of their partition's leader, 0 unexplained"), "{v}");
}

#[tokio::test]
async fn an_unpublished_event_fails_the_drained_check() {
    let l = consistent_ledger().await;
    let v = events::drained(&l.dbs, SETTLE).await.unwrap();
    failed_with(&v, "order: 6 unpublished");
}

#[tokio::test]
async fn an_event_missing_on_kafka_fails_the_events_check() {
    let (l, _broker, kafka) = published_ledger().await;
    // Published (deleted by the relay), never on the broker (a log the broker lost).
    let lost = outbox_row(l.payment(), "account", CUSTOMER, "AccountCredited", true).await;
    let v = events::exactly_once(&l.dbs, &kafka, &[], KAFKA_TIMEOUT).await.unwrap();
    failed_with(&v, &format!("{lost} not on Kafka"));
}

#[tokio::test]
async fn an_aggregates_events_out_of_outbox_order_or_on_two_partitions_fail_the_events_check() {
    let (l, _broker, kafka) = published_ledger().await;
    // Two later events of one order, published, on Kafka in the wrong order.
    let key = "00000000-0000-0000-0000-0000000000e1";
    let first = outbox_row(l.order(), "order", key, "OrderNoted", true).await;
    let second = outbox_row(l.order(), "order", key, "OrderNoted", true).await;
    send_order_event(&kafka, second, key, Some(0)).await;
    send_order_event(&kafka, first, key, Some(0)).await;
    let v = events::exactly_once(&l.dbs, &kafka, &[], KAFKA_TIMEOUT).await.unwrap();
    failed_with(&v, &format!("key {key} of {}.order[0]: {first}", kafka.topic_prefix));
    assert!(v.detail.contains("1 out of order"), "{v}");

    // Another order's two events in order, but on two partitions.
    let key = "00000000-0000-0000-0000-0000000000e2";
    let first = outbox_row(l.order(), "order", key, "OrderNoted", true).await;
    let second = outbox_row(l.order(), "order", key, "OrderNoted", true).await;
    send_order_event(&kafka, first, key, Some(0)).await;
    send_order_event(&kafka, second, key, Some(1)).await;
    let v = events::exactly_once(&l.dbs, &kafka, &[], KAFKA_TIMEOUT).await.unwrap();
    failed_with(&v, &format!("key {key} of {}.order on partitions {{0, 1}}", kafka.topic_prefix));
}

#[tokio::test]
async fn an_event_no_outbox_wrote_fails_the_events_check() {
    let (l, _broker, kafka) = published_ledger().await;
    let foreign = Uuid::new_v4();
    send_order_event(&kafka, foreign, CONFIRMED, None).await;
    let v = events::exactly_once(&l.dbs, &kafka, &[], KAFKA_TIMEOUT).await.unwrap();
    failed_with(&v, &format!("{foreign} on Kafka, written by no outbox"));
}

/// Without the ledger the outbox cannot say what was written (the relay
/// deleted what it published): the check fails and says what to do, instead
/// of passing on an empty outbox.
#[tokio::test]
async fn a_database_without_the_outbox_ledger_fails_the_events_check() {
    let (l, _broker, kafka) = published_ledger().await;
    exec(l.inventory(), "DROP TRIGGER outbox_ledger ON outbox").await;
    let v = events::exactly_once(&l.dbs, &kafka, &[], KAFKA_TIMEOUT).await.unwrap();
    failed_with(&v, "no outbox ledger on inventory");
    failed_with(&v, "run `sagaworks-tools ledger` before the run");
}

#[tokio::test]
async fn an_event_emitted_twice_fails_the_events_check() {
    let (l, _broker, kafka) = published_ledger().await;
    // The confirmation written again under a new id (a step that ran twice),
    // and published like any other: on Kafka once per id, still a duplicate.
    outbox_row(l.order(), "order", CONFIRMED, "OrderConfirmed", false).await;
    publish_all(l.order(), &kafka).await;
    let v = events::exactly_once(&l.dbs, &kafka, &[], KAFKA_TIMEOUT).await.unwrap();
    failed_with(&v, &format!("OrderConfirmed of {CONFIRMED} written 2 times (order outbox)"));
    assert!(v.detail.contains("0 missing, 0 unknown, 0 out of order, 2 emitted twice"), "{v}");
    assert!(
        v.detail.contains(&format!("order {CONFIRMED} CONFIRMED with 2 OrderConfirmed and 0 OrderCancelled")),
        "{v}"
    );
}

#[tokio::test]
async fn an_order_whose_outcome_event_contradicts_it_fails_the_events_check() {
    let (l, _broker, kafka) = published_ledger().await;
    outbox_row(l.order(), "order", CONFIRMED, "OrderCancelled", false).await;
    publish_all(l.order(), &kafka).await;
    let v = events::exactly_once(&l.dbs, &kafka, &[], KAFKA_TIMEOUT).await.unwrap();
    failed_with(&v, &format!("order {CONFIRMED} CONFIRMED with 1 OrderConfirmed and 1 OrderCancelled"));
}

// ---- coverage ----

/// Kills around `t`, with the ledger's orders accepted just before it and
/// one saga in flight across the order kill.
async fn covered_run(l: &Ledger, t: DateTime<Utc>) -> Vec<Kill> {
    let s = |secs: i64| t + TimeDelta::seconds(secs);
    sqlx::query("UPDATE orders SET created_at = $1").bind(s(-2)).execute(l.order()).await.unwrap();
    for (saga, created, finished) in [
        // Created before the order kill, finished after it: resumed.
        (SAGA_CONFIRMED, s(-2), s(5)),
        // Finished before the kill, and started after it.
        (SAGA_CANCELLED, s(-2), s(-1)),
        (SAGA_REFUSED, s(4), s(6)),
    ] {
        sqlx::query("UPDATE saga_instances SET created_at = $2, finished_at = $3 WHERE id = $1")
            .bind(Uuid::parse_str(saga).unwrap())
            .bind(created)
            .bind(finished)
            .execute(l.order())
            .await
            .unwrap();
    }
    let line = |target: &str, how: &str, at: i64, up: i64, load: u8| {
        format!("{target} {how} {} {} {load}\n", s(at).to_rfc3339(), s(up).to_rfc3339())
    };
    let text = [
        line("order", "kill-9", 0, 3, 1),
        // Nothing accepted in the 3 s before it; then after the load stopped.
        line("gateway", "kill-9", 60, 62, 1),
        line("payment", "after_produce", 1, 2, 0),
    ]
    .concat();
    Kill::parse(&format!("# target how killed_at restarted_at load\n{text}")).unwrap()
}

const MINIMUMS: Minimums =
    Minimums { accepted: 3, confirmed: 1, cancelled: 2, resumed: 1, kills_under_load: 1 };

#[tokio::test]
async fn a_run_at_its_minimums_passes_the_coverage_check() {
    let l = consistent_ledger().await;
    let kills = covered_run(&l, Utc::now()).await;
    let v = coverage::minimums(l.order(), &accepted(), &kills, &MINIMUMS).await.unwrap();
    assert!(v.ok, "{v}");
    assert!(
        v.detail.contains("accepted 3, CONFIRMED 1, CANCELLED 2, sagas resumed after an order kill 1, kills under load 1 of 3"),
        "{v}"
    );
    assert!(v.detail.contains("gateway (kill-9) at") && v.detail.contains("after the load stopped"), "{v}");
    // A process that crashed on its own is no fault of the run's: neither counted
    // nor named, even an order crash (it resumes no saga for the minimum).
    let mut with_crash = kills.clone();
    with_crash.push(Kill { how: coverage::CRASH.into(), ..kills[0].clone() });
    let v = coverage::minimums(l.order(), &accepted(), &with_crash, &MINIMUMS).await.unwrap();
    assert!(v.detail.contains("kills under load 1 of 3"), "{v}");
    let only_crash = [Kill { how: coverage::CRASH.into(), ..kills[0].clone() }];
    let v = coverage::minimums(l.order(), &accepted(), &only_crash, &MINIMUMS).await.unwrap();
    failed_with(&v, "sagas resumed after an order kill 0 < minimum 1");
}

#[tokio::test]
async fn a_run_below_any_minimum_fails_the_coverage_check() {
    let l = consistent_ledger().await;
    let kills = covered_run(&l, Utc::now()).await;
    let m = MINIMUMS;
    for (raised, shortfall) in [
        (Minimums { accepted: 4, ..m }, "accepted 3 < minimum 4"),
        (Minimums { confirmed: 2, ..m }, "CONFIRMED 1 < minimum 2"),
        (Minimums { cancelled: 3, ..m }, "CANCELLED 2 < minimum 3"),
        (Minimums { resumed: 2, ..m }, "sagas resumed after an order kill 1 < minimum 2"),
        (Minimums { kills_under_load: 2, ..m }, "kills under load 1 < minimum 2"),
    ] {
        let v = coverage::minimums(l.order(), &accepted(), &kills, &raised).await.unwrap();
        failed_with(&v, shortfall);
    }
    // No kill of the order service: nothing was resumed.
    let v = coverage::minimums(l.order(), &accepted(), &kills[1..], &m).await.unwrap();
    failed_with(&v, "sagas resumed after an order kill 0 < minimum 1");
}

#[test]
fn malformed_kill_lines_are_refused() {
    for bad in [
        "order kill-9 2026-01-01T00:00:00Z 1",
        "order kill-9 yesterday 2026-01-01T00:00:00Z 1",
        "order kill-9 2026-01-01T00:00:00Z 2026-01-01T00:00:01Z yes",
    ] {
        assert!(Kill::parse(bad).is_err(), "{bad}");
    }
}
