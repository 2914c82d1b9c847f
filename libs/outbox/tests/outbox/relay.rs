//! The relay against real PostgreSQL and Apache Kafka.

use crate::common::*;
use rdkafka::message::Message;
use sagaworks_outbox::kafka::topic_name;
use sagaworks_outbox::testing::{MAX_PAYLOAD_BYTES, NOTIFY_CHANNEL, WAKE_LOCK};
use sagaworks_outbox::{NewEvent, OutboxError, OutboxWriter, PendingEvent, PendingEvents, Relay};
use sagaworks_test_support::Broker;
use sqlx::AssertSqlSafe;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// Relay settings whose polling fallback (an hour) cannot fire within a test: an
/// event that a parked relay publishes at all (within a test's deadline, which
/// only turns a hang into a failure) was published because the wake-up
/// protocol (a writer's NOTIFY, see `sagaworks_outbox::wake`) woke the relay.
fn no_polling() -> sagaworks_outbox::RelaySettings {
    sagaworks_outbox::RelaySettings { poll_interval_ms: 3_600_000, ..relay_settings() }
}

/// `outbox_publish_errors_total` of relays labelled `service`.
fn publish_errors(service: &str) -> f64 {
    let series = format!("outbox_publish_errors_total{{service=\"{service}\"}} ");
    sagaworks_runtime::metrics::render()
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_event_is_published_with_key_headers_and_payload_and_rolled_back_one_never() {
    let env = env("relay_commit").await;
    sagaworks_outbox::ledger::install(&env.pool).await.unwrap();
    let relay = Relay::new(env.pool.clone(), &env.kafka, relay_settings()).unwrap();
    let running = Running::spawn(|t| relay.run(t));

    let committed = credit(&env.pool, "acc-1", 7, true).await;
    let rolled_back = credit(&env.pool, "acc-1", 8, false).await;
    // A later committed marker of the same aggregate (so the same partition,
    // read in order): once it is on the topic, anything published before it
    // would be too.
    let marker = credit(&env.pool, "acc-1", 9, true).await;

    let topic = topic_name(&env.kafka, "account");
    let marker_s = marker.to_string();
    let msgs = read_topic(&env.kafka, &topic, WAIT, move |m| {
        m.iter().any(|m| header(m, "ce_id") == Some(marker_s.as_str()))
    })
    .await;
    let ids: Vec<&str> = msgs.iter().filter_map(|m| header(m, "ce_id")).collect();
    assert!(ids.contains(&marker.to_string().as_str()), "marker published: {ids:?}");
    assert!(!ids.contains(&rolled_back.to_string().as_str()), "rolled-back event must never be published");

    let m =
        msgs.iter().find(|m| header(m, "ce_id") == Some(committed.to_string().as_str())).expect("committed");
    assert_eq!(m.key(), Some(b"acc-1".as_slice()));
    assert_eq!(header(m, "ce_type"), Some("AccountCredited"));
    assert_eq!(header(m, "ce_source"), Some("/sagaworks/test"));
    assert_eq!(header(m, "ce_specversion"), Some("1.0"));
    assert_eq!(header(m, "ce_schemaversion"), Some("1"));
    assert_eq!(header(m, "ce_aggregateid"), Some("acc-1"));
    assert_eq!(header(m, "content-type"), Some("application/json"));
    let time = chrono::DateTime::parse_from_rfc3339(header(m, "ce_time").unwrap()).expect("RFC 3339 ce_time");
    assert!((chrono::Utc::now() - time.to_utc()).num_seconds() < 60);
    assert_eq!(payload_json(m), serde_json::json!({ "account": "acc-1", "n": 7 }));

    // Published rows are deleted; the ledger shows what was written: the rollback left no row.
    eventually_empty_backlog(&env).await;
    assert_eq!(count(&env.pool, "SELECT count(*) FROM outbox").await, 0);
    assert_eq!(count(&env.pool, "SELECT count(*) FROM outbox_ledger").await, 2, "the rollback left no row");
    running.stop().await;
}

/// `outbox_publish_latency_seconds` gets one sample per acked event: its age
/// (commit to ack), which cannot exceed the time since the test wrote it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_acked_event_records_its_age_in_the_publish_latency_histogram() {
    let _ = sagaworks_runtime::metrics::handle();
    let env = env("relay_latency").await;
    let written_after = std::time::Instant::now();
    for n in 1..=5 {
        credit(&env.pool, "acc-1", n, true).await;
    }
    let settings = sagaworks_outbox::RelaySettings { service: "relay-latency".into(), ..relay_settings() };
    let relay = Relay::new(env.pool.clone(), &env.kafka, settings).unwrap();
    let running = Running::spawn(|t| relay.run(t));
    eventually_empty_backlog(&env).await;
    let most = written_after.elapsed().as_secs_f64();
    running.stop().await;
    let text = sagaworks_runtime::metrics::render();
    let sample = |name: &str| {
        let series = format!("{name}{{service=\"relay-latency\"}} ");
        text.lines().find_map(|l| l.strip_prefix(series.as_str())?.trim().parse::<f64>().ok())
    };
    assert_eq!(sample("outbox_publish_latency_seconds_count"), Some(5.0), "{text}");
    let sum = sample("outbox_publish_latency_seconds_sum").unwrap();
    assert!(sum > 0.0 && sum <= 5.0 * most, "five ages of at most {most} s each, in seconds: {sum}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_written_while_the_broker_is_down_arrive_in_order_once_it_is_back() {
    let _ = sagaworks_runtime::metrics::handle();
    let mut env = env_on("relay_outage", Broker::private().await).await;
    let settings = sagaworks_outbox::RelaySettings { service: "relay-outage".into(), ..relay_settings() };
    let relay = Relay::new(env.pool.clone(), &env.kafka, settings).unwrap();
    let running = Running::spawn(|t| relay.run(t));
    // The relay is up and has published once before the outage.
    credit(&env.pool, "warmup", 0, true).await;
    let topic = topic_name(&env.kafka, "account");
    read_topic(&env.kafka, &topic, WAIT, |m| !m.is_empty()).await;

    env.broker.stop();
    for n in 1..=20 {
        credit(&env.pool, &format!("acc-{}", n % 4), n, true).await;
    }
    // The relay has tried to send them (the warm-up is out, so a failed send is
    // one of these) and failed: no row may be deleted.
    sagaworks_test_support::eventually("a failed send", WAIT, || async {
        (publish_errors("relay-outage") > 0.0).then_some(())
    })
    .await;
    let backlog = count(&env.pool, "SELECT count(*) FROM outbox").await;
    assert_eq!(backlog, 20, "no row is deleted while the broker is down");

    env.broker.restart().await;
    let msgs = read_topic(&env.kafka, &topic, Duration::from_secs(60), |m| {
        let mut ns: Vec<i64> = m.iter().map(|m| payload_json(m)["n"].as_i64().unwrap()).collect();
        ns.sort();
        ns.dedup();
        ns.iter().filter(|n| **n > 0).count() == 20
    })
    .await;
    let per_aggregate = assert_per_aggregate_order(&msgs);
    let total: usize =
        per_aggregate.iter().filter(|(k, _)| k.starts_with("acc-")).map(|(_, v)| v.len()).sum();
    assert_eq!(total, 20, "every event written during the outage arrived: {per_aggregate:?}");
    eventually_empty_backlog(&env).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_table_keep_every_aggregate_in_order() {
    const AGGREGATES: i64 = 6;
    const EVENTS: i64 = 40;
    let env = env("relay_two").await;
    // Few aggregates, interleaved, small batches: without head claiming the two
    // relays would hold events of one aggregate in flight at the same time.
    let write = |from: i64, to: i64| {
        let writers: Vec<_> = (0..3)
            .map(|w| {
                let pool = env.pool.clone();
                tokio::spawn(async move {
                    for n in from..=to {
                        for agg in [w * 2, w * 2 + 1] {
                            credit(&pool, &format!("acc-{agg}"), n, true).await;
                        }
                    }
                })
            })
            .collect::<Vec<_>>();
        async move {
            for w in writers {
                w.await.unwrap();
            }
        }
    };
    // A backlog first, so both relays start on a full table ...
    write(1, EVENTS / 2).await;
    let settings = || sagaworks_outbox::RelaySettings { batch_size: 3, ..relay_settings() };
    let a = Relay::new(env.pool.clone(), &env.kafka, settings()).unwrap();
    let b = Relay::new(env.pool.clone(), &env.kafka, settings()).unwrap();
    let ra = Running::spawn(|t| a.run(t));
    let rb = Running::spawn(|t| b.run(t));
    // ... then more events while they run.
    write(EVENTS / 2 + 1, EVENTS).await;

    let topic = topic_name(&env.kafka, "account");
    let msgs = read_topic(&env.kafka, &topic, Duration::from_secs(60), |m| {
        let mut ids: Vec<&str> = m.iter().filter_map(|m| header(m, "ce_id")).collect();
        ids.sort();
        ids.dedup();
        ids.len() as i64 == AGGREGATES * EVENTS
    })
    .await;
    let per_aggregate = assert_per_aggregate_order(&msgs);
    assert_eq!(per_aggregate.len() as i64, AGGREGATES);
    for (agg, ns) in &per_aggregate {
        assert_eq!(ns, &(1..=EVENTS).collect::<Vec<_>>(), "{agg}");
    }
    eventually_empty_backlog(&env).await;
    ra.stop().await;
    rb.stop().await;
}

#[tokio::test]
async fn payload_over_the_limit_is_refused_at_write_time() {
    let db = sagaworks_test_support::TestDatabase::create("outbox_big").await;
    let pool = db.pool().await;
    sagaworks_runtime::db::migrate(&pool, &mut [sagaworks_outbox::migrator()]).await.unwrap();
    let writer = OutboxWriter::new("test");
    let mut tx = pool.begin().await.unwrap();
    let big = "x".repeat(MAX_PAYLOAD_BYTES);
    let err = writer.append(&mut tx, NewEvent::new("account", "a", "Big", &big).unwrap()).await.unwrap_err();
    assert!(
        matches!(err, OutboxError::PayloadTooLarge { size, max, .. } if size == MAX_PAYLOAD_BYTES + 2 && max == MAX_PAYLOAD_BYTES),
        "{err}"
    );
    // Just under the limit (the JSON string adds two quotes) is accepted.
    let fits = "x".repeat(MAX_PAYLOAD_BYTES - 2);
    writer.append(&mut tx, NewEvent::new("account", "a", "Fits", &fits).unwrap()).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_backlog_gauge_equals_the_unpublished_count() {
    use sagaworks_runtime::Readiness;
    let env = env("relay_metrics").await;
    let _ = sagaworks_runtime::metrics::handle();
    let ready = Readiness::new().with_gauges(sagaworks_outbox::testing::OutboxGauges {
        pool: env.pool.clone(),
        service: "test".into(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, ready.router()).await.unwrap() });
    let scrape = || async move {
        let body = reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap();
        let value = |name: &str| -> Option<f64> {
            body.lines()
                .find(|l| l.starts_with(&format!("{name}{{service=\"test\"}}")))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
        };
        (
            value("outbox_backlog"),
            value("outbox_oldest_unpublished_age_seconds"),
            value("outbox_published_total"),
        )
    };

    for n in 1..=5 {
        credit(&env.pool, &format!("acc-{n}"), n, true).await;
    }
    sqlx::query("UPDATE outbox SET created_at = now() - interval '10 seconds'")
        .execute(&env.pool)
        .await
        .unwrap();
    let (backlog, age, _) = scrape().await;
    assert_eq!(backlog, Some(5.0));
    assert!(age.unwrap() >= 10.0, "{age:?}");

    let relay = Relay::new(env.pool.clone(), &env.kafka, relay_settings()).unwrap();
    let running = Running::spawn(|t| relay.run(t));
    eventually_empty_backlog(&env).await;
    running.stop().await;
    let (backlog, age, published) = scrape().await;
    assert_eq!(backlog, Some(0.0));
    assert_eq!(age, Some(0.0));
    assert_eq!(published, Some(5.0));

    credit(&env.pool, "acc-9", 9, true).await;
    let (backlog, _, _) = scrape().await;
    assert_eq!(backlog, Some(1.0), "scrape hook refreshes without a relay running");
}

async fn eventually_empty_backlog(env: &Env) {
    let pool = env.pool.clone();
    sagaworks_test_support::eventually("empty outbox backlog", WAIT, || {
        let pool = pool.clone();
        async move {
            let n = count(&pool, "SELECT count(*) FROM outbox").await;
            (n == 0).then_some(())
        }
    })
    .await;
}

/// A business statement can insert its event itself ([`PendingEvent`]): the
/// event exists exactly when the statement wrote, its NOTIFY wakes the relay,
/// and it is published like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_event_is_written_by_its_business_statement_only_when_that_writes() {
    let env = env("relay_pending").await;
    let relay = Relay::new(relay_pool(&env, "relay").await, &env.kafka, no_polling()).unwrap();
    let running = Running::spawn(|t| relay.run(t));
    // Asleep: from now on only a writer's NOTIFY wakes it (see `no_polling`).
    eventually_asleep(&env, &["relay"]).await;
    sqlx::query("INSERT INTO accounts (id, balance) VALUES ('acc-1', 10)").execute(&env.pool).await.unwrap();

    // One statement, outside any transaction: debit when the balance suffices,
    // and the event with it.
    let sql = format!(
        "WITH debit AS (UPDATE accounts SET balance = balance - $2 WHERE id = $1 AND balance >= $2 RETURNING id),
              {}
         SELECT count(*) FROM debit",
        PendingEvent::cte("event", 3, Some("debit")),
    );
    let writer = OutboxWriter::new("test");
    let mut written = vec![];
    for n in [7, 7] {
        let event =
            NewEvent::new("account", "acc-1", "AccountDebited", serde_json::json!({ "n": n })).unwrap();
        let event = writer.stage(event).unwrap();
        let id = event.id();
        let debited: i64 = event
            .bind(sqlx::query_scalar(AssertSqlSafe(sql.clone())).bind("acc-1").bind(n))
            .fetch_one(&env.pool)
            .await
            .unwrap();
        written.push((id, debited));
    }
    assert_eq!(written.iter().map(|(_, d)| *d).collect::<Vec<_>>(), [1, 0], "the second debit is refused");
    assert_eq!(count(&env.pool, "SELECT count(*) FROM outbox").await, 1, "no event without its write");
    let first = written[0].0.to_string();

    let topic = topic_name(&env.kafka, "account");
    let wanted = first.clone();
    // Published at all: woken by the statement's NOTIFY (the poll cannot fire).
    let msgs = read_topic(&env.kafka, &topic, WAIT, move |m| {
        m.iter().any(|m| header(m, "ce_id") == Some(wanted.as_str()))
    })
    .await;
    let m = msgs.iter().find(|m| header(m, "ce_id") == Some(first.as_str())).unwrap();
    assert_eq!(m.key(), Some(b"acc-1".as_slice()));
    assert_eq!(header(m, "ce_type"), Some("AccountDebited"));
    assert_eq!(header(m, "ce_source"), Some("/sagaworks/test"));
    assert_eq!(payload_json(m), serde_json::json!({ "n": 7 }));
    eventually_empty_backlog(&env).await;
    running.stop().await;
}

/// [`PendingEvents`]: one business statement records several events, of
/// several aggregates, in the order given (so an aggregate's events keep
/// their order on Kafka), and wakes the relay like a single one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_events_are_written_by_one_statement_in_the_order_given() {
    let env = env("relay_pending_many").await;
    let relay = Relay::new(relay_pool(&env, "relay").await, &env.kafka, no_polling()).unwrap();
    let running = Running::spawn(|t| relay.run(t));
    // Asleep: from now on only a writer's NOTIFY wakes it (see `no_polling`).
    eventually_asleep(&env, &["relay"]).await;
    let writer = OutboxWriter::new("test");
    let mut events = PendingEvents::new();
    let mut ids = vec![];
    for (account, n) in [("acc-1", 1), ("acc-2", 2), ("acc-1", 3)] {
        let event =
            NewEvent::new("account", account, "AccountCredited", serde_json::json!({ "n": n })).unwrap();
        let event = writer.stage(event).unwrap();
        ids.push(event.id());
        events.push(event);
    }
    let sql = format!(
        "WITH credit AS (INSERT INTO accounts (id, balance) VALUES ('acc-1', 4), ('acc-2', 2) RETURNING id),
              {}
         SELECT count(*) FROM credit",
        PendingEvents::cte("events", 1),
    );
    let credited: i64 =
        events.bind(sqlx::query_scalar(AssertSqlSafe(sql))).fetch_one(&env.pool).await.unwrap();
    assert_eq!(credited, 2);
    let rows: Vec<(uuid::Uuid, String)> = sqlx::query_as("SELECT id, aggregate_id FROM outbox ORDER BY seq")
        .fetch_all(&env.pool)
        .await
        .unwrap();
    let expected: Vec<(uuid::Uuid, String)> =
        ids.iter().zip(["acc-1", "acc-2", "acc-1"]).map(|(id, a)| (*id, a.to_string())).collect();
    assert_eq!(rows, expected, "one row per event, in the order given");

    let topic = topic_name(&env.kafka, "account");
    // Published at all: woken by the statement's NOTIFY (the poll cannot fire).
    let msgs = read_topic(&env.kafka, &topic, WAIT, |m| m.len() >= 3).await;
    let of_acc_1: Vec<serde_json::Value> =
        msgs.iter().filter(|m| m.key() == Some(b"acc-1".as_slice())).map(payload_json).collect();
    assert_eq!(of_acc_1, [serde_json::json!({ "n": 1 }), serde_json::json!({ "n": 3 })]);
    let m = msgs.iter().find(|m| m.key() == Some(b"acc-2".as_slice())).unwrap();
    assert_eq!(header(m, "ce_id"), Some(ids[1].to_string().as_str()));
    assert_eq!(header(m, "ce_source"), Some("/sagaworks/test"));
    eventually_empty_backlog(&env).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_the_relay_long_before_the_polling_fallback() {
    let env = env("relay_notify").await;
    let relay = Relay::new(relay_pool(&env, "relay").await, &env.kafka, no_polling()).unwrap();
    let running = Running::spawn(|t| relay.run(t));
    // Asleep after its first (empty) batches: from now on only a NOTIFY wakes it.
    eventually_asleep(&env, &["relay"]).await;
    credit(&env.pool, "acc-1", 1, true).await;
    // Published at all: woken by NOTIFY (the hour-long poll cannot fire).
    eventually_empty_backlog(&env).await;
    running.stop().await;

    let disabled = sagaworks_outbox::RelaySettings { enabled: false, ..relay_settings() };
    let relay = Relay::new(env.pool.clone(), &env.kafka, disabled).unwrap();
    tokio::time::timeout(Duration::from_secs(1), relay.run(tokio_util::sync::CancellationToken::new()))
        .await
        .expect("a disabled relay returns at once");
}

/// Commits that arrive faster than `min_batch_interval_ms` share a batch
/// (a batch deletes its rows in one transaction: one `batch` in `relayed`);
/// with the interval at 0 every commit gets a batch of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_within_the_batch_interval_share_a_batch() {
    let env = env("relay_pace").await;
    record_relayed(&env.pool).await;
    let batches = |pool: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(DISTINCT batch) FROM relayed")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    for (interval, fewest, most) in [(1_000, 1, 3), (0, 8, 10)] {
        sqlx::query("TRUNCATE outbox, relayed").execute(&env.pool).await.unwrap();
        let settings = sagaworks_outbox::RelaySettings { min_batch_interval_ms: interval, ..no_polling() };
        let name = format!("relay-{interval}");
        let relay = Relay::new(relay_pool(&env, &name).await, &env.kafka, settings).unwrap();
        let running = Running::spawn(|t| relay.run(t));
        // A fresh producer's first send waits for its connection to the broker: one
        // event first, so that the batches below are paced by the interval, not by that.
        credit(&env.pool, "warm-up", 0, true).await;
        eventually_empty_backlog(&env).await;
        sqlx::query("TRUNCATE relayed").execute(&env.pool).await.unwrap();
        eventually_asleep(&env, &[&name]).await;
        // Ten commits, 50 ms apart: well inside one 1 s interval, well apart for a relay without one.
        for n in 1..=10 {
            credit(&env.pool, &format!("acc-{n}"), n, true).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eventually_empty_backlog(&env).await;
        let n = batches(env.pool.clone()).await;
        assert!(
            (fewest..=most).contains(&n),
            "interval {interval} ms: {n} batches, expected {fewest}..={most}"
        );
        running.stop().await;
    }
}

/// A full batch (as many heads as `batch_size`, or as many rows as `batch_rows`,
/// that) is followed by the next one at once: only a batch that was not full
/// waits `min_batch_interval_ms`. With the interval at an hour, a backlog of
/// several batches, full by heads and full by rows, still drains: a relay
/// that paced after a full batch would publish one batch and wait an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batch_is_followed_by_the_next_at_once_whatever_the_interval() {
    let env = env("relay_full").await;
    record_relayed(&env.pool).await;
    // One aggregate with 20 events first (batches full by rows: one head, 8 rows), then
    // 12 aggregates with one event each (batches full by heads: 4 heads, 4 rows).
    for n in 1..=20 {
        credit(&env.pool, "acc-long", n, true).await;
    }
    for a in 1..=12 {
        credit(&env.pool, &format!("acc-{a}"), 1, true).await;
    }
    let settings = sagaworks_outbox::RelaySettings {
        batch_size: 4,
        batch_rows: 8,
        min_batch_interval_ms: 3_600_000,
        ..no_polling()
    };
    let relay = Relay::new(env.pool.clone(), &env.kafka, settings).unwrap();
    let running = Running::spawn(|t| relay.run(t));
    eventually_empty_backlog(&env).await;
    let batches = count(&env.pool, "SELECT count(DISTINCT batch) FROM relayed").await;
    assert!(batches >= 5, "32 events in batches of at most 8 rows or 4 heads: {batches} batches");
    running.stop().await;
}

/// A batch claims up to `batch_size` aggregate heads and reads each claimed
/// aggregate's share of `batch_rows` (here twice that) rows, from its head on: two heads
/// get two rows each, a lone aggregate the whole batch. Every batch is one
/// transaction, so its rows share one `batch` in `relayed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_claimed_aggregate_gets_its_share_of_the_batch_from_its_head_on() {
    let env = env("relay_share").await;
    record_relayed(&env.pool).await;
    for n in 1..=4 {
        credit(&env.pool, "acc-a", n, true).await;
        credit(&env.pool, "acc-b", n, true).await;
    }
    for n in 1..=16 {
        credit(&env.pool, "acc-c", n, true).await;
    }
    // Pacing of an hour: only batches that may leave more waiting are followed at once.
    let settings = sagaworks_outbox::RelaySettings {
        batch_size: 2,
        batch_rows: 4,
        min_batch_interval_ms: 3_600_000,
        ..no_polling()
    };
    let relay = Relay::new(env.pool.clone(), &env.kafka, settings).unwrap();
    let running = Running::spawn(|t| relay.run(t));
    eventually_empty_backlog(&env).await;
    running.stop().await;
    // Per batch (in order), how many rows of each aggregate it published.
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT batch::text, aggregate_id, count(*) FROM relayed
         GROUP BY batch, aggregate_id ORDER BY min(min(at)) OVER (PARTITION BY batch), aggregate_id",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let mut batches: Vec<Vec<(String, i64)>> = Vec::new();
    let mut last = None;
    for (at, aggregate, n) in rows {
        if last.as_ref() != Some(&at) {
            batches.push(Vec::new());
            last = Some(at);
        }
        batches.last_mut().unwrap().push((aggregate, n));
    }
    let expected = |v: &[(&str, i64)]| v.iter().map(|(a, n)| (a.to_string(), *n)).collect::<Vec<_>>();
    assert_eq!(
        batches,
        vec![
            expected(&[("acc-a", 2), ("acc-b", 2)]),
            expected(&[("acc-a", 2), ("acc-b", 2)]),
            expected(&[("acc-c", 4)]),
            expected(&[("acc-c", 4)]),
            expected(&[("acc-c", 4)]),
            expected(&[("acc-c", 4)]),
        ],
        "batches of 2 heads x 2 rows, then the lone aggregate 4 at a time"
    );
    // From its head on: within an aggregate, no event went out in an earlier batch than one before it.
    let reordered = count(
        &env.pool,
        "SELECT count(*) FROM relayed a JOIN relayed b ON a.aggregate_id = b.aggregate_id
         WHERE a.seq < b.seq AND a.at > b.at",
    )
    .await;
    assert_eq!(reordered, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanently_failing_event_blocks_only_its_own_aggregate() {
    let _ = sagaworks_runtime::metrics::handle();
    let mut env = env("relay_stuck").await;
    // The producer refuses messages over 5000 bytes: a permanent produce failure.
    env.kafka.properties.insert("message.max.bytes".into(), "5000".into());
    let relay = Relay::new(env.pool.clone(), &env.kafka, relay_settings()).unwrap();
    let running = Running::spawn(|t| relay.run(t));

    let writer = OutboxWriter::new("test");
    let mut tx = env.pool.begin().await.unwrap();
    let big = serde_json::json!({ "account": "acc-big", "n": 1, "pad": "x".repeat(10_000) });
    writer
        .append(&mut tx, NewEvent::new("account", "acc-big", "AccountCredited", big).unwrap())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    credit(&env.pool, "acc-big", 2, true).await;
    let ok = credit(&env.pool, "acc-ok", 3, true).await;

    let topic = topic_name(&env.kafka, "account");
    let ok_s = ok.to_string();
    let msgs = read_topic(&env.kafka, &topic, WAIT, move |m| {
        m.iter().any(|m| header(m, "ce_id") == Some(ok_s.as_str()))
    })
    .await;
    assert!(msgs.iter().all(|m| m.key() == Some(b"acc-ok".as_slice())), "nothing of acc-big is published");
    // Still stuck after the relay tried again (a failure counted from now on), and in
    // order: the small event 2 waits behind 1.
    let seen = publish_errors("test");
    sagaworks_test_support::eventually("another failed attempt", WAIT, || async {
        (publish_errors("test") > seen).then_some(())
    })
    .await;
    let stuck: Vec<String> =
        sqlx::query_scalar("SELECT convert_from(payload, 'UTF8')::jsonb->>'n' FROM outbox ORDER BY seq")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    assert_eq!(stuck, vec!["1", "2"]);
    let errors = publish_errors("test");
    assert!(errors >= 2.0, "failures are counted: {errors}");
    running.stop().await;
}

/// Relays holding [`WAKE_LOCK`] exclusively: the parked ones (see `sagaworks_outbox::wake`).
async fn parked_relays(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
         WHERE d.datname = current_database() AND l.locktype = 'advisory'
           AND l.classid = ($1 >> 32)::oid AND l.objid = ($1 & 4294967295)::oid AND l.objsubid = 1
           AND l.mode = 'ExclusiveLock' AND l.granted",
    )
    .bind(WAKE_LOCK)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A pool for one relay: its connections, the LISTEN one included, show as
/// `name` in `pg_stat_activity` (see [`eventually_asleep`]).
/// Whether the relay on [`relay_pool`] `name` sleeps, so that only a NOTIFY (or
/// its polling fallback) can start its next batch: none of its connections is
/// busy, and its LISTEN connection either holds [`WAKE_LOCK`] and the batch
/// that follows parking has run since (a statement on another connection
/// started after the park), or found another relay parked (the check for one is
/// its last statement) after the relay's last batch.
async fn asleep(pool: &sqlx::PgPool, name: &str) -> bool {
    sqlx::query_scalar(
        "WITH r AS (
             SELECT a.pid, a.state, a.query, a.query_start,
                    EXISTS (SELECT 1 FROM pg_locks l
                            WHERE l.pid = a.pid AND l.locktype = 'advisory'
                              AND l.classid = ($2 >> 32)::oid AND l.objid = ($2 & 4294967295)::oid
                              AND l.objsubid = 1 AND l.mode = 'ExclusiveLock' AND l.granted) AS parked
             FROM pg_stat_activity a
             WHERE a.datname = current_database() AND a.application_name = $1
         )
         SELECT NOT EXISTS (SELECT 1 FROM r WHERE state <> 'idle')
            AND EXISTS (
                SELECT 1 FROM r l WHERE
                    (l.parked AND l.query LIKE '%pg_advisory_lock(%'
                     AND EXISTS (SELECT 1 FROM r b WHERE b.pid <> l.pid AND b.query_start > l.query_start))
                 OR (NOT l.parked AND l.query LIKE '%SELECT EXISTS%pg_locks%'
                     AND NOT EXISTS (SELECT 1 FROM r b WHERE b.pid <> l.pid AND b.query_start > l.query_start)))",
    )
    .bind(name)
    .bind(WAKE_LOCK)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Waits until every relay named in `names` sleeps (see [`asleep`]).
async fn eventually_asleep(env: &Env, names: &[&str]) {
    let pool = env.pool.clone();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    sagaworks_test_support::eventually(&format!("{names:?} asleep"), WAIT, || {
        let (pool, names) = (pool.clone(), names.clone());
        async move {
            for name in &names {
                if !asleep(&pool, name).await {
                    return None;
                }
            }
            Some(())
        }
    })
    .await;
}

/// Requests for [`WAKE_LOCK`] in exclusive mode that wait: relays trying to park.
async fn waiting_to_park(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
         WHERE d.datname = current_database() AND l.locktype = 'advisory'
           AND l.classid = ($1 >> 32)::oid AND l.objid = ($1 & 4294967295)::oid AND l.objsubid = 1
           AND l.mode = 'ExclusiveLock' AND NOT l.granted",
    )
    .bind(WAKE_LOCK)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn eventually_parked(pool: &sqlx::PgPool, n: i64) {
    let pool = pool.clone();
    sagaworks_test_support::eventually(&format!("{n} parked relay(s)"), WAIT, || {
        let pool = pool.clone();
        async move { (parked_relays(&pool).await == n).then_some(()) }
    })
    .await;
}

/// The writer's side of the wake-up protocol: a commit NOTIFYs only while
/// somebody holds [`WAKE_LOCK`] (a parked relay), so busy relays cost the
/// writers no NOTIFY (and its server-wide commit lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_notify_only_while_a_relay_is_parked() {
    use sqlx::Connection;
    let env = env("relay_wake_writer").await;
    let mut listener = sqlx::postgres::PgListener::connect(&env.db.url).await.unwrap();
    listener.listen(NOTIFY_CHANNEL).await.unwrap();
    let quiet = Duration::from_millis(500);

    credit(&env.pool, "acc-1", 1, true).await;
    assert!(
        tokio::time::timeout(quiet, listener.recv()).await.is_err(),
        "no NOTIFY while no relay is parked"
    );

    let mut parked = sqlx::PgConnection::connect(&env.db.url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)").bind(WAKE_LOCK).execute(&mut parked).await.unwrap();
    credit(&env.pool, "acc-1", 2, false).await;
    assert!(tokio::time::timeout(quiet, listener.recv()).await.is_err(), "a rollback notifies nobody");
    credit(&env.pool, "acc-1", 3, true).await;
    tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a commit NOTIFYs a parked relay")
        .unwrap();

    sqlx::query("SELECT pg_advisory_unlock($1)").bind(WAKE_LOCK).execute(&mut parked).await.unwrap();
    credit(&env.pool, "acc-1", 4, true).await;
    assert!(tokio::time::timeout(quiet, listener.recv()).await.is_err(), "no NOTIFY once the relay unparked");
}

/// An idle relay parks (holds the lock, so writers wake it), a commit wakes
/// it long before its polling fallback, and a stopped relay leaves no lock
/// behind (its LISTEN connection goes back to the pool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_relay_parks_is_woken_and_releases_the_lock_when_it_stops() {
    let env = env("relay_wake_park").await;
    let pool = relay_pool(&env, "relay").await;
    let relay = Relay::new(pool.clone(), &env.kafka, no_polling()).unwrap();
    let running = Running::spawn(|t| relay.run(t));
    eventually_parked(&env.pool, 1).await;

    for n in 1..=3 {
        // Busy for a moment after each event, then parked and asleep again.
        eventually_asleep(&env, &["relay"]).await;
        credit(&env.pool, "acc-1", n, true).await;
        // Published at all: woken by NOTIFY (the hour-long poll cannot fire).
        eventually_empty_backlog(&env).await;
    }
    eventually_parked(&env.pool, 1).await;
    running.stop().await;
    assert_eq!(parked_relays(&env.pool).await, 0, "a stopped relay holds no lock");
    // Nor did it leave its lock timeout on the connection it gave back.
    let mut conns = Vec::new();
    for _ in 0..pool.options().get_max_connections() {
        let mut c = pool.acquire().await.unwrap();
        let timeout: String = sqlx::query_scalar("SHOW lock_timeout").fetch_one(&mut *c).await.unwrap();
        assert_eq!(timeout, "0", "a pooled connection keeps no lock_timeout");
        conns.push(c);
    }
}

/// A writer that wrote its event but has not committed holds the lock in
/// shared mode and will not NOTIFY: the relay must not go to sleep on it.
/// It cannot park while the writer is open, keeps batching, and publishes
/// the event right after the commit, not at its polling fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_does_not_sleep_through_a_writer_in_flight() {
    let env = env("relay_wake_fence").await;
    let writer = OutboxWriter::new("test");
    let mut tx = env.pool.begin().await.unwrap();
    let event = NewEvent::new("account", "acc-1", "AccountCredited", serde_json::json!({ "n": 1 })).unwrap();
    writer.append(&mut tx, event).await.unwrap();

    let settings = no_polling();
    let relay = Relay::new(env.pool.clone(), &env.kafka, settings).unwrap();
    let running = Running::spawn(|t| relay.run(t));
    // The relay found nothing to publish and tries to park: its exclusive request
    // waits behind the writer's shared lock.
    let pool = env.pool.clone();
    sagaworks_test_support::eventually("the relay to try to park", WAIT, || {
        let pool = pool.clone();
        async move { (waiting_to_park(&pool).await > 0).then_some(()) }
    })
    .await;
    assert_eq!(parked_relays(&env.pool).await, 0, "no relay parks while a writer holds the lock");

    // This commit sends no NOTIFY (the writer got the shared lock, so no relay was
    // parked) and the poll cannot fire: published at all = the relay kept batching.
    tx.commit().await.unwrap();
    eventually_empty_backlog(&env).await;
    eventually_parked(&env.pool, 1).await;
    running.stop().await;
}

/// Two idle relays on one database: one parks, the other finds it parked and
/// sleeps too (no busy loop, no deadlock); a commit wakes them, and after
/// stopping neither holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_idle_relays_one_parks_and_a_commit_wakes_them() {
    let env = env("relay_wake_two").await;
    let a = Relay::new(relay_pool(&env, "relay-a").await, &env.kafka, no_polling()).unwrap();
    let b = Relay::new(relay_pool(&env, "relay-b").await, &env.kafka, no_polling()).unwrap();
    let (a, b) = (Running::spawn(|t| a.run(t)), Running::spawn(|t| b.run(t)));
    eventually_parked(&env.pool, 1).await;
    // The other relay found it parked and sleeps: its LISTEN connection's last
    // statement is that check, a second ago or more (a relay that kept trying
    // would run it again within about 100 ms, so it would never be that old).
    let pool = env.pool.clone();
    sagaworks_test_support::eventually("the relay that could not park to sleep", WAIT, || {
        let pool = pool.clone();
        async move {
            let asleep: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND state = 'idle' AND query LIKE '%SELECT EXISTS%pg_locks%'
                   AND state_change < now() - interval '1 second'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (asleep == 1).then_some(())
        }
    })
    .await;

    for n in 1..=3 {
        eventually_asleep(&env, &["relay-a", "relay-b"]).await;
        credit(&env.pool, &format!("acc-{n}"), n, true).await;
        // Published at all: woken by NOTIFY (the hour-long poll cannot fire).
        eventually_empty_backlog(&env).await;
    }
    eventually_parked(&env.pool, 1).await;
    a.stop().await;
    b.stop().await;
    assert_eq!(parked_relays(&env.pool).await, 0, "stopped relays hold no lock");
}
