//! The relay on a three-broker Apache Kafka cluster (replication factor 3,
//! `min.insync.replicas` 2) while the broker leading most of its partitions is
//! cut off with SIGSTOP: alive to the operating system, silent to everyone,
//! as behind a network partition. Its sends to that broker hang until the
//! controller fences it (after its session timeout) and moves its
//! leaderships; the idempotent producer then retries them on the new leaders.

use crate::common::*;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::Message;
use sagaworks_config::KafkaSettings;
use sagaworks_outbox::kafka::{TopicSettings, client_config, topic_name};
use sagaworks_outbox::{Relay, RelaySettings};
use sagaworks_test_support::{Broker, eventually};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

const AGGREGATES: i64 = 6;
const EVENTS: i64 = 120;
/// Deadlines that only turn a hang into a failure (the fencing alone takes the
/// brokers' 9 s session timeout).
const WAIT: Duration = Duration::from_secs(90);

/// Partition -> the node id (1-based, as `scripts/kafka` numbers them) leading it,
/// asked of `brokers`.
async fn leaders(kafka: KafkaSettings, topic: String) -> BTreeMap<i32, i32> {
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = client_config(&kafka, &[("group.id", "leaders")]).create().unwrap();
        let Ok(metadata) = client.fetch_metadata(Some(&topic), Duration::from_secs(5)) else {
            return BTreeMap::new();
        };
        metadata.topics()[0].partitions().iter().map(|p| (p.id(), p.leader())).collect()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_mid_stream_loses_no_event_reorders_none_and_the_producer_writes_none_twice() {
    let _ = sagaworks_runtime::metrics::handle();
    let env = env_on("relay_cluster", Broker::cluster(3).await).await;
    let settings = RelaySettings {
        service: "relay-cluster".into(),
        topics: TopicSettings { partitions: 3, replication_factor: 3 },
        // Longer than the fencing: the producer, not the relay, retries the sends
        // that hang on the stopped broker.
        message_timeout_ms: 120_000,
        ..relay_settings()
    };
    let relay = Relay::new(env.pool.clone(), &env.kafka, settings).unwrap();
    let running = Running::spawn(|t| relay.run(t));
    let topic = topic_name(&env.kafka, "account");

    // Half the events, published while every broker runs.
    for n in 1..=EVENTS / 2 {
        credit(&env.pool, &format!("acc-{}", n % AGGREGATES), n, true).await;
    }
    read_topic(&env.kafka, &topic, WAIT, |m| m.len() as i64 >= EVENTS / 2).await;
    let before = leaders(env.kafka.clone(), topic.clone()).await;
    let mut led: HashMap<i32, usize> = HashMap::new();
    for node in before.values() {
        *led.entry(*node).or_default() += 1;
    }
    let (&victim, _) = led.iter().max_by_key(|(_, n)| **n).expect("the topic has leaders");
    let victim = u8::try_from(victim).unwrap();
    env.broker.signal(victim, "STOP");

    // The other half, written while it is cut off.
    for n in EVENTS / 2 + 1..=EVENTS {
        credit(&env.pool, &format!("acc-{}", n % AGGREGATES), n, true).await;
    }
    // The controller fences it and gives its partitions other leaders.
    let others: Vec<String> =
        (1..=env.broker.nodes()).filter(|k| *k != victim).map(|k| env.broker.node_address(k)).collect();
    let others = KafkaSettings { brokers: others.join(","), ..env.kafka.clone() };
    let (t, partitions) = (topic.clone(), before.len());
    let after = eventually("every partition led by another broker", WAIT, || {
        let (others, t) = (others.clone(), t.clone());
        async move {
            let now = leaders(others, t).await;
            (now.len() == partitions && now.values().all(|l| *l != i32::from(victim) && *l >= 1))
                .then_some(now)
        }
    })
    .await;
    // Every event is published while it is still stopped: two in-sync replicas suffice.
    let pool = env.pool.clone();
    eventually("the backlog published without the stopped broker", WAIT, || {
        let pool = pool.clone();
        async move { (count(&pool, "SELECT count(*) FROM outbox").await == 0).then_some(()) }
    })
    .await;
    env.broker.signal(victim, "CONT");

    let msgs = read_topic(&env.kafka, &topic, WAIT, |m| m.len() as i64 >= EVENTS).await;
    // Give a duplicate the chance to show: read again until the log is quiet.
    let msgs_again = read_topic(&env.kafka, &topic, Duration::from_secs(3), |_| false).await;
    assert_eq!(msgs.len(), msgs_again.len(), "the log grew after every event was read");
    let mut ids: HashMap<String, usize> = HashMap::new();
    for m in &msgs {
        *ids.entry(header(m, "ce_id").unwrap().to_string()).or_default() += 1;
    }
    let copies: Vec<_> = ids.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        copies.is_empty(),
        "the producer wrote events twice: {copies:?} (leaders {before:?} -> {after:?})"
    );
    assert_eq!(ids.len() as i64, EVENTS, "every event is on the topic once");
    let per_aggregate = assert_per_aggregate_order(&msgs);
    assert_eq!(per_aggregate.values().map(Vec::len).sum::<usize>() as i64, EVENTS);
    // Each aggregate stayed on one partition.
    let mut partition_of: HashMap<Vec<u8>, i32> = HashMap::new();
    for m in &msgs {
        let p = *partition_of.entry(m.key().unwrap().to_vec()).or_insert(m.partition());
        assert_eq!(p, m.partition(), "an aggregate on two partitions");
    }
    running.stop().await;
}
