//! Work changing hands while it is in flight, against real PostgreSQL and
//! Apache Kafka: a relay that stops with a batch out (its broker healthy, or
//! gone), and a consumer group that rebalances mid-stream.

use crate::common::*;
use futures::future::BoxFuture;
use rdkafka::message::{Message, OwnedMessage};
use sagaworks_config::KafkaSettings;
use sagaworks_outbox::kafka::topic_name;
use sagaworks_outbox::{Consumer, ConsumerSettings, NewEvent, OutboxWriter, Relay, RelaySettings};
use sagaworks_test_support::{Broker, eventually};
use sqlx::PgPool;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Fail-instead-of-hang guard of every wait (nothing here waits on the clock).
const WAIT: Duration = Duration::from_secs(60);

/// A relay told to stop while its batch waits for acks from a healthy broker
/// (a rolling restart) waits for them and deletes what was acked before it
/// stops: nothing is left for the next relay to send again. The producer
/// holds the batch for `linger_ms`, so the acks are still out when the stop
/// comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_stopped_with_acks_in_flight_deletes_what_was_acked() {
    const AGGREGATES: i64 = 4;
    const EVENTS: i64 = 5;
    let env = env("handover_graceful").await;
    let settings = RelaySettings { linger_ms: 3_000, message_timeout_ms: 30_000, ..relay_settings() };
    assert!(settings.stop_ack_wait_ms > settings.linger_ms, "the stop waits out the linger");
    let relay = Relay::new(env.pool.clone(), &env.kafka, settings).unwrap();
    let relay = Running::spawn(|t| relay.run(t));
    credit(&env.pool, "warm-up", 0, true).await;
    eventually_published(&env.pool).await;

    write_backlog_and_await_claim(&env.pool, AGGREGATES, EVENTS).await;
    relay.stop().await;

    let left = count(&env.pool, "SELECT count(*) FROM outbox").await;
    assert_eq!(left, 0, "the stopped relay deleted its acked batch: nothing to send again");
    assert_backlog_sent_once_in_order(&env.kafka, AGGREGATES, EVENTS).await;
}

/// A relay that stops while its batch waits for acks that will never come
/// (its broker went away; its sends would time out after ten minutes) hands
/// its claims back once its stop wait (`stop_ack_wait_ms`) is over: a second
/// relay on the same table, which
/// skipped those aggregates while they were claimed, publishes them at once,
/// in order, each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_relay_releases_its_claims_to_another_relay_at_once() {
    const AGGREGATES: i64 = 4;
    const EVENTS: i64 = 5;
    let env = env("handover_relay").await;
    let mut gone = Broker::private().await;
    let first_kafka = KafkaSettings { topic_prefix: env.kafka.topic_prefix.clone(), ..gone.kafka_settings() };
    let first_settings = RelaySettings { message_timeout_ms: 600_000, ..relay_settings() };
    let first = Relay::new(env.pool.clone(), &first_kafka, first_settings).unwrap();
    let first = Running::spawn(|t| first.run(t));
    // Once it has published, it knows the topic exists and goes straight to sending.
    credit(&env.pool, "warm-up", 0, true).await;
    eventually_published(&env.pool).await;
    gone.stop();

    write_backlog_and_await_claim(&env.pool, AGGREGATES, EVENTS).await;

    // The second relay publishes around the claims ...
    let second = Relay::new(env.pool.clone(), &env.kafka, relay_settings()).unwrap();
    let second = Running::spawn(|t| second.run(t));
    let marker = credit(&env.pool, "acc-free", 1, true).await;
    let pool = env.pool.clone();
    eventually("the second relay to publish an unclaimed aggregate", WAIT, || {
        let pool = pool.clone();
        async move {
            // Published: the relay deleted the acked row.
            let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE id = $1")
                .bind(marker)
                .fetch_one(&pool)
                .await
                .unwrap();
            (left == 0).then_some(())
        }
    })
    .await;
    let held = count(&env.pool, "SELECT count(*) FROM outbox").await;
    assert_eq!(held, AGGREGATES * EVENTS, "the claimed aggregates wait for the first relay");
    assert_eq!(claimed_rows(&env.pool).await, AGGREGATES, "still claimed");

    // ... and, once the first one stopped, publishes what it had claimed.
    first.stop().await;
    eventually_published(&env.pool).await;
    assert_backlog_sent_once_in_order(&env.kafka, AGGREGATES, EVENTS).await;
    second.stop().await;
}

/// A consumer group rebalances twice while a stream of events is being
/// handled: a second member joins, then the first leaves. The first member
/// commits no offset until it leaves, so every partition it hands over is
/// read again from the start by the second: the inbox turns those
/// redeliveries (and the messages both members had in hand at once) into
/// no-ops. Every event has exactly one effect, in its aggregate's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_mid_stream_loses_no_event_and_doubles_none() {
    const AGGREGATES: i64 = 12;
    const GROUP: &str = "g-rebalance";
    let _ = sagaworks_runtime::metrics::handle();
    let env = env("handover_rebalance").await;
    let relay = Relay::new(env.pool.clone(), &env.kafka, relay_settings()).unwrap();
    let relay = Running::spawn(|t| relay.run(t));
    let settings = consumer_settings(GROUP, &["account"]);
    let partitions = settings.topic_settings.partitions as i64;
    let first_handler = Recorder::default();
    let first_handled = first_handler.attempts.clone();
    let first_settings = ConsumerSettings { commit_interval_ms: 3_600_000, ..settings.clone() };
    let first = Consumer::new(env.pool.clone(), &env.kafka, first_settings, first_handler).unwrap();
    let first = Running::spawn(|t| first.run(t));

    // At most four rounds ahead of the handling: events are in flight all along.
    let stream = Stream::start(env.pool.clone(), AGGREGATES, |pool, next| {
        Box::pin(async move { count(&pool, "SELECT count(*) FROM effects").await >= (next - 5) * AGGREGATES })
    });
    let pool = env.pool.clone();
    eventually("the first member to handle events of every partition", WAIT, || {
        let pool = pool.clone();
        async move {
            let handled = count(
                &pool,
                "SELECT count(DISTINCT kafka_partition) FROM inbox WHERE consumer_group = 'g-rebalance'",
            )
            .await;
            (handled == partitions).then_some(())
        }
    })
    .await;

    // A second member joins ...
    let second_handler = Recorder::default();
    let second_handled = second_handler.attempts.clone();
    let second = Consumer::new(env.pool.clone(), &env.kafka, settings, second_handler).unwrap();
    let second = Running::spawn(|t| second.run(t));
    eventually("the second member to get partitions", WAIT, || {
        let handled = !second_handled.lock().unwrap().is_empty();
        async move { handled.then_some(()) }
    })
    .await;
    // ... then the first one leaves, and the second takes over every partition.
    first.stop().await;
    let left_at = stream.rounds();
    let pool = env.pool.clone();
    eventually("the second member to handle every aggregate alone", WAIT, || {
        let pool = pool.clone();
        async move {
            let caught_up: i64 =
                sqlx::query_scalar("SELECT count(DISTINCT aggregate_id) FROM effects WHERE n > $1")
                    .bind(left_at)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            (caught_up == AGGREGATES).then_some(())
        }
    })
    .await;
    let rounds = stream.stop().await;

    // Everything published, handled and committed: nothing more is on its way.
    let events = rounds * AGGREGATES;
    eventually_published(&env.pool).await;
    let topic = topic_name(&env.kafka, "account");
    let messages =
        read_topic(&env.kafka, &topic, WAIT, move |m| distinct_ids(m.iter()) as i64 == events).await;
    let end = offsets_after(&messages, 0..partitions as i32);
    let (kafka, expected) = (env.kafka.clone(), end.clone());
    eventually("the group to commit past every event", WAIT, || {
        let (kafka, topic, expected) = (kafka.clone(), topic.clone(), expected.clone());
        async move {
            let committed = committed(&kafka, GROUP, &topic).await;
            expected.iter().all(|(p, end)| committed.get(p).is_some_and(|c| c >= end)).then_some(())
        }
    })
    .await;
    assert_eq!(count(&env.pool, "SELECT count(*) FROM effects").await, events, "one effect per event");
    assert_eq!(count(&env.pool, "SELECT count(DISTINCT event_id) FROM effects").await, events);
    let per_aggregate = effects_per_aggregate(&env.pool).await;
    assert_eq!(per_aggregate.len() as i64, AGGREGATES);
    for (agg, ns) in &per_aggregate {
        assert_eq!(ns, &(1..=rounds).collect::<Vec<_>>(), "handled once each, in order: {agg}");
    }
    assert!(!first_handled.lock().unwrap().is_empty() && !second_handled.lock().unwrap().is_empty());
    let duplicates = processed(GROUP, "duplicate");
    assert!(duplicates > 0.0, "the handed-over partitions were delivered again");
    relay.stop().await;
    second.stop().await;
}

/// Writes a backlog, events `1..=events` of each of the aggregates `acc-0`, `acc-1`, ...,
/// in one commit, so that one batch claims every aggregate's head; returns once a relay
/// has claimed them all.
async fn write_backlog_and_await_claim(pool: &PgPool, aggregates: i64, events: i64) {
    let writer = OutboxWriter::new("test");
    let mut tx = pool.begin().await.unwrap();
    for n in 1..=events {
        for agg in 0..aggregates {
            let payload = serde_json::json!({ "account": format!("acc-{agg}"), "n": n });
            let event = NewEvent::new("account", format!("acc-{agg}"), "AccountCredited", payload).unwrap();
            writer.append(&mut tx, event).await.unwrap();
        }
    }
    tx.commit().await.unwrap();
    eventually("a relay to claim every head", WAIT, || async {
        (claimed_rows(pool).await == aggregates).then_some(())
    })
    .await;
}

/// Whether `m` belongs to the backlog of [`write_backlog_and_await_claim`].
fn in_backlog(m: &OwnedMessage, aggregates: i64) -> bool {
    (0..aggregates).any(|agg| m.key() == Some(format!("acc-{agg}").as_bytes()))
}

/// Reads the account topic until every event of the backlog is there, then asserts that
/// each is there once and each aggregate's events are in order.
async fn assert_backlog_sent_once_in_order(kafka: &KafkaSettings, aggregates: i64, events: i64) {
    let topic = topic_name(kafka, "account");
    let messages = read_topic(kafka, &topic, WAIT, move |m| {
        distinct_ids(m.iter().filter(|m| in_backlog(m, aggregates))) as i64 == aggregates * events
    })
    .await;
    let sent = messages.iter().filter(|m| in_backlog(m, aggregates)).count() as i64;
    assert_eq!(sent, aggregates * events, "each event once");
    let per_aggregate = assert_per_aggregate_order(&messages);
    for agg in 0..aggregates {
        assert_eq!(per_aggregate[&format!("acc-{agg}")], (1..=events).collect::<Vec<_>>(), "acc-{agg}");
    }
}

/// Unpublished rows locked by a relay's claim (a row lock leaves the locker
/// in the row's `xmax`; reading it takes no lock, so it claims nothing).
async fn claimed_rows(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM outbox WHERE xmax::text <> '0'").await
}

async fn eventually_published(pool: &PgPool) {
    let pool = pool.clone();
    eventually("every outbox row to be published", WAIT, || {
        let pool = pool.clone();
        async move { (count(&pool, "SELECT count(*) FROM outbox").await == 0).then_some(()) }
    })
    .await;
}

fn distinct_ids<'a>(messages: impl Iterator<Item = &'a OwnedMessage>) -> usize {
    messages.filter_map(|m| header(m, "ce_id")).collect::<BTreeSet<_>>().len()
}

/// Per aggregate, the `n`s of its effects in the order they were written.
async fn effects_per_aggregate(pool: &PgPool) -> HashMap<String, Vec<i64>> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT aggregate_id, n FROM effects ORDER BY k").fetch_all(pool).await.unwrap();
    let mut per: HashMap<String, Vec<i64>> = HashMap::new();
    for (agg, n) in rows {
        per.entry(agg).or_default().push(n);
    }
    per
}

/// `consumer_processed_total` of `group` with `outcome`, over its topics.
fn processed(group: &str, outcome: &str) -> f64 {
    sagaworks_runtime::metrics::render()
        .lines()
        .filter(|l| l.starts_with("consumer_processed_total{"))
        .filter(|l| {
            l.contains(&format!("group=\"{group}\"")) && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Decides whether round `next` may be written.
type Ready = fn(PgPool, i64) -> BoxFuture<'static, bool>;

/// A writer of rounds: round `n` is one `credit` of `n` per aggregate (with
/// the stream's aggregate names), written once `ready` says so; it stops
/// when told to.
struct Stream {
    stop: CancellationToken,
    rounds: Arc<AtomicI64>,
    task: tokio::task::JoinHandle<()>,
}

impl Stream {
    fn start(pool: PgPool, aggregates: i64, ready: Ready) -> Self {
        let (stop, rounds) = (CancellationToken::new(), Arc::new(AtomicI64::new(0)));
        let task = tokio::spawn({
            let (stop, rounds) = (stop.clone(), rounds.clone());
            async move {
                let mut n = 0;
                while !stop.is_cancelled() {
                    if !ready(pool.clone(), n + 1).await {
                        // Polls the condition: what it waits for is in the database.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                    n += 1;
                    for agg in 0..aggregates {
                        credit(&pool, &format!("acc-s{agg}"), n, true).await;
                    }
                    rounds.store(n, Ordering::SeqCst);
                }
            }
        });
        Self { stop, rounds, task }
    }

    /// Rounds written completely so far.
    fn rounds(&self) -> i64 {
        self.rounds.load(Ordering::SeqCst)
    }

    /// Stops after the round in hand; returns the rounds written.
    async fn stop(self) -> i64 {
        self.stop.cancel();
        self.task.await.unwrap();
        self.rounds.load(Ordering::SeqCst)
    }
}
