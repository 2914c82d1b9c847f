//! The invariant checks against real PostgreSQL databases carrying the
//! services' own migrations, and a real broker fed by the real outbox relay:
//! each check passes on a consistent state and fails on each kind of drift.

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sagaworks_config::KafkaSettings;
use sagaworks_outbox::{NewEvent, OutboxWriter, Relay, RelaySettings};
use sagaworks_test_support::{Broker, TestDatabase};
use sagaworks_tools::check::{events, money, orders, stock};
use sagaworks_tools::pg::Databases;
use sagaworks_tools::{FixtureCustomer, FixtureProduct};
use sqlx::PgPool;
use sqlx::migrate::Migrator;
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
    (db, pool)
}

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(sql).execute(pool).await.unwrap();
}

const PRODUCT: &str = "00000000-0000-0000-0000-0000000000a1";
const CUSTOMER: &str = "00000000-0000-0000-0000-0000000000c1";
const CONFIRMED: &str = "00000000-0000-0000-0000-0000000000d1";
const CANCELLED: &str = "00000000-0000-0000-0000-0000000000d2";
const HELD: &str = "00000000-0000-0000-0000-0000000000d3";

/// A product stocked with 10: 2 sold (a committed reservation), 1 reserved
/// (a reservation not yet committed), 7 available. A customer with 10000
/// cents: one confirmed order of 500 (charged), one cancelled of 300 (charged
/// then refunded).
async fn consistent_ledger() -> [(TestDatabase, PgPool); 3] {
    let (order, inventory, payment) =
        (service_db("order").await, service_db("inventory").await, service_db("payment").await);
    exec(&inventory.1, &format!(
        "INSERT INTO products (id, sku, name, price_cents, available, reserved, sold) VALUES ('{PRODUCT}', 's', 'n', 250, 7, 1, 2);
         INSERT INTO reservations (id, order_id, status) VALUES ('{CONFIRMED}', '{CONFIRMED}', 'COMMITTED'), ('{HELD}', '{HELD}', 'RESERVED');
         INSERT INTO reservation_lines VALUES ('{CONFIRMED}', '{PRODUCT}', 2, 250), ('{HELD}', '{PRODUCT}', 1, 250);"
    )).await;
    exec(
        &order.1,
        &format!(
            "INSERT INTO orders (id, customer_id, status, total_cents, idempotency_key, request_hash) VALUES
           ('{CONFIRMED}', '{CUSTOMER}', 'CONFIRMED', 500, 'k1', '\\x00'),
           ('{CANCELLED}', '{CUSTOMER}', 'CANCELLED', 300, 'k2', '\\x00');"
        ),
    )
    .await;
    exec(
        &payment.1,
        &format!(
            "INSERT INTO accounts (customer_id, name, balance_cents) VALUES ('{CUSTOMER}', 'c', 9500);
         INSERT INTO payments (id, customer_id, order_id, amount_cents, status) VALUES
           ('{CONFIRMED}', '{CUSTOMER}', '{CONFIRMED}', 500, 'CHARGED'),
           ('{CANCELLED}', '{CUSTOMER}', '{CANCELLED}', 300, 'REFUNDED');"
        ),
    )
    .await;
    [order, inventory, payment]
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

#[tokio::test]
async fn ledger_checks_pass_on_a_consistent_state_and_fail_on_each_drift() {
    let [(_o, order), (_i, inventory), (_p, payment)] = consistent_ledger().await;
    let settle = Duration::from_millis(200);
    let accepted = ids(&[CONFIRMED, CANCELLED]);

    let v = orders::terminal(&order, &ids(&[CUSTOMER]), &accepted, settle).await.unwrap();
    assert!(v.ok, "{v}");
    assert!(v.detail.contains("1 CONFIRMED, 1 CANCELLED, 0 PENDING"), "{v}");
    let v = stock::conserved(&inventory, &products()).await.unwrap();
    assert!(v.ok, "{v}");
    let v = money::balanced(&order, &payment, &customers()).await.unwrap();
    assert!(v.ok, "{v}");

    // An accepted order the database does not have, and one that never finishes.
    let ghost = Uuid::new_v4();
    let v = orders::terminal(&order, &ids(&[CUSTOMER]), &[accepted.clone(), vec![ghost]].concat(), settle)
        .await
        .unwrap();
    assert!(!v.ok && v.detail.contains(&format!("{ghost} accepted but absent")), "{v}");
    exec(&order, &format!("INSERT INTO orders (id, customer_id, status, idempotency_key, request_hash) VALUES ('{HELD}', '{CUSTOMER}', 'PENDING', 'k3', '\\x00')")).await;
    let v = orders::terminal(&order, &ids(&[CUSTOMER]), &accepted, settle).await.unwrap();
    assert!(!v.ok && v.detail.contains(&format!("{HELD} PENDING")), "{v}");

    // A unit appears from nowhere; then the counters disagree with the lines.
    exec(&inventory, &format!("UPDATE products SET available = 8 WHERE id = '{PRODUCT}'")).await;
    let v = stock::conserved(&inventory, &products()).await.unwrap();
    assert!(!v.ok && v.detail.contains("!= initial 10"), "{v}");
    exec(&inventory, &format!("UPDATE products SET available = 6, reserved = 2 WHERE id = '{PRODUCT}'"))
        .await;
    let v = stock::conserved(&inventory, &products()).await.unwrap();
    assert!(!v.ok && v.detail.contains("reservation lines say 1 / 2"), "{v}");

    // The cancelled order's refund is lost: it is still charged.
    exec(&payment, &format!("UPDATE payments SET status = 'CHARGED' WHERE id = '{CANCELLED}'")).await;
    exec(&payment, &format!("UPDATE accounts SET balance_cents = 9200 WHERE customer_id = '{CUSTOMER}'"))
        .await;
    let v = money::balanced(&order, &payment, &customers()).await.unwrap();
    assert!(!v.ok && v.detail.contains(&format!("order {CANCELLED} CANCELLED but net charge 300")), "{v}");
    assert!(v.detail.contains("charges - refunds 800, confirmed totals 500"), "{v}");
}

async fn publish_all(pool: &PgPool, kafka: &KafkaSettings) {
    let token = CancellationToken::new();
    let relay =
        Relay::new(pool.clone(), kafka, RelaySettings { poll_interval_ms: 100, ..Default::default() })
            .unwrap();
    let task = tokio::spawn(relay.run(token.clone()));
    sagaworks_test_support::eventually("outbox published", Duration::from_secs(30), || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .fetch_one(pool)
            .await
            .unwrap();
        (n == 0).then_some(())
    })
    .await;
    token.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn events_check_requires_every_outbox_row_on_kafka_and_no_foreign_event() {
    let broker = Broker::start().await;
    let kafka = broker.kafka_settings();
    let (o, i, p) = (service_db("order").await, service_db("inventory").await, service_db("payment").await);
    let dbs = Databases { order: o.1.clone(), inventory: i.1.clone(), payment: p.1.clone() };
    for (service, aggregate, pool) in
        [("order", "order", &o.1), ("inventory", "product", &i.1), ("payment", "account", &p.1)]
    {
        let writer = OutboxWriter::new(service);
        let mut tx = pool.begin().await.unwrap();
        for n in 0..3 {
            let event =
                NewEvent::new(aggregate, Uuid::new_v4(), "Tested", serde_json::json!({ "n": n })).unwrap();
            writer.write(&mut tx, event).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    let v = events::drained(&dbs, Duration::ZERO).await.unwrap();
    assert!(!v.ok && v.detail.contains("3 unpublished"), "{v}");
    for pool in [&o.1, &i.1, &p.1] {
        publish_all(pool, &kafka).await;
    }
    let v = events::drained(&dbs, Duration::ZERO).await.unwrap();
    assert!(v.ok, "{v}");
    let timeout = Duration::from_secs(30);
    let v = events::exactly_once(&dbs, &kafka, None, timeout).await.unwrap();
    assert!(v.ok, "{v}");
    assert!(
        v.detail.contains("9 outbox rows (9 required on Kafka), 9 messages, 9 distinct ids (0 duplicates)"),
        "{v}"
    );

    // A row marked published that never reached the broker.
    let lost = Uuid::new_v4();
    exec(&o.1, &format!(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, schema_version, source, content_type, payload, published_at)
         VALUES ('{lost}', 'order', 'x', 'Tested', 1, '/t', 'application/json', '\\x7b7d', now())"
    )).await;
    let v = events::exactly_once(&dbs, &kafka, None, timeout).await.unwrap();
    assert!(!v.ok && v.detail.contains(&format!("{lost} not on Kafka")), "{v}");
    // Not required when it was published before the broker lost its log.
    let since = chrono::Utc::now() + chrono::Duration::seconds(1);
    let v = events::exactly_once(&dbs, &kafka, Some(since), timeout).await.unwrap();
    assert!(v.ok, "{v}");

    // A duplicate is fine (at-least-once); an event no outbox wrote is not.
    let producer: FutureProducer = sagaworks_outbox::kafka::client_config(&kafka, &[]).create().unwrap();
    let topic = format!("{}.order", kafka.topic_prefix);
    let rows: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM outbox WHERE id <> $1 LIMIT 1")
        .bind(lost)
        .fetch_all(&o.1)
        .await
        .unwrap();
    let foreign = Uuid::new_v4();
    for id in [rows[0], foreign] {
        let id = id.to_string();
        let headers = OwnedHeaders::new().insert(Header { key: "ce_id", value: Some(&id) });
        let record = FutureRecord::to(&topic).key("k").payload("{}").headers(headers);
        producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
    }
    let v = events::exactly_once(&dbs, &kafka, Some(since), timeout).await.unwrap();
    assert!(!v.ok && v.detail.contains(&format!("{foreign} on Kafka, in no outbox")), "{v}");
    assert!(v.detail.contains("11 messages, 10 distinct ids (1 duplicates)"), "{v}");
}
