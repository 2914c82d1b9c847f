//! The `OrderConfirmed` v1 -> v2 evolution against real PostgreSQL and a
//! real broker, both ways: a consumer built with v2 reads what a v1 producer
//! wrote (upcast), and a consumer built with v1 does not guess at a v2 event:
//! it parks it (`dlq_reason=unsupported_schema_version`), or retries it
//! first, per its settings; once upgraded, a replay of the parked event is
//! handled.

use sagaworks_config::KafkaSettings;
use sagaworks_events::OrderConfirmed;
use sagaworks_events::order::v1;
use sagaworks_outbox::dead_letter::{DeadLetter, ListFilter, Operator, Selector};
use sagaworks_outbox::{
    Consumer, ConsumerSettings, DeadLetterSettings, DeadLetters, Event, Handler, HandlerError, OutboxWriter,
    ReceivedEvent, Relay, RelaySettings, UnsupportedVersionPolicy,
};
use sagaworks_test_support::{Broker, TestDatabase, eventually};
use sqlx::{PgConnection, PgPool};
use std::marker::PhantomData;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

/// The reservations an `OrderConfirmed` of either version names.
trait Reservations: Event {
    fn reservations(&self) -> Vec<Uuid>;
}

impl Reservations for v1::OrderConfirmed {
    fn reservations(&self) -> Vec<Uuid> {
        vec![self.reservation_id]
    }
}

impl Reservations for OrderConfirmed {
    fn reservations(&self) -> Vec<Uuid> {
        self.reservation_ids.clone()
    }
}

/// A consumer built with `E`: decodes each `OrderConfirmed` as `E` and
/// records what it read in `handled`.
struct Reads<E> {
    group: &'static str,
    built_with: PhantomData<fn() -> E>,
}

impl<E: Reservations> Handler for Reads<E> {
    fn wants(&self, event: &ReceivedEvent) -> bool {
        event.is::<E>()
    }

    async fn handle(&self, tx: &mut PgConnection, event: &ReceivedEvent) -> Result<(), HandlerError> {
        let confirmed: E = event.decode()?;
        sqlx::query(
            "INSERT INTO handled (grp, event_id, built_with, schema_version, data_schema, reservation_ids)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(self.group)
        .bind(event.id)
        .bind(E::VERSION)
        .bind(event.schema_version)
        .bind(&event.data_schema)
        .bind(confirmed.reservations())
        .execute(tx)
        .await
        .map_err(|e| HandlerError::Retryable(e.to_string()))?;
        Ok(())
    }
}

#[derive(Debug, PartialEq, sqlx::FromRow)]
struct Handled {
    event_id: Uuid,
    built_with: i32,
    schema_version: i32,
    data_schema: Option<String>,
    reservation_ids: Vec<Uuid>,
}

struct Env {
    _db: TestDatabase,
    pool: PgPool,
    _broker: Broker,
    kafka: KafkaSettings,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn env(name: &str) -> Env {
    sagaworks_test_support::init_logs();
    let db = TestDatabase::create(name).await;
    let pool = db.pool().await;
    sagaworks_runtime::db::migrate(&pool, &mut [sagaworks_outbox::migrator()]).await.unwrap();
    sqlx::query(
        "CREATE TABLE handled (k BIGSERIAL, grp TEXT NOT NULL, event_id UUID NOT NULL, built_with INT NOT NULL,
                               schema_version INT NOT NULL, data_schema TEXT, reservation_ids UUID[] NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let broker = Broker::start().await;
    let kafka = broker.kafka_settings();
    let mut env =
        Env { _db: db, pool, _broker: broker, kafka, stop: CancellationToken::new(), tasks: vec![] };
    let relay_settings = RelaySettings {
        service: "order".into(),
        poll_interval_ms: 100,
        backoff_base_ms: 50,
        backoff_max_ms: 1_000,
        ..Default::default()
    };
    let relay = Relay::new(env.pool.clone(), &env.kafka, relay_settings).unwrap();
    env.tasks.push(tokio::spawn(relay.run(env.stop.clone())));
    env
}

impl Env {
    fn consume<E: Reservations>(
        &mut self,
        group: &'static str,
        policy: UnsupportedVersionPolicy,
    ) -> CancellationToken {
        let settings = ConsumerSettings {
            group_id: group.into(),
            topics: vec!["order".into()],
            max_attempts: 3,
            retry_base_ms: 20,
            retry_max_ms: 200,
            unsupported_schema_version: policy,
            ..Default::default()
        };
        let handler = Reads::<E> { group, built_with: PhantomData };
        let consumer = Consumer::new(self.pool.clone(), &self.kafka, settings, handler).unwrap();
        let token = self.stop.child_token();
        self.tasks.push(tokio::spawn(consumer.run(token.clone())));
        token
    }

    /// Writes `event` through the outbox, as its producer does.
    async fn publish<E: Event>(&self, event: &E) -> Uuid {
        let mut tx = self.pool.begin().await.unwrap();
        let id = OutboxWriter::new("order").append(&mut tx, event).await.unwrap();
        tx.commit().await.unwrap();
        id
    }

    async fn handled(&self, group: &str, n: usize) -> Vec<Handled> {
        let pool = self.pool.clone();
        eventually(&format!("{n} events handled by {group}"), WAIT, || {
            let pool = pool.clone();
            async move {
                let rows: Vec<Handled> = sqlx::query_as(
                    "SELECT event_id, built_with, schema_version, data_schema, reservation_ids
                     FROM handled WHERE grp = $1 ORDER BY k",
                )
                .bind(group)
                .fetch_all(&pool)
                .await
                .unwrap();
                (rows.len() >= n).then_some(rows)
            }
        })
        .await
    }

    async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            tokio::time::timeout(Duration::from_secs(20), t).await.expect("tasks stop").unwrap();
        }
    }
}

fn v1_confirmed(order_id: Uuid, reservation_id: Uuid) -> v1::OrderConfirmed {
    v1::OrderConfirmed {
        order_id,
        customer_id: Uuid::now_v7(),
        saga_id: reservation_id,
        reservation_id,
        payment_id: reservation_id,
        total_cents: 1250,
    }
}

fn v2_confirmed(order_id: Uuid, reservation_ids: Vec<Uuid>) -> OrderConfirmed {
    OrderConfirmed {
        order_id,
        customer_id: Uuid::now_v7(),
        saga_id: reservation_ids[0],
        reservation_ids,
        payment_id: Uuid::now_v7(),
        total_cents: 2500,
    }
}

#[tokio::test]
async fn a_v2_consumer_reads_a_v1_producers_event_through_the_upcast() {
    let mut env = env("events_upcast").await;
    env.consume::<OrderConfirmed>("built-with-v2", UnsupportedVersionPolicy::Park);
    let order = Uuid::now_v7();
    let (r1, r2a, r2b) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let old = env.publish(&v1_confirmed(order, r1)).await;
    let new = env.publish(&v2_confirmed(order, vec![r2a, r2b])).await;

    let handled = env.handled("built-with-v2", 2).await;
    assert_eq!(
        handled,
        [
            Handled {
                event_id: old,
                built_with: 2,
                schema_version: 1,
                data_schema: Some("urn:sagaworks:event:OrderConfirmed:v1".into()),
                reservation_ids: vec![r1],
            },
            Handled {
                event_id: new,
                built_with: 2,
                schema_version: 2,
                data_schema: Some("urn:sagaworks:event:OrderConfirmed:v2".into()),
                reservation_ids: vec![r2a, r2b],
            },
        ]
    );
    env.stop().await;
}

#[tokio::test]
async fn a_v1_consumer_parks_or_retries_a_v2_event_and_handles_its_replay_once_upgraded() {
    let mut env = env("events_unsupported").await;
    let park = env.consume::<v1::OrderConfirmed>("parks", UnsupportedVersionPolicy::Park);
    env.consume::<v1::OrderConfirmed>("retries", UnsupportedVersionPolicy::Retry);
    // One order's events, so one partition, in this order.
    let order = Uuid::now_v7();
    let (r1, r2, r3) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let before = env.publish(&v1_confirmed(order, r1)).await;
    let newer = env.publish(&v2_confirmed(order, vec![r2])).await;
    let after = env.publish(&v1_confirmed(order, r3)).await;

    // Both v1 events are handled: the v2 one between them did not block the partition.
    for group in ["parks", "retries"] {
        let handled = env.handled(group, 2).await;
        let ids: Vec<(Uuid, Vec<Uuid>)> =
            handled.into_iter().map(|h| (h.event_id, h.reservation_ids)).collect();
        assert_eq!(ids, [(before, vec![r1]), (after, vec![r3])], "{group}");
    }
    // The v2 event is parked once per group, with the reason and the versions.
    let dead = DeadLetters::new(
        env.pool.clone(),
        &env.kafka,
        DeadLetterSettings { topics: vec!["order".into()], ..Default::default() },
    )
    .unwrap();
    let letters: Vec<DeadLetter> = eventually("the v2 event parked by both groups", WAIT, || {
        let dead = dead.clone();
        async move {
            let page = dead.list("order", &ListFilter::default(), None, 10).await.ok()?;
            (page.messages.len() >= 2).then_some(page.messages)
        }
    })
    .await;
    let mut by_group: Vec<(String, String, u32, String)> = letters
        .iter()
        .map(|l| {
            assert_eq!(l.event_id, Some(newer.to_string()));
            (l.group.clone().unwrap(), l.reason.clone().unwrap(), l.attempts, l.error.clone())
        })
        .collect();
    by_group.sort();
    let error = "OrderConfirmed schema version 2 is newer than version 1, the newest this consumer reads";
    assert_eq!(
        by_group,
        [
            ("parks".into(), "unsupported_schema_version".into(), 1, error.into()),
            ("retries".into(), "unsupported_schema_version".into(), 3, error.into()),
        ],
        "parked at once, or after max_attempts"
    );

    // The `parks` group is upgraded (the same group, built with v2); the
    // operator replays the parked event, which it now handles.
    park.cancel();
    env.consume::<OrderConfirmed>("parks", UnsupportedVersionPolicy::Park);
    let operator = Operator {
        actor: "ops".into(),
        reason: "consumers upgraded".into(),
        idempotency_key: "replay-1".into(),
    };
    dead.replay("order", Selector::AllPending, &operator).await.unwrap();
    let handled = env.handled("parks", 3).await;
    assert_eq!(handled.len(), 3, "{handled:?}");
    assert_eq!(
        (handled[2].event_id, handled[2].built_with, handled[2].schema_version, &handled[2].reservation_ids),
        (newer, 2, 2, &vec![r2])
    );
    env.stop().await;
}
