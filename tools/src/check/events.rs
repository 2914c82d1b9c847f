//! Every committed event reached Kafka, in its aggregate's order, exactly
//! once after dedup by `ce_id`, and every copy has a cause.
//!
//! The relay deletes an outbox row once the broker acked it, so what was
//! written is read from each service database's outbox *ledger*
//! ([`sagaworks_outbox::ledger`]: a copy of every row, made in the writer's
//! transaction), which `sagaworks-tools ledger` installs before the run. The
//! ledger is compared with the events on
//! `<prefix>.{order,reservation,payment,product,account}`, read from the
//! start of each partition up to its high watermark by a checker consumer
//! (plain partition assignment, no group: nothing is committed). A database
//! without the ledger fails the check: it cannot say what was written.

use super::coverage::Kill;
use super::{Verdict, first, settled};
use crate::ToolError;
use crate::pg::Databases;
use chrono::{DateTime, Utc};
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use sagaworks_config::KafkaSettings;
use sagaworks_outbox::kafka::{client_config, headers, topic_name};
use sagaworks_outbox::ledger;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The aggregate types, i.e. the topic suffixes (design.md, Events).
pub const AGGREGATES: [&str; 5] = ["order", "reservation", "payment", "product", "account"];

/// Waits up to `settle` until no outbox row is left unpublished in any database.
pub async fn drained(dbs: &Databases, settle: Duration) -> Result<Verdict, ToolError> {
    settled(settle, || async {
        let mut backlog = Vec::new();
        for (service, pool) in dbs.all() {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(pool).await?;
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

/// One message read back from a topic.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    /// Its `ce_id` (the nil id when it has none: a foreign message).
    pub id: Uuid,
    pub key: Option<String>,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The producer's create time.
    pub timestamp: Option<DateTime<Utc>>,
    /// The partition leader epoch it was written in (`None` when the broker
    /// did not say): it grows with every change of the partition's leader.
    pub leader_epoch: Option<i32>,
}

/// The leader epoch of the batch `message` came in; the rdkafka crate does
/// not wrap librdkafka's accessor.
fn leader_epoch(message: &BorrowedMessage<'_>) -> Option<i32> {
    // SAFETY: `message.ptr()` points to the librdkafka message that `message`
    // borrows, alive for as long as `message` is; the call only reads it.
    let epoch = unsafe { rdkafka::bindings::rd_kafka_message_leader_epoch(message.ptr()) };
    (epoch >= 0).then_some(epoch)
}

/// Every message on the topics, in offset order per partition.
pub fn read_topics(kafka: &KafkaSettings, timeout: Duration) -> Result<Vec<Delivered>, ToolError> {
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
                // Every partition from its start: the watermark is only a lower
                // bound of how far to read (a broker may report one that lags
                // its log), and reading goes on until the log stays quiet.
                assignment.add_partition_offset(&topic, p.id(), Offset::Beginning)?;
                let (low, high) = consumer.fetch_watermarks(&topic, p.id(), Duration::from_secs(5))?;
                if high > low {
                    ends.insert((topic.clone(), p.id()), high);
                }
            }
        }
    }
    let mut seen = Vec::new();
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
        seen.push(Delivered {
            id,
            key: message.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            topic: message.topic().to_string(),
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp().to_millis().and_then(DateTime::from_timestamp_millis),
            leader_epoch: leader_epoch(&message),
        });
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

/// A row of an outbox's ledger: who wrote it, and where it stands in its aggregate's order.
struct Row {
    service: &'static str,
    seq: i64,
}

/// How early before a copy's first send a death of its publisher may be
/// recorded and still explain the copy (the death is stamped after the
/// process is gone, the send before it; this only absorbs clock rounding).
const DEATH_SLACK: chrono::TimeDelta = chrono::TimeDelta::seconds(1);

/// Every event the ledgers hold (every outbox row written) is on Kafka, and
/// no event on Kafka is unknown to them; per aggregate (Kafka key), every event is on one partition and
/// their first copies are in the outbox's order; no business fact was emitted
/// twice ([`ONCE_PER_AGGREGATE`]; an order emits OrderConfirmed or
/// OrderCancelled, not both, and a finished order the one that matches its
/// status).
///
/// A copy (the same `ce_id` again) is allowed, as consumers dedup by it, but
/// only with a cause between the send before and the copy:
///
/// * a death of the service that published it (`deaths`: the chaos run's
///   kills, crash points and crashes): such a relay had the broker's ack but
///   had not deleted the row, and its successor sent it again;
/// * a change of the partition's leader (the copy's leader epoch is higher):
///   a batch in flight to the old leader may have been written without its
///   ack reaching the producer, and librdkafka's idempotent producer retries
///   such a batch under a bumped producer epoch after another partition's
///   sequence error, which the new leader cannot dedup (librdkafka issue
///   4953); the relay also sends a batch again whose ack failed.
///
/// A copy with neither, in the same leader epoch, is a producer's retry written
/// twice by one leader, which the idempotent producer must prevent, or a relay
/// that sent a published event again.
pub async fn exactly_once(
    dbs: &Databases,
    kafka: &KafkaSettings,
    deaths: &[Kill],
    timeout: Duration,
) -> Result<Verdict, ToolError> {
    let mut without = Vec::new();
    for (service, pool) in dbs.all() {
        if !ledger::installed(pool).await? {
            without.push(service);
        }
    }
    if !without.is_empty() {
        let detail = format!(
            "no outbox ledger on {}: what was written cannot be told (the relay deletes published rows); \
             run `sagaworks-tools ledger` before the run",
            without.join(", ")
        );
        return Ok(Verdict { name: "events on Kafka", ok: false, detail });
    }
    let mut rows: HashMap<Uuid, Row> = HashMap::new();
    for (service, pool) in dbs.all() {
        let found: Vec<(Uuid, i64)> =
            sqlx::query_as("SELECT id, seq FROM outbox_ledger").fetch_all(pool).await?;
        rows.extend(found.into_iter().map(|(id, seq)| (id, Row { service, seq })));
    }
    let twice = emitted_twice(dbs).await?;
    let kafka = kafka.clone();
    let messages = tokio::task::spawn_blocking(move || read_topics(&kafka, timeout)).await??;
    let mut copies_of: HashMap<Uuid, Vec<&Delivered>> = HashMap::new();
    for m in &messages {
        copies_of.entry(m.id).or_default().push(m);
    }
    let mut missing: Vec<String> =
        rows.keys().filter(|id| !copies_of.contains_key(id)).map(|id| format!("{id} not on Kafka")).collect();
    let mut unknown: Vec<String> = copies_of
        .keys()
        .filter(|id| !rows.contains_key(id))
        .map(|id| format!("{id} on Kafka, written by no outbox"))
        .collect();
    missing.sort();
    unknown.sort();
    let disorder = out_of_order(&messages, &rows);
    let copies = copies(&copies_of, &rows, deaths);
    let copies_total: usize = copies_of.values().map(|c| c.len() - 1).sum();
    let mut detail = format!(
        "{} events written, {} messages, {} distinct ids, {} missing, {} unknown, {} out of order, \
         {} emitted twice; {copies_total} copies: {} after a death of their publisher, {} after a change \
         of their partition's leader, {} unexplained",
        rows.len(),
        messages.len(),
        copies_of.len(),
        missing.len(),
        unknown.len(),
        disorder.len(),
        twice.len(),
        copies.after_death,
        copies.after_leader_change,
        copies.unexplained.len(),
    );
    let offenders: Vec<String> =
        missing.into_iter().chain(unknown).chain(disorder).chain(twice).chain(copies.unexplained).collect();
    if !offenders.is_empty() {
        detail.push_str(&format!(": {}", first(&offenders)));
    }
    Ok(Verdict { name: "events on Kafka", ok: offenders.is_empty(), detail })
}

/// Per topic and key: the partitions it is on (one), and whether the first
/// copies of its events follow their outbox order.
fn out_of_order(messages: &[Delivered], rows: &HashMap<Uuid, Row>) -> Vec<String> {
    let mut by_key: HashMap<(&str, &str), Vec<&Delivered>> = HashMap::new();
    for m in messages {
        if let Some(key) = &m.key {
            by_key.entry((m.topic.as_str(), key.as_str())).or_default().push(m);
        }
    }
    let mut offenders = Vec::new();
    for ((topic, key), mut ms) in by_key {
        let partitions: BTreeSet<i32> = ms.iter().map(|m| m.partition).collect();
        if partitions.len() > 1 {
            offenders.push(format!("key {key} of {topic} on partitions {partitions:?}"));
            continue;
        }
        ms.sort_by_key(|m| m.offset);
        let mut seen = BTreeSet::new();
        let mut last: Option<(i64, &Delivered)> = None;
        for m in ms {
            let Some(row) = rows.get(&m.id) else { continue };
            if !seen.insert(m.id) {
                continue;
            }
            if let Some((seq, before)) = last
                && row.seq < seq
            {
                offenders.push(format!(
                    "key {key} of {topic}[{}]: {} (outbox seq {}) at offset {} after {} (seq {seq}) at {}",
                    m.partition, m.id, row.seq, m.offset, before.id, before.offset
                ));
            }
            last = Some((row.seq, m));
        }
    }
    offenders.sort();
    offenders
}

/// The copies of events, by cause (see [`exactly_once`]).
struct Copies {
    after_death: usize,
    after_leader_change: usize,
    /// One line per copy without a cause.
    unexplained: Vec<String>,
}

/// Sorts every copy by its cause, and names those without one.
fn copies(copies_of: &HashMap<Uuid, Vec<&Delivered>>, rows: &HashMap<Uuid, Row>, deaths: &[Kill]) -> Copies {
    let mut out = Copies { after_death: 0, after_leader_change: 0, unexplained: Vec::new() };
    for (id, sends) in copies_of {
        let Some(row) = rows.get(id) else { continue };
        let mut sends = sends.clone();
        sends.sort_by_key(|m| (m.timestamp, m.offset));
        for pair in sends.windows(2) {
            let (before, copy) = (pair[0], pair[1]);
            let died = match (before.timestamp, copy.timestamp) {
                (Some(sent), Some(again)) => deaths.iter().any(|d| {
                    d.target == row.service && d.killed_at >= sent - DEATH_SLACK && d.killed_at <= again
                }),
                _ => false,
            };
            let new_leader = before.partition == copy.partition
                && matches!((before.leader_epoch, copy.leader_epoch), (Some(a), Some(b)) if b > a);
            if died {
                out.after_death += 1;
            } else if new_leader {
                out.after_leader_change += 1;
            } else {
                let epoch = |m: &Delivered| m.leader_epoch.map_or("?".to_string(), |e| e.to_string());
                out.unexplained.push(format!(
                    "{id} ({} outbox) sent again at {}[{}]@{} (leader epoch {}) with no death of {} and no \
                     new leader since its send at @{} (leader epoch {})",
                    row.service,
                    copy.topic,
                    copy.partition,
                    copy.offset,
                    epoch(copy),
                    row.service,
                    before.offset,
                    epoch(before)
                ));
            }
        }
    }
    out.unexplained.sort();
    out
}

/// The business facts written to an outbox more than once (see
/// [`exactly_once`]), and finished orders whose outcome event is not the one
/// their status says.
async fn emitted_twice(dbs: &Databases) -> Result<Vec<String>, ToolError> {
    let mut offenders = Vec::new();
    for (service, pool) in dbs.all() {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT aggregate_id, event_type, count(*) FROM outbox_ledger WHERE event_type = ANY($1)
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
           JOIN outbox_ledger x ON x.aggregate_type = 'order' AND x.aggregate_id = o.id::text
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
