//! Every committed event reached Kafka, exactly once after dedup by `ce_id`.
//!
//! The outbox rows of every service database are compared with the events
//! on `<prefix>.{order,reservation,payment,product,account}`, read from the
//! start of each partition up to its high watermark by a checker consumer
//! (plain partition assignment, no group: nothing is committed).

use super::{Verdict, first, settled};
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
    settled(settle, || async {
        let mut backlog = Vec::new();
        for (service, pool) in dbs.all() {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                .fetch_one(pool)
                .await?;
            if n > 0 {
                backlog.push(format!("{service}: {n} unpublished"));
            }
        }
        let ok = backlog.is_empty();
        let detail = if ok { "every outbox row is published".to_string() } else { first(&backlog) };
        Ok(Verdict { name: "outbox drained", ok, detail })
    })
    .await
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

/// Event types a business fact emits once per aggregate: a second row of
/// one of these for the same aggregate is the fact taking effect twice (a
/// step or a handler that ran again and wrote its event again), whatever
/// the ids. `StockAdded` and `AccountCredited` may repeat.
pub const ONCE_PER_AGGREGATE: [&str; 10] = [
    "OrderCreated",
    "OrderConfirmed",
    "OrderCancelled",
    "StockReserved",
    "StockReleased",
    "StockCommitted",
    "PaymentCharged",
    "PaymentRefunded",
    "ProductCreated",
    "AccountOpened",
];

/// Which events must be on Kafka: every one (a broker that keeps its log), or
/// only those published since the broker last lost its log, which must then
/// be at least `min_share` of all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Required {
    All,
    Since { since: DateTime<Utc>, min_share: f64 },
}

/// Every required outbox row is on Kafka (a redelivered copy, the same
/// `ce_id` again, is allowed: consumers dedup by it), no event on Kafka is
/// unknown to the outboxes, and no business fact was emitted twice
/// ([`ONCE_PER_AGGREGATE`]; an order emits OrderConfirmed or OrderCancelled,
/// not both, and a finished order the one that matches its status).
pub async fn exactly_once(
    dbs: &Databases,
    kafka: &KafkaSettings,
    required: Required,
    timeout: Duration,
) -> Result<Verdict, ToolError> {
    let mut all = HashSet::new();
    let mut expected = HashSet::new();
    for (_, pool) in dbs.all() {
        let rows: Vec<(Uuid, Option<DateTime<Utc>>)> =
            sqlx::query_as("SELECT id, published_at FROM outbox").fetch_all(pool).await?;
        for (id, published_at) in rows {
            let wanted = match required {
                Required::All => true,
                Required::Since { since, .. } => published_at.is_some_and(|p| p >= since),
            };
            if wanted {
                expected.insert(id);
            }
            all.insert(id);
        }
    }
    let twice = emitted_twice(dbs).await?;
    let kafka = kafka.clone();
    let seen = tokio::task::spawn_blocking(move || read_topics(&kafka, timeout)).await??;
    let delivered: u64 = seen.values().map(|&n| u64::from(n)).sum();
    let mut missing: Vec<String> =
        expected.iter().filter(|id| !seen.contains_key(id)).map(|id| format!("{id} not on Kafka")).collect();
    let mut unknown: Vec<String> =
        seen.keys().filter(|id| !all.contains(id)).map(|id| format!("{id} on Kafka, in no outbox")).collect();
    missing.sort();
    unknown.sort();
    let share = expected.len() as f64 / all.len().max(1) as f64;
    let (scope, mut offenders) = match required {
        Required::All => ("every one required on Kafka".to_string(), Vec::new()),
        Required::Since { since, min_share } => (
            format!(
                "{} required on Kafka: {:.1}% (minimum {:.0}%), those published since {}",
                expected.len(),
                100.0 * share,
                100.0 * min_share,
                since.to_rfc3339()
            ),
            if share < min_share {
                vec![format!(
                    "only {:.1}% of the events are required on Kafka, under the minimum {:.0}%",
                    100.0 * share,
                    100.0 * min_share
                )]
            } else {
                Vec::new()
            },
        ),
    };
    let mut detail = format!(
        "{} outbox rows ({scope}), {} messages, {} distinct ids ({} redelivered copies), \
         {} missing, {} unknown, {} emitted twice",
        all.len(),
        delivered,
        seen.len(),
        delivered - seen.len() as u64,
        missing.len(),
        unknown.len(),
        twice.len()
    );
    offenders.extend(missing.into_iter().chain(unknown).chain(twice));
    if !offenders.is_empty() {
        detail.push_str(&format!(": {}", first(&offenders)));
    }
    Ok(Verdict { name: "events on Kafka", ok: offenders.is_empty(), detail })
}

/// The business facts written to an outbox more than once (see
/// [`exactly_once`]), and finished orders whose outcome event is not the one
/// their status says.
async fn emitted_twice(dbs: &Databases) -> Result<Vec<String>, ToolError> {
    let mut offenders = Vec::new();
    for (service, pool) in dbs.all() {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT aggregate_id, event_type, count(*) FROM outbox WHERE event_type = ANY($1)
              GROUP BY aggregate_id, event_type HAVING count(*) > 1 ORDER BY aggregate_id, event_type",
        )
        .bind(&ONCE_PER_AGGREGATE[..])
        .fetch_all(pool)
        .await?;
        offenders.extend(
            rows.into_iter().map(|(id, ty, n)| format!("{ty} of {id} written {n} times ({service} outbox)")),
        );
    }
    let outcomes: Vec<(Uuid, String, i64, i64)> = sqlx::query_as(
        "SELECT o.id, o.status,
                count(*) FILTER (WHERE x.event_type = 'OrderConfirmed'),
                count(*) FILTER (WHERE x.event_type = 'OrderCancelled')
           FROM orders o
           JOIN outbox x ON x.aggregate_type = 'order' AND x.aggregate_id = o.id::text
          GROUP BY o.id, o.status",
    )
    .fetch_all(&dbs.order)
    .await?;
    for (id, status, confirmed, cancelled) in outcomes {
        let ok = match status.as_str() {
            "CONFIRMED" => confirmed == 1 && cancelled == 0,
            "CANCELLED" => confirmed == 0 && cancelled == 1,
            _ => confirmed == 0 && cancelled == 0,
        };
        if !ok {
            offenders.push(format!(
                "order {id} {status} with {confirmed} OrderConfirmed and {cancelled} OrderCancelled"
            ));
        }
    }
    Ok(offenders)
}
