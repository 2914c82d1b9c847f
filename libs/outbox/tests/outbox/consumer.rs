//! The consumer (inbox dedupe, retries, DLQ) end to end: writer -> relay ->
//! Kafka -> consumer -> handler, against real PostgreSQL.

use crate::common::*;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sagaworks_config::KafkaSettings;
use sagaworks_outbox::kafka::{dlq_topic, topic_name};
use sagaworks_outbox::{Consumer, ConsumerSettings, Relay, RelaySettings};
use std::collections::HashMap;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(40);

async fn effects_count(env: &Env) -> i64 {
    count(&env.pool, "SELECT count(*) FROM effects").await
}

async fn wait_for_effects(env: &Env, n: i64) {
    let pool = env.pool.clone();
    sagaworks_test_support::eventually(&format!("{n} effects"), WAIT, || {
        let pool = pool.clone();
        async move { (count(&pool, "SELECT count(*) FROM effects").await >= n).then_some(()) }
    })
    .await;
}

fn start(
    env: &Env,
    relay: RelaySettings,
    consumer: ConsumerSettings,
    handler: Recorder,
) -> (Running, Running) {
    let r = Relay::new(env.pool.clone(), &env.kafka, relay).unwrap();
    let c = Consumer::new(env.pool.clone(), &env.kafka, consumer, handler).unwrap();
    (Running::spawn(|t| r.run(t)), Running::spawn(|t| c.run(t)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_and_the_inbox_give_one_effect_per_event_in_aggregate_order() {
    let env = env("consumer_once").await;
    let settings = || RelaySettings { batch_size: 5, ..relay_settings() };
    let second = Relay::new(env.pool.clone(), &env.kafka, settings()).unwrap();
    let second = Running::spawn(|t| second.run(t));
    let (relay, consumer) =
        start(&env, settings(), consumer_settings("g-once", &["account"]), Recorder::default());

    let writers: Vec<_> = (0..4)
        .map(|w| {
            let pool = env.pool.clone();
            tokio::spawn(async move {
                for n in 1..=8 {
                    for agg in (w * 5)..(w * 5 + 5) {
                        credit(&pool, &format!("acc-{agg}"), n, true).await;
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    wait_for_effects(&env, 160).await;
    // Let any duplicate deliveries arrive before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(effects_count(&env).await, 160, "exactly one effect per event");
    assert_eq!(count(&env.pool, "SELECT count(DISTINCT event_id) FROM effects").await, 160);
    assert_eq!(count(&env.pool, "SELECT count(*) FROM inbox WHERE consumer_group = 'g-once'").await, 160);
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT aggregate_id, n FROM effects ORDER BY k").fetch_all(&env.pool).await.unwrap();
    let mut per: HashMap<String, Vec<i64>> = HashMap::new();
    for (agg, n) in rows {
        per.entry(agg).or_default().push(n);
    }
    assert_eq!(per.len(), 20);
    for (agg, ns) in per {
        assert_eq!(ns, (1..=8).collect::<Vec<_>>(), "handled in order: {agg}");
    }
    relay.stop().await;
    second.stop().await;
    consumer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_are_dead_lettered_and_the_consumer_keeps_going() {
    let env = env("consumer_poison").await;
    let handler =
        Recorder { script: Script { permanent: vec![2], ..Default::default() }, ..Default::default() };
    let (relay, consumer) =
        start(&env, relay_settings(), consumer_settings("g-poison", &["account"]), handler);
    credit(&env.pool, "acc-a", 1, true).await;
    wait_for_effects(&env, 1).await;

    // Raw, non-CloudEvents messages on every partition (the consumer created the topic).
    let topic = topic_name(&env.kafka, "account");
    let producer: FutureProducer = sagaworks_outbox::kafka::client_config(&env.kafka, &[]).create().unwrap();
    for p in 0..3 {
        producer
            .send(
                FutureRecord::to(&topic).partition(p).key("raw").payload("not an event"),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
    }
    let bad = credit(&env.pool, "acc-b", 2, true).await;
    for (i, agg) in ["acc-a", "acc-b", "acc-c", "acc-d"].iter().enumerate() {
        credit(&env.pool, agg, 3 + i as i64, true).await;
    }
    wait_for_effects(&env, 5).await;
    let ns: Vec<i64> =
        sqlx::query_scalar("SELECT n FROM effects ORDER BY n").fetch_all(&env.pool).await.unwrap();
    assert_eq!(ns, vec![1, 3, 4, 5, 6], "later messages are processed, the poison one is not");

    let dlq = read_topic(&env.kafka, &dlq_topic(&topic), WAIT, |m| m.len() >= 4).await;
    assert_eq!(dlq.len(), 4, "three raw messages and one rejected event");
    let rejected =
        dlq.iter().find(|m| header(m, "ce_id") == Some(bad.to_string().as_str())).expect("rejected event");
    assert!(header(rejected, "dlq_error").unwrap().contains("event 2 is marked bad"));
    assert_eq!(header(rejected, "dlq_attempts"), Some("1"), "permanent errors are not retried");
    assert_eq!(header(rejected, "dlq_reason"), Some("rejected"));
    assert_eq!(header(rejected, "dlq_original_topic"), Some(topic.as_str()));
    assert_eq!(header(rejected, "ce_type"), Some("AccountCredited"), "original headers are kept");
    assert_eq!(payload_json(rejected)["n"], 2);
    assert!(header(rejected, "dlq_original_offset").unwrap().parse::<i64>().is_ok());
    let raw: Vec<_> = dlq.iter().filter(|m| m.key() == Some(b"raw".as_slice())).collect();
    assert_eq!(raw.len(), 3);
    let mut partitions: Vec<&str> =
        raw.iter().map(|m| header(m, "dlq_original_partition").unwrap()).collect();
    partitions.sort();
    assert_eq!(partitions, vec!["0", "1", "2"]);
    for m in raw {
        assert_eq!(header(m, "dlq_error"), Some("header ce_id is missing"));
        assert_eq!(header(m, "dlq_reason"), Some("invalid_envelope"));
        assert_eq!(m.payload(), Some(b"not an event".as_slice()));
    }
    relay.stop().await;
    consumer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_errors_are_retried_then_succeed_once_or_are_dead_lettered_after_max_attempts() {
    let env = env("consumer_retry").await;
    let handler = Recorder {
        script: Script { fail_attempts: HashMap::from([(1, 3), (2, 100)]), ..Default::default() },
        ..Default::default()
    };
    let attempts = handler.attempts.clone();
    let traceparents = handler.traceparents.clone();
    let settings = ConsumerSettings { max_attempts: 4, ..consumer_settings("g-retry", &["account"]) };
    let (relay, consumer) = start(&env, relay_settings(), settings, handler);

    // The consumer hands the raw traceparent of the writing span to the
    // handler. (The telemetry crate fills the column from the current span;
    // here it is set on the writing transaction itself.)
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut tx = env.pool.begin().await.unwrap();
    let event = sagaworks_outbox::NewEvent::new(
        "account",
        "acc-a",
        "AccountCredited",
        serde_json::json!({ "account": "acc-a", "n": 1 }),
    )
    .unwrap();
    let first = sagaworks_outbox::OutboxWriter::new("test").append(&mut tx, event).await.unwrap();
    sqlx::query("UPDATE outbox SET traceparent = $1 WHERE id = $2")
        .bind(tp)
        .bind(first)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let doomed = credit(&env.pool, "acc-b", 2, true).await;
    credit(&env.pool, "acc-b", 3, true).await;
    wait_for_effects(&env, 2).await;

    let ns: Vec<i64> =
        sqlx::query_scalar("SELECT n FROM effects ORDER BY k").fetch_all(&env.pool).await.unwrap();
    assert!(ns.contains(&1) && ns.contains(&3) && ns.len() == 2, "{ns:?}");
    assert_eq!(attempts.lock().unwrap()[&first], 3, "succeeded on the third attempt");
    assert_eq!(attempts.lock().unwrap()[&doomed], 4, "gave up after max_attempts");
    let topic = topic_name(&env.kafka, "account");
    let dlq = read_topic(&env.kafka, &dlq_topic(&topic), WAIT, |m| !m.is_empty()).await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(header(&dlq[0], "ce_id"), Some(doomed.to_string().as_str()));
    assert_eq!(header(&dlq[0], "dlq_attempts"), Some("4"));
    assert_eq!(header(&dlq[0], "dlq_reason"), Some("retries_exhausted"));
    assert!(header(&dlq[0], "dlq_error").unwrap().contains("attempt 4 of event 2"));
    assert!(traceparents.lock().unwrap().iter().all(|t| t.as_deref() == Some(tp) || t.is_none()));
    assert!(traceparents.lock().unwrap().contains(&Some(tp.to_string())), "traceparent passed through");
    relay.stop().await;
    consumer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivered_events_change_nothing() {
    let env = env("consumer_redeliver").await;
    let _ = sagaworks_runtime::metrics::handle();
    record_relayed(&env.pool).await;
    let (relay, consumer) =
        start(&env, relay_settings(), consumer_settings("g-redeliver", &["account"]), Recorder::default());
    for n in 1..=5 {
        credit(&env.pool, &format!("acc-{n}"), n, true).await;
    }
    wait_for_effects(&env, 5).await;

    // Publish every event a second time, as a relay that crashed before
    // deleting its batch would: the published rows back in the outbox.
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, schema_version, data_schema, source,
                             content_type, payload, traceparent, tracestate, created_at)
         SELECT id, aggregate_type, aggregate_id, event_type, schema_version, data_schema, source,
                content_type, payload, traceparent, tracestate, created_at
         FROM relayed ORDER BY seq",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    sagaworks_test_support::eventually("duplicates seen by the consumer", WAIT, || async {
        let text = sagaworks_runtime::metrics::render();
        let dupes = text
            .lines()
            .find(|l| l.starts_with("consumer_processed_total") && l.contains("outcome=\"duplicate\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        (dupes >= 5.0).then_some(())
    })
    .await;
    assert_eq!(effects_count(&env).await, 5, "redelivery changed nothing");
    let text = sagaworks_runtime::metrics::render();
    assert!(
        text.lines().any(|l| l.starts_with("consumer_processed_total")
            && l.contains("outcome=\"processed\"")
            && l.ends_with(" 5")),
        "{text}"
    );
    // consumer_lag is reported per assigned partition; all caught up by now.
    sagaworks_test_support::eventually("consumer_lag at 0", WAIT, || async {
        let text = sagaworks_runtime::metrics::render();
        let lags: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with("consumer_lag{") && l.contains("group=\"g-redeliver\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        (!lags.is_empty() && lags.iter().all(|l| *l == 0.0)).then_some(())
    })
    .await;
    relay.stop().await;
    consumer.stop().await;
}

/// Offsets are committed only for handled messages, all of them: every
/// `commit_interval_ms` while the consumer runs, and once more when it stops
/// (with an interval longer than the test, only that last commit happens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handled_offsets_are_committed_in_the_background_and_when_the_consumer_stops() {
    let env = env("consumer_offsets").await;
    let topic = topic_name(&env.kafka, "account");
    let settings = |group, interval| ConsumerSettings {
        commit_interval_ms: interval,
        ..consumer_settings(group, &["account"])
    };
    let (relay, consumer) = start(&env, relay_settings(), settings("g-offsets", 300), Recorder::default());
    for n in 1..=10 {
        credit(&env.pool, &format!("acc-{}", n % 4), n, true).await;
    }
    wait_for_effects(&env, 10).await;
    let messages = read_topic(&env.kafka, &topic, WAIT, |m| m.len() >= 10).await;
    assert_eq!(messages.len(), 10);
    let partitions = committed(&env.kafka, "g-offsets", &topic).await.into_keys();
    let handled = offsets_after(&messages, partitions);
    let (kafka, expected) = (env.kafka.clone(), handled.clone());
    sagaworks_test_support::eventually("offsets committed while running", WAIT, || {
        let (kafka, topic, expected) = (kafka.clone(), topic.clone(), expected.clone());
        async move { (committed(&kafka, "g-offsets", &topic).await == expected).then_some(()) }
    })
    .await;
    consumer.stop().await;

    // A second group that commits only when it stops.
    let late = Consumer::new(
        env.pool.clone(),
        &env.kafka,
        settings("g-offsets-late", 3_600_000),
        Recorder::default(),
    )
    .unwrap();
    let late = Running::spawn(|t| late.run(t));
    wait_for_effects(&env, 20).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before_stop = committed(&env.kafka, "g-offsets-late", &topic).await;
    assert!(before_stop.values().all(Option::is_none), "nothing committed before the stop: {before_stop:?}");
    late.stop().await;
    assert_eq!(
        committed(&env.kafka, "g-offsets-late", &topic).await,
        handled,
        "the stop committed what was handled"
    );
    relay.stop().await;
}

/// Messages waiting for a worker are handled in one transaction each batch
/// (rows committed together share their `xmin`), still once each and in
/// order; a batch with a failing event is rolled back and handled message by
/// message, so only that event is retried or dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_handle_waiting_messages_in_one_transaction_and_fall_back_one_by_one_on_failure() {
    let env = env("consumer_batch").await;
    let relay = Relay::new(env.pool.clone(), &env.kafka, relay_settings()).unwrap();
    let relay = Running::spawn(|t| relay.run(t));
    // Everything is on Kafka before the consumer starts, so its workers find full queues.
    let mut bad = None;
    for n in 1..=60 {
        let id = credit(&env.pool, &format!("acc-{}", n % 5), n, true).await;
        if n == 7 {
            bad = Some(id);
        }
    }
    sagaworks_test_support::eventually("the outbox to drain", WAIT, || async {
        (count(&env.pool, "SELECT count(*) FROM outbox").await == 0).then_some(())
    })
    .await;
    let handler = Recorder {
        script: Script { permanent: vec![7], fail_attempts: HashMap::from([(9, 2)]) },
        ..Default::default()
    };
    let settings =
        ConsumerSettings { batch_size: 16, concurrency: 1, ..consumer_settings("g-batch", &["account"]) };
    let consumer = Consumer::new(env.pool.clone(), &env.kafka, settings, handler).unwrap();
    let consumer = Running::spawn(|t| consumer.run(t));

    wait_for_effects(&env, 59).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(effects_count(&env).await, 59, "every event but the bad one, once");
    assert_eq!(count(&env.pool, "SELECT count(DISTINCT event_id) FROM effects").await, 59);
    assert_eq!(count(&env.pool, "SELECT count(*) FROM effects WHERE n = 7").await, 0);
    let transactions = count(&env.pool, "SELECT count(DISTINCT xmin::text) FROM effects").await;
    assert!(transactions < 30, "59 effects in {transactions} transactions: no batching");
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT aggregate_id, n FROM effects ORDER BY k").fetch_all(&env.pool).await.unwrap();
    let mut per: HashMap<String, Vec<i64>> = HashMap::new();
    for (agg, n) in rows {
        per.entry(agg).or_default().push(n);
    }
    for (agg, ns) in per {
        let mut sorted = ns.clone();
        sorted.sort();
        assert_eq!(ns, sorted, "handled in order: {agg}");
    }
    let topic = topic_name(&env.kafka, "account");
    let dlq = read_topic(&env.kafka, &dlq_topic(&topic), WAIT, |m| !m.is_empty()).await;
    assert_eq!(dlq.len(), 1, "only the bad event is dead-lettered");
    assert_eq!(header(&dlq[0], "ce_id"), Some(bad.unwrap().to_string().as_str()));
    relay.stop().await;
    consumer.stop().await;
}

/// With `batch_wait_ms`, a worker that has a message waits for more (up to
/// `batch_size`, for at most that long): events that trickle in one at a time
/// are handled in one transaction instead of one each, still once each and in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_waits_batch_wait_ms_for_more_messages_to_batch() {
    const TRICKLE: i64 = 30;
    let _ = sagaworks_runtime::metrics::handle();
    let env = env("consumer_batch_wait").await;
    // The wait (an hour) cannot run out within the test: the batch closes when it is
    // full, with the first event and the trickle.
    let settings = ConsumerSettings {
        batch_size: TRICKLE as usize + 1,
        batch_wait_ms: 3_600_000,
        concurrency: 1,
        ..consumer_settings("g-wait", &["account"])
    };
    let (relay, consumer) = start(&env, relay_settings(), settings, Recorder::default());
    // The consumer has consumed a first event once it reports a lag for its
    // partition (it reports positions only past a consumed message): from then on
    // its worker holds that event and waits for more.
    credit(&env.pool, "acc-w", 0, true).await;
    sagaworks_test_support::eventually("the first event consumed", WAIT, || async {
        let text = sagaworks_runtime::metrics::render();
        text.lines().any(|l| l.starts_with("consumer_lag{") && l.contains("group=\"g-wait\"")).then_some(())
    })
    .await;
    // The trickle: each event is written once the one before is on Kafka.
    for n in 1..=TRICKLE {
        credit(&env.pool, "acc-w", n, true).await;
        sagaworks_test_support::eventually("the event on Kafka", WAIT, || async {
            (count(&env.pool, "SELECT count(*) FROM outbox").await == 0).then_some(())
        })
        .await;
    }
    wait_for_effects(&env, TRICKLE + 1).await;
    relay.stop().await;
    consumer.stop().await;
    // Stopped: nothing more can be handled, the counts are final.
    let ns: Vec<i64> =
        sqlx::query_scalar("SELECT n FROM effects ORDER BY k").fetch_all(&env.pool).await.unwrap();
    assert_eq!(ns, (0..=TRICKLE).collect::<Vec<_>>(), "once each, in order");
    let transactions = count(&env.pool, "SELECT count(DISTINCT xmin::text) FROM effects").await;
    assert_eq!(transactions, 1, "the worker waited for the whole trickle");
}

/// The inbox forgets a group's events after the group's retention: the
/// consumer deletes its expired rows when it starts (and hourly), and leaves
/// newer rows and other groups' rows alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_purges_its_groups_expired_inbox_rows() {
    let env = env("consumer_inbox_purge").await;
    for (group, hours_ago) in [("g-purge", 30), ("g-purge", 30), ("g-purge", 1), ("other", 30)] {
        sqlx::query(
            "INSERT INTO inbox (consumer_group, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at)
             VALUES ($1, $2, 'AccountCredited', 'account', 0, 0, now() - make_interval(hours => $3))",
        )
        .bind(group)
        .bind(uuid::Uuid::new_v4())
        .bind(hours_ago)
        .execute(&env.pool)
        .await
        .unwrap();
    }
    let consumer =
        ConsumerSettings { inbox_retention_hours: 24, ..consumer_settings("g-purge", &["account"]) };
    let (_relay, _consumer) = start(&env, relay_settings(), consumer, Recorder::default());
    let pool = env.pool.clone();
    sagaworks_test_support::eventually("the expired rows to go", WAIT, || {
        let pool = pool.clone();
        async move {
            (count(&pool, "SELECT count(*) FROM inbox WHERE consumer_group = 'g-purge'").await == 1)
                .then_some(())
        }
    })
    .await;
    let kept = count(&env.pool, "SELECT count(*) FROM inbox WHERE consumer_group = 'g-purge' AND processed_at > now() - interval '2 hours'").await;
    assert_eq!(kept, 1, "the row within the retention stays");
    assert_eq!(
        count(&env.pool, "SELECT count(*) FROM inbox WHERE consumer_group = 'other'").await,
        1,
        "another group's row stays"
    );
}

/// Consumers started at once, each on a topic that exists and three that do
/// not yet (it creates them, then subscribes): each is assigned all four,
/// although the broker may answer the subscription's metadata request before
/// it lists a topic just created. librdkafka then joins the group with the
/// topics it found and leaves the others out of the assignment until its
/// next periodic metadata refresh (`topic.metadata.refresh.interval.ms`,
/// five minutes by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_on_topics_they_create_are_assigned_every_topic() {
    let env = env("consumer_new_topics").await;
    let topics = ["account", "ledger", "audit", "notice"];
    let prefixes: Vec<KafkaSettings> = (0..8)
        .map(|n| KafkaSettings {
            topic_prefix: format!("{}-{n}", env.kafka.topic_prefix),
            ..env.kafka.clone()
        })
        .collect();
    for kafka in &prefixes {
        let account = topic_name(kafka, "account");
        sagaworks_outbox::kafka::ensure_topics(kafka, &[account], Default::default()).await.unwrap();
    }
    let running: Vec<(KafkaSettings, Running)> = prefixes
        .into_iter()
        .map(|kafka| {
            let c = Consumer::new(
                env.pool.clone(),
                &kafka,
                consumer_settings("g-new", &topics),
                Recorder::default(),
            )
            .unwrap();
            (kafka, Running::spawn(|t| c.run(t)))
        })
        .collect();
    for (kafka, _) in &running {
        for topic in topics {
            let topic = topic_name(kafka, topic);
            sagaworks_test_support::eventually(&format!("{topic} assigned"), WAIT, || async {
                assigned(kafka, "g-new", &topic).await.then_some(())
            })
            .await;
        }
    }
    for (_, c) in running {
        c.stop().await;
    }
}
