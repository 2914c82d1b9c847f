//! The two crashes that at-least-once delivery exists for, each a real
//! process aborted at its crash point (`crash.rs`: `std::process::abort`, as
//! `kill -9` there), then a fresh relay or consumer on the same database,
//! broker and group:
//!
//! - a relay killed after the broker acked a batch, before deleting its
//!   rows: the next relay publishes the batch again (copies with the
//!   same `ce_id` on the topic, per-aggregate order kept), and a consumer
//!   handles each event once;
//! - a consumer killed after its transaction (inbox rows and the handler's
//!   effects) committed, before the offsets were: the group gets the events
//!   again and the inbox makes them no-ops.
//!
//! The aborting side runs in a child process: this test binary again, with
//! `crash_child` (ignored in normal runs) as the only test, told what to run
//! by `SW_CRASH_*` variables.

use crate::common::*;
use sagaworks_config::KafkaSettings;
use sagaworks_outbox::kafka::topic_name;
use sagaworks_outbox::{
    Consumer, ConsumerCrashPoint, ConsumerSettings, Relay, RelayCrashPoint, RelaySettings,
};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);
const EVENTS: i64 = 6;
/// What `std::process::abort` ends a process with.
const SIGABRT: i32 = 6;

/// The child side: runs the relay or consumer named by `SW_CRASH_CHILD` with
/// its crash point on, until it aborts the process. Exits 3 if it never got
/// there, so the parent fails instead of passing.
#[test]
#[ignore = "run by the crash tests in a process of its own"]
fn crash_child() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set by the parent test"));
    let role = var("SW_CRASH_CHILD");
    // The parent's settings, login included.
    let kafka: KafkaSettings = serde_json::from_str(&var("SW_CRASH_KAFKA")).expect("SW_CRASH_KAFKA is JSON");
    let url = var("SW_CRASH_DB_URL");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let run = match role.as_str() {
            "relay" => {
                let settings =
                    RelaySettings { crash_point: RelayCrashPoint::AfterProduce, ..relay_settings() };
                let relay = Relay::new(pool, &kafka, settings).unwrap();
                tokio::spawn(relay.run(stop.clone()))
            }
            "consumer" => {
                let settings = ConsumerSettings {
                    crash_point: ConsumerCrashPoint::BeforeOffsetCommit,
                    ..consumer_settings(&var("SW_CRASH_GROUP"), &["account"])
                };
                let consumer = Consumer::new(pool, &kafka, settings, Recorder::default()).unwrap();
                tokio::spawn(consumer.run(stop.clone()))
            }
            other => panic!("unknown SW_CRASH_CHILD {other}"),
        };
        // Only there to turn a crash point that never fires into a failure.
        let _ = tokio::time::timeout(WAIT, run).await;
    });
    std::process::exit(3);
}

/// Runs `crash_child` as `role` against `env` and returns once it has exited;
/// asserts it aborted (SIGABRT), not exited.
async fn run_child_until_it_aborts(env: &Env, role: &str, group: &str) {
    let status = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["crash::crash_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("SW_CRASH_CHILD", role)
        .env("SW_CRASH_DB_URL", &env.db.url)
        .env("SW_CRASH_KAFKA", serde_json::to_string(&env.kafka).unwrap())
        .env("SW_CRASH_GROUP", group)
        .kill_on_drop(true)
        .status()
        .await
        .unwrap();
    assert_eq!(status.signal(), Some(SIGABRT), "the {role} aborted at its crash point: {status}");
}

async fn unpublished(env: &Env) -> i64 {
    count(&env.pool, "SELECT count(*) FROM outbox").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_after_the_broker_acked_publishes_again_and_each_event_is_handled_once() {
    let env = env("crash_relay").await;
    for n in 1..=EVENTS {
        credit(&env.pool, &format!("acc-{}", n % 2), n, true).await;
    }

    run_child_until_it_aborts(&env, "relay", "-").await;
    // The broker has (some of) the batch, the outbox does not know it.
    let topic = topic_name(&env.kafka, "account");
    let acked = read_topic(&env.kafka, &topic, WAIT, |m| !m.is_empty()).await;
    assert!(!acked.is_empty(), "the aborted relay's batch reached the broker");
    assert_eq!(unpublished(&env).await, EVENTS, "no row deleted before the crash");

    // The next relay publishes everything, the acked batch a second time.
    let relay = Relay::new(env.pool.clone(), &env.kafka, relay_settings()).unwrap();
    let relay = Running::spawn(|t| relay.run(t));
    sagaworks_test_support::eventually("every row published and deleted", WAIT, || async {
        (unpublished(&env).await == 0).then_some(())
    })
    .await;
    relay.stop().await;
    let distinct = |m: &[rdkafka::message::OwnedMessage]| {
        m.iter().filter_map(|m| header(m, "ce_id")).collect::<std::collections::BTreeSet<_>>().len()
    };
    // Every event, and at least one copy (the acked batch, published twice).
    let seen_all = move |m: &[rdkafka::message::OwnedMessage]| {
        distinct(m) == EVENTS as usize && m.len() > EVENTS as usize
    };
    let messages = read_topic(&env.kafka, &topic, WAIT, seen_all).await;
    assert_eq!(distinct(&messages), EVENTS as usize, "every event on the topic");
    assert!(messages.len() > EVENTS as usize, "and copies of the acked batch: {} messages", messages.len());
    let per = assert_per_aggregate_order(&messages);
    assert_eq!(per.values().map(Vec::len).sum::<usize>(), EVENTS as usize);

    // A consumer handles each event once.
    let consumer = Consumer::new(
        env.pool.clone(),
        &env.kafka,
        consumer_settings("g-after-relay-crash", &["account"]),
        Recorder::default(),
    )
    .unwrap();
    let consumer = Running::spawn(|t| consumer.run(t));
    wait_for_offsets(&env, "g-after-relay-crash", &messages).await;
    consumer.stop().await;
    assert_eq!(count(&env.pool, "SELECT count(*) FROM effects").await, EVENTS);
    assert_eq!(count(&env.pool, "SELECT count(DISTINCT event_id) FROM effects").await, EVENTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_between_its_commit_and_its_offset_commit_gets_the_events_again_as_no_ops() {
    let env = env("crash_consumer").await;
    let group = "g-crash";
    for n in 1..=EVENTS {
        credit(&env.pool, &format!("acc-{}", n % 2), n, true).await;
    }
    let relay = Relay::new(env.pool.clone(), &env.kafka, relay_settings()).unwrap();
    let relay = Running::spawn(|t| relay.run(t));
    let topic = topic_name(&env.kafka, "account");
    let messages = read_topic(&env.kafka, &topic, WAIT, |m| m.len() >= EVENTS as usize).await;
    assert_eq!(messages.len(), EVENTS as usize);

    run_child_until_it_aborts(&env, "consumer", group).await;
    // Its transaction committed (effects and inbox rows), its offsets did not.
    let handled = count(&env.pool, "SELECT count(*) FROM effects").await;
    assert!(handled > 0, "the aborted consumer handled and committed a batch");
    assert_eq!(count(&env.pool, "SELECT count(*) FROM inbox").await, handled);
    let committed = committed(&env.kafka, group, &topic).await;
    assert!(committed.values().all(Option::is_none), "no offset committed: {committed:?}");

    // The group gets every event again: the handled ones are no-ops, the rest handled once.
    let recorder = Recorder::default();
    let consumer =
        Consumer::new(env.pool.clone(), &env.kafka, consumer_settings(group, &["account"]), recorder.clone())
            .unwrap();
    let consumer = Running::spawn(|t| consumer.run(t));
    wait_for_offsets(&env, group, &messages).await;
    consumer.stop().await;
    relay.stop().await;
    assert_eq!(count(&env.pool, "SELECT count(*) FROM effects").await, EVENTS, "one effect per event");
    assert_eq!(count(&env.pool, "SELECT count(DISTINCT event_id) FROM effects").await, EVENTS);
    // The handler saw only the events the aborted consumer had not handled:
    // the redelivered ones stopped at the inbox.
    let called = recorder.attempts.lock().unwrap().len() as i64;
    assert_eq!(called, EVENTS - handled, "redelivered, already handled events never reach the handler");
}

/// Waits until `group` has committed offsets past every one of `messages`
/// (`None < Some(_)`: a partition without any of them needs nothing).
async fn wait_for_offsets(env: &Env, group: &str, messages: &[rdkafka::message::OwnedMessage]) {
    let topic = topic_name(&env.kafka, "account");
    let partitions = committed(&env.kafka, group, &topic).await.into_keys();
    let expected = offsets_after(messages, partitions);
    sagaworks_test_support::eventually("offsets committed past every message", WAIT, || async {
        let now = committed(&env.kafka, group, &topic).await;
        let caught_up = expected.iter().all(|(p, after)| *after <= now.get(p).copied().flatten());
        caught_up.then_some(())
    })
    .await;
}
