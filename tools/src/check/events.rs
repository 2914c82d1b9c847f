//! Every committed event reached Kafka, exactly once after dedup by `ce_id`.
//!
//! The outbox rows of every service database are compared with the events
//! on `<prefix>.{order,reservation,payment,product,account}`, read from the
//! start of each partition up to its high watermark by a checker consumer
//! (plain partition assignment, no group: nothing is committed).

use super::{Verdict, first};
use crate::ToolError;
use crate::pg::Databases;
use chrono::{DateTime, Utc};
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use sagaworks_config::KafkaSettings;
use sagaworks_outbox::kafka::{client_config, headers, topic_name};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The aggregate types, i.e. the topic suffixes (design.md, Events).
pub const AGGREGATES: [&str; 5] = ["order", "reservation", "payment", "product", "account"];

/// Waits up to `settle` until no outbox row is unpublished in any database.
pub async fn drained(dbs: &Databases, settle: Duration) -> Result<Verdict, ToolError> {
    let deadline = Instant::now() + settle;
    loop {
        let mut backlog = Vec::new();
        for (service, pool) in dbs.all() {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                .fetch_one(pool)
                .await?;
            if n > 0 {
                backlog.push(format!("{service}: {n} unpublished"));
            }
        }
        if backlog.is_empty() || Instant::now() >= deadline {
            let ok = backlog.is_empty();
            let detail = if ok { "every outbox row is published".to_string() } else { first(&backlog) };
            return Ok(Verdict { name: "outbox drained", ok, detail });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Event ids on the topics, with how many times each was seen.
pub fn read_topics(kafka: &KafkaSettings, timeout: Duration) -> Result<HashMap<Uuid, u32>, ToolError> {
    let group = format!("sagaworks-checker-{}", Uuid::new_v4().simple());
    let consumer: BaseConsumer =
        client_config(kafka, &[("group.id", &group), ("enable.auto.commit", "false")]).create()?;
    let deadline = Instant::now() + timeout;
    let mut assignment = TopicPartitionList::new();
    let mut ends: HashMap<(String, i32), i64> = HashMap::new();
    for aggregate in AGGREGATES {
        let topic = topic_name(kafka, aggregate);
        let metadata = consumer.fetch_metadata(Some(&topic), Duration::from_secs(5))?;
        for t in metadata.topics().iter().filter(|t| t.error().is_none()) {
            for p in t.partitions() {
                // Every partition from its start: a reported watermark can lag
                // the log (seen with Tansu for batched sends), so it is only a
                // lower bound of how far to read.
                assignment.add_partition_offset(&topic, p.id(), Offset::Beginning)?;
                let (low, high) = consumer.fetch_watermarks(&topic, p.id(), Duration::from_secs(5))?;
                if high > low {
                    ends.insert((topic.clone(), p.id()), high);
                }
            }
        }
    }
    let mut seen: HashMap<Uuid, u32> = HashMap::new();
    if assignment.count() == 0 {
        return Ok(seen);
    }
    consumer.assign(&assignment)?;
    // Read at least to every watermark, then until the log stays quiet.
    let mut last_message = Instant::now();
    while !ends.is_empty() || last_message.elapsed() < QUIET {
        if Instant::now() >= deadline {
            let left: Vec<String> = ends.keys().map(|(t, p)| format!("{t}[{p}]")).collect();
            return Err(ToolError::Timeout(format!("reading {} to their high watermarks", left.join(", "))));
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else { continue };
        let message = message?;
        last_message = Instant::now();
        let id = message
            .headers()
            .and_then(|hs| hs.iter().find(|h| h.key == headers::CE_ID).and_then(|h| h.value))
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| Uuid::parse_str(v).ok())
            // An event without a ce_id is foreign: count it under the nil id so it shows up as unknown.
            .unwrap_or(Uuid::nil());
        *seen.entry(id).or_default() += 1;
        let key = (message.topic().to_string(), message.partition());
        if ends.get(&key).is_some_and(|&high| message.offset() + 1 >= high) {
            ends.remove(&key);
        }
    }
    Ok(seen)
}

/// How long the topics must stay quiet, once every watermark is reached, for a read to end.
const QUIET: Duration = Duration::from_millis(1500);

pub async fn exactly_once(
    dbs: &Databases,
    kafka: &KafkaSettings,
    since: Option<DateTime<Utc>>,
    timeout: Duration,
) -> Result<Verdict, ToolError> {
    let mut all = HashSet::new();
    let mut expected = HashSet::new();
    for (_, pool) in dbs.all() {
        let rows: Vec<(Uuid, Option<DateTime<Utc>>)> =
            sqlx::query_as("SELECT id, published_at FROM outbox").fetch_all(pool).await?;
        for (id, published_at) in rows {
            if since.is_none_or(|s| published_at.is_some_and(|p| p >= s)) {
                expected.insert(id);
            }
            all.insert(id);
        }
    }
    let kafka = kafka.clone();
    let seen = tokio::task::spawn_blocking(move || read_topics(&kafka, timeout)).await??;
    let delivered: u64 = seen.values().map(|&n| u64::from(n)).sum();
    let mut missing: Vec<String> =
        expected.iter().filter(|id| !seen.contains_key(id)).map(|id| format!("{id} not on Kafka")).collect();
    let mut unknown: Vec<String> =
        seen.keys().filter(|id| !all.contains(id)).map(|id| format!("{id} on Kafka, in no outbox")).collect();
    missing.sort();
    unknown.sort();
    let mut detail = format!(
        "{} outbox rows ({} required on Kafka{}), {} messages, {} distinct ids ({} duplicates), {} missing, {} unknown",
        all.len(),
        expected.len(),
        since.map(|s| format!(", published since {}", s.to_rfc3339())).unwrap_or_default(),
        delivered,
        seen.len(),
        delivered - seen.len() as u64,
        missing.len(),
        unknown.len()
    );
    let offenders: Vec<String> = missing.into_iter().chain(unknown).collect();
    if !offenders.is_empty() {
        detail.push_str(&format!(": {}", first(&offenders)));
    }
    Ok(Verdict { name: "events on Kafka", ok: offenders.is_empty(), detail })
}
