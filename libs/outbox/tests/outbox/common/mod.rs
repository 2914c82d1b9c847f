//! Shared set-up of the outbox tests: a fresh database with the outbox tables
//! and a tiny business table, a Kafka broker, and helpers to write events in
//! business transactions and to read topics back.

#![allow(dead_code)] // each test binary uses a different subset

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use sagaworks_config::KafkaSettings;
use sagaworks_outbox::kafka;
use sagaworks_outbox::{
    ConsumerSettings, Handler, HandlerError, NewEvent, OutboxWriter, ReceivedEvent, RelaySettings,
};
use sagaworks_test_support::{Broker, TestDatabase};
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub struct Env {
    pub db: TestDatabase,
    pub pool: PgPool,
    pub broker: Broker,
    pub kafka: KafkaSettings,
}

pub async fn env(prefix: &str) -> Env {
    env_on(prefix, Broker::start().await).await
}

/// [`env`] on `broker` (e.g. [`Broker::private`], for a test that stops it).
pub async fn env_on(prefix: &str, broker: Broker) -> Env {
    sagaworks_test_support::init_logs();
    let db = TestDatabase::create(prefix).await;
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(10).connect(&db.url).await.unwrap();
    sagaworks_runtime::db::migrate(&pool, &mut [sagaworks_outbox::migrator()]).await.unwrap();
    sqlx::query("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    // The handlers' side effect: one row per handled event, no unique key, so a
    // second handling would show as a second row.
    sqlx::query("CREATE TABLE effects (k BIGSERIAL, event_id UUID NOT NULL, aggregate_id TEXT NOT NULL, n BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let kafka = broker.kafka_settings();
    Env { db, pool, broker, kafka }
}

/// Fast settings for tests.
pub fn relay_settings() -> RelaySettings {
    RelaySettings {
        service: "test".into(),
        poll_interval_ms: 100,
        backoff_base_ms: 50,
        backoff_max_ms: 1_000,
        message_timeout_ms: 3_000,
        ..Default::default()
    }
}

pub fn consumer_settings(group: &str, topics: &[&str]) -> ConsumerSettings {
    ConsumerSettings {
        group_id: group.into(),
        topics: topics.iter().map(|t| t.to_string()).collect(),
        retry_base_ms: 20,
        retry_max_ms: 200,
        lag_interval_ms: 500,
        ..Default::default()
    }
}

/// A business transaction: bumps the account's balance and records `n` as an
/// `AccountCredited` event of aggregate `account/<id>`; commits or rolls back.
pub async fn credit(pool: &PgPool, id: &str, n: i64, commit: bool) -> Uuid {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO accounts (id, balance) VALUES ($1, $2)
         ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + $2",
    )
    .bind(id)
    .bind(n)
    .execute(&mut *tx)
    .await
    .unwrap();
    let event = NewEvent::new("account", id, "AccountCredited", json!({ "account": id, "n": n })).unwrap();
    let event_id = OutboxWriter::new("test").append(&mut tx, event).await.unwrap();
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    event_id
}

/// Reads `topic` from the beginning (all partitions, no group) until `done`
/// says so or `timeout` passes; returns what it read.
pub async fn read_topic(
    kafka: &KafkaSettings,
    topic: &str,
    timeout: Duration,
    done: impl Fn(&[OwnedMessage]) -> bool + Send + 'static,
) -> Vec<OwnedMessage> {
    let kafka = kafka.clone();
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer = outside_client(&kafka, "test-reader");
        let start = Instant::now();
        let partitions = partition_count(&consumer, &topic, timeout);
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(&topic, p, Offset::Beginning).unwrap();
        }
        consumer.assign(&tpl).unwrap();
        let mut out = Vec::new();
        while !done(&out) && start.elapsed() < timeout {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                out.push(m.detach());
            }
        }
        out
    })
    .await
    .unwrap()
}

/// A client that never joins `group` (it neither subscribes nor commits).
fn outside_client(kafka: &KafkaSettings, group: &str) -> BaseConsumer {
    kafka::client_config(kafka, &[("group.id", group), ("enable.auto.commit", "false")]).create().unwrap()
}

/// How many partitions `topic` has, waiting up to `timeout` for it to appear.
fn partition_count(client: &BaseConsumer, topic: &str, timeout: Duration) -> i32 {
    let start = Instant::now();
    loop {
        if let Ok(meta) = client.fetch_metadata(Some(topic), Duration::from_secs(2)) {
            let n = meta.topics().first().map(|t| t.partitions().len()).unwrap_or(0);
            if n > 0 {
                return n as i32;
            }
        }
        assert!(start.elapsed() < timeout, "topic {topic} never appeared");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether a member of `group` has partitions of `topic` assigned, as the group
/// coordinator sees it (read by a client outside the group).
pub async fn assigned(kafka: &KafkaSettings, group: &str, topic: &str) -> bool {
    let (settings, group, topic) =
        (kafka.clone(), sagaworks_outbox::testing::group_name(kafka, group), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let client = outside_client(&settings, "test-group-reader");
        let groups = client.fetch_group_list(Some(&group), Duration::from_secs(5)).expect("the group list");
        // A member's assignment is Kafka's ConsumerProtocolAssignment: it names each topic
        // it holds partitions of, as a length-prefixed string.
        let mut name = (topic.len() as i16).to_be_bytes().to_vec();
        name.extend_from_slice(topic.as_bytes());
        groups
            .groups()
            .iter()
            .flat_map(|g| g.members())
            .any(|m| m.assignment().is_some_and(|a| a.windows(name.len()).any(|w| w == name.as_slice())))
    })
    .await
    .unwrap()
}

/// `group`'s committed offset per partition of `topic` (which must exist;
/// `None`: nothing committed), read from the broker by a client outside the group.
pub async fn committed(kafka: &KafkaSettings, group: &str, topic: &str) -> BTreeMap<i32, Option<i64>> {
    let (settings, group, topic) =
        (kafka.clone(), sagaworks_outbox::testing::group_name(kafka, group), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let client = outside_client(&settings, &group);
        let timeout = Duration::from_secs(5);
        let partitions = partition_count(&client, &topic, timeout);
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(&topic, p);
        }
        let committed = client.committed_offsets(tpl, timeout).unwrap();
        (0..partitions)
            .map(|p| match committed.find_partition(&topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => (p, Some(o)),
                _ => (p, None),
            })
            .collect()
    })
    .await
    .unwrap()
}

/// Per partition, the offset after the last of `messages` (what a group that
/// handled them all has committed); `None` for a partition without any.
pub fn offsets_after(
    messages: &[OwnedMessage],
    partitions: impl IntoIterator<Item = i32>,
) -> BTreeMap<i32, Option<i64>> {
    let mut after: BTreeMap<i32, Option<i64>> = partitions.into_iter().map(|p| (p, None)).collect();
    for m in messages {
        let next = after.entry(m.partition()).or_insert(None);
        *next = Some(next.unwrap_or(0).max(m.offset() + 1));
    }
    after
}

pub fn header<'a>(m: &'a OwnedMessage, name: &str) -> Option<&'a str> {
    m.headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

pub fn payload_json(m: &OwnedMessage) -> serde_json::Value {
    serde_json::from_slice(m.payload().unwrap()).unwrap()
}

/// Per aggregate, the `n`s in the order they appear; asserts each aggregate's
/// sequence is increasing once duplicates (at-least-once) are removed.
pub fn assert_per_aggregate_order(messages: &[OwnedMessage]) -> HashMap<String, Vec<i64>> {
    let mut seen: HashMap<String, Vec<i64>> = HashMap::new();
    for m in messages {
        let p = payload_json(m);
        let agg = p["account"].as_str().unwrap().to_string();
        let n = p["n"].as_i64().unwrap();
        let list = seen.entry(agg).or_default();
        if list.contains(&n) {
            continue; // a duplicate delivery
        }
        if let Some(last) = list.last() {
            assert!(n > *last, "aggregate order broken: {n} after {last} in {list:?}");
        }
        list.push(n);
    }
    seen
}

/// Runs `fut` on a task and returns a handle that cancels and joins it.
pub struct Running {
    token: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

impl Running {
    pub fn spawn<F>(make: impl FnOnce(CancellationToken) -> F) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let token = CancellationToken::new();
        let handle = tokio::spawn(make(token.clone()));
        Self { token, handle }
    }

    pub async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.handle)
            .await
            .expect("task stops when cancelled")
            .unwrap();
    }
}

/// What the test handler does for an event (from its payload's `n`).
#[derive(Clone, Default)]
pub struct Script {
    /// Events (by `n`) answered with `Permanent`.
    pub permanent: Vec<i64>,
    /// Events (by `n`) answered with `Retryable` until this many attempts were made.
    pub fail_attempts: HashMap<i64, u32>,
}

/// Records every handled event as a row in `effects` on the consumer's
/// transaction, following a [`Script`] for failures.
#[derive(Clone, Default)]
pub struct Recorder {
    pub script: Script,
    pub attempts: Arc<Mutex<HashMap<Uuid, u32>>>,
    pub traceparents: Arc<Mutex<Vec<Option<String>>>>,
}

impl Handler for Recorder {
    async fn handle(&self, tx: &mut PgConnection, event: &ReceivedEvent) -> Result<(), HandlerError> {
        let attempt = {
            let mut a = self.attempts.lock().unwrap();
            let e = a.entry(event.id).or_default();
            *e += 1;
            *e
        };
        self.traceparents.lock().unwrap().push(event.traceparent.clone());
        let p: serde_json::Value = event.json().map_err(|e| HandlerError::Permanent(e.to_string()))?;
        let n = p["n"].as_i64().ok_or_else(|| HandlerError::Permanent("no n".into()))?;
        if self.script.permanent.contains(&n) {
            return Err(HandlerError::Permanent(format!("event {n} is marked bad")));
        }
        if self.script.fail_attempts.get(&n).is_some_and(|until| attempt < *until) {
            return Err(HandlerError::Retryable(format!("attempt {attempt} of event {n}")));
        }
        sqlx::query("INSERT INTO effects (event_id, aggregate_id, n) VALUES ($1, $2, $3)")
            .bind(event.id)
            .bind(&event.aggregate_id)
            .bind(n)
            .execute(&mut *tx)
            .await
            .map_err(|e| HandlerError::Retryable(e.to_string()))?;
        Ok(())
    }
}

pub async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Per partition of `topic` (which must exist), the offset after its last message.
pub async fn high_watermarks(kafka: &KafkaSettings, topic: &str) -> BTreeMap<i32, i64> {
    let (settings, topic) = (kafka.clone(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let client = outside_client(&settings, "test-watermarks");
        let timeout = Duration::from_secs(5);
        (0..partition_count(&client, &topic, timeout))
            .map(|p| (p, client.fetch_watermarks(&topic, p, timeout).unwrap().1))
            .collect()
    })
    .await
    .unwrap()
}

/// From now on, keeps a copy of every row deleted from `pool`'s outbox in
/// the table `relayed`, with the transaction that deleted it (`batch`) and
/// the order of the deletes (`at`). The relay deletes a row once the broker
/// acked it, so this is the tests' record of what a relay published and in
/// which batch.
pub async fn record_relayed(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE relayed (LIKE outbox, batch xid8 NOT NULL, at BIGSERIAL);
         CREATE FUNCTION record_relayed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
             INSERT INTO relayed SELECT g.*, pg_current_xact_id() FROM gone g ORDER BY g.seq;
             RETURN NULL; END $$;
         CREATE TRIGGER record_relayed AFTER DELETE ON outbox REFERENCING OLD TABLE AS gone
             FOR EACH STATEMENT EXECUTE FUNCTION record_relayed();",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// A pool on `env`'s database whose connections carry `name` as their
/// `application_name` (how a test tells one relay's statements from another's).
pub async fn relay_pool(env: &Env, name: &str) -> PgPool {
    let options: sqlx::postgres::PgConnectOptions = env.db.url.parse().unwrap();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.application_name(name))
        .await
        .unwrap()
}
