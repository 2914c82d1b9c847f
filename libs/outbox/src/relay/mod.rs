//! The outbox relay: [`Relay`] (its docs say how it publishes and what it guarantees).
//!
//! * [`settings`] — the `[outbox]` section;
//! * [`claim`] — steps 1 and 2 of a batch, one statement with a fixed plan;
//! * [`send`] — step 3, the producer and its spans;
//! * here — the loop (when batches run) and step 4 (deleting the acked prefix).

mod claim;
mod send;
mod settings;

pub use settings::RelaySettings;

use crate::OutboxError;
use crate::backoff::Backoff;
use crate::crash::RelayCrashPoint;
use crate::kafka;
use crate::metrics as m;
use crate::wake::{Parking, Wake};
use claim::{BEGIN_BATCH, CLAIM, Row};
use rdkafka::producer::{FutureProducer, Producer};
use sagaworks_config::KafkaSettings;
use sagaworks_runtime::db::NO_FLUSH_WAIT;
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often the relay refreshes the backlog gauges itself (a `/metrics`
/// scrape refreshes them too); after every batch would be a query per batch.
const GAUGES_EVERY: Duration = Duration::from_secs(1);

/// What one batch did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct BatchOutcome {
    /// The batch hit a limit: there is probably more to send right away.
    full: bool,
    published: usize,
    failed: usize,
}

/// Publishes the outbox to Kafka until cancelled.
///
/// The relay: publishes committed outbox rows to Kafka, in order per aggregate.
///
/// ```ignore
/// tokio::spawn(Relay::new(pool.clone(), &settings.kafka, settings.outbox.clone())?.run(token.clone()));
/// ```
///
/// # When
///
/// While batches find events, the relay is busy: the next batch starts
/// `min_batch_interval_ms` after the previous one started (right away after a
/// full batch). Under load the events of that interval share one batch, which
/// saves the database and the broker a round of requests per commit. A batch
/// that finds nothing *parks* the relay: it sleeps until a writer's NOTIFY
/// (writers notify only while a relay is parked: see the `wake` module) or
/// every `poll_interval_ms` without one.
///
/// # One batch
///
/// In one READ COMMITTED transaction the relay
///
/// 1. claims *aggregate heads*: rows that are the oldest row of their
///    aggregate, `ORDER BY seq LIMIT batch_size FOR UPDATE SKIP LOCKED`;
/// 2. reads, per claimed aggregate, its oldest rows in `seq` order, an
///    equal share of `batch_rows` rows each (at least one: its head), in the
///    same statement as step 1, through the `(aggregate_id, seq)` index: the
///    work is one index probe per head plus the rows read, whatever the backlog (a semi-join of the whole backlog
///    against the heads, planned as a nested loop on an underestimate, grows
///    with the backlog);
/// 3. enqueues them all on an idempotent producer (`enable.idempotence`,
///    `acks=all`) in that order and awaits every ack; librdkafka keeps the
///    order within a partition, and one aggregate is one key, so one partition;
/// 4. deletes, per aggregate, exactly the prefix up to the first event that
///    was not acked, and commits.
///
/// # Published means deleted
///
/// A row in the outbox is an event not yet acked by the broker; once acked it
/// is deleted in the batch's transaction, and from then on the topic is the
/// record of it (kept for the topic's retention). A delete costs PostgreSQL
/// less than an `UPDATE` that records the row as published (not HOT, and an
/// entry in every index), and with every row unpublished the relay's indexes
/// and statements need no "published" predicate, whose statistics would
/// mislead the planner. The `check` tool (tools/src/check/events.rs)
/// therefore compares Kafka with a ledger of the committed rows that it keeps
/// itself during a run, not with the outbox.
///
/// # Why several relays cannot reorder an aggregate
///
/// The writer's business row lock serialises the transactions that write one
/// aggregate, so per aggregate `seq` order is commit order and the unpublished
/// rows of an aggregate are always a suffix of its history. A relay only ever
/// publishes an aggregate while it holds the lock on that aggregate's head row.
/// Another relay either sees that head (skips it: locked; and every later row
/// of the aggregate fails `NOT EXISTS`, because the head is older and still
/// unpublished in its snapshot), or its statement started after the first
/// relay committed, when the published prefix is gone (deleted) and the
/// new head is the first row the first relay did not send. If the second
/// relay's snapshot predates the commit but it reaches the head row after it,
/// PostgreSQL finds the locked row deleted and drops it, while the later rows
/// still fail `NOT EXISTS` against the old snapshot. So at most one relay sends a given aggregate at a
/// time, and always starting at its oldest unpublished event. Steps 1 and 2
/// share one snapshot: of each claimed aggregate they read the unpublished
/// rows it shows, from the head on; rows committed after it are later than
/// all of those (seq = commit order) and wait for the next batch, so the
/// prefix stays contiguous.
///
/// # Tracing
///
/// Each row is sent inside a `send {topic}` producer span whose parent is the
/// trace context the writer stored with the row, so the send shows up in the
/// trace of the business operation that wrote the event. The Kafka
/// `traceparent`/`tracestate` headers carry the producer span's context; a
/// consumer links its `process {topic}` span to it. The span ends with the
/// broker's ack (partition and offset recorded) or with an error status.
///
/// # Failures
///
/// Nothing is dropped: rows whose ack failed stay unpublished and are sent
/// again after an exponential backoff with full jitter (capped at
/// `backoff_max_ms`), as are rows of a batch whose delete did not commit (a
/// duplicate on the topic: delivery is at-least-once). Topics are (re)created before
/// retrying, and the producer is replaced after a batch with failed sends.
///
/// # Stopping
///
/// A relay told to stop finishes the batch in hand: it waits for the acks
/// still outstanding, `stop_ack_wait_ms` at most, deletes the acked prefix
/// and commits. With a healthy broker every ack comes within that wait, so a
/// graceful stop (a rolling restart) leaves nothing to send twice. With a
/// broker that is down or stalled the relay gives up after the wait instead of
/// `message_timeout_ms`: its commit releases the claims, and another relay
/// publishes those aggregates at once. The stopped relay's producer may still
/// deliver some of the events it was not acked for: duplicates behind the
/// other relay's copies (at-least-once; the first copy of each event is still
/// in order).
///
/// One narrow reordering remains possible: if librdkafka times out event `n`
/// of an aggregate (`message_timeout_ms`) but a later event `n+1` is still
/// acked, `n+1` is not deleted (only the acked prefix is) and the next batch
/// sends `n, n+1` again, so the topic holds `n+1, n, n+1`. A consumer with the
/// inbox then handles `n+1` before `n`. Keep `message_timeout_ms` well above
/// broker fail-over times to make this practically impossible.
pub struct Relay {
    pool: PgPool,
    kafka: KafkaSettings,
    settings: RelaySettings,
    producer: kafka::OffRuntimeDrop<FutureProducer>,
    /// Topics known to exist; cleared after a failed send.
    ensured: HashSet<String>,
}

impl Relay {
    /// Builds the producer; connects nothing yet (the relay starts, and retries,
    /// while the broker or the database is down).
    pub fn new(pool: PgPool, kafka: &KafkaSettings, settings: RelaySettings) -> Result<Self, OutboxError> {
        let producer = send::producer(kafka, &settings)?;
        // At 0 from the start: an alert's rate() sees the first error.
        metrics::counter!(m::OUTBOX_PUBLISH_ERRORS_TOTAL, "service" => settings.service.clone()).absolute(0);
        metrics::gauge!(crate::kafka::KAFKA_CLIENTS_CLOSING).increment(0.0);
        Ok(Self { pool, kafka: kafka.clone(), settings, producer, ensured: HashSet::new() })
    }

    /// Relays until `shutdown` is cancelled, then returns after finishing the
    /// batch in hand, its outstanding acks awaited for `stop_ack_wait_ms` at
    /// most (see "Stopping" above). Returns at once when `enabled` is false.
    pub async fn run(mut self, shutdown: CancellationToken) {
        if !self.settings.enabled {
            tracing::info!("outbox relay disabled");
            return;
        }
        if self.settings.crash_point != RelayCrashPoint::Off {
            tracing::warn!(crash_point = ?self.settings.crash_point, "outbox relay fault injection is on");
        }
        let poll = Duration::from_millis(self.settings.poll_interval_ms.max(1));
        let pace = Duration::from_millis(self.settings.min_batch_interval_ms);
        // When the next batch may start: set after a batch that was not full.
        let mut not_before: Option<Instant> = None;
        let mut backoff = Backoff::new(self.settings.backoff_base_ms, self.settings.backoff_max_ms);
        let mut wake = Wake::default();
        let mut last_gauges: Option<Instant> = None;
        while !shutdown.is_cancelled() {
            wake.connect(&self.pool).await;
            if let Some(at) = not_before.take() {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep_until(at.into()) => {}
                }
            }
            let started = Instant::now();
            let outcome = self.publish_batch(&shutdown).await;
            if last_gauges.is_none_or(|t| t.elapsed() >= GAUGES_EVERY) {
                if let Err(e) = m::refresh_outbox_gauges(&self.pool, &self.settings.service).await {
                    tracing::debug!(error = %e, "cannot refresh outbox gauges");
                }
                last_gauges = Some(Instant::now());
            }
            let wait = match outcome {
                Ok(o) if o.failed == 0 => {
                    backoff.reset();
                    if o.published > 0 {
                        // Busy: the next batch comes at the pace; no writer needs to wake us.
                        wake.unpark().await;
                        if !o.full {
                            not_before = Some(started + pace);
                        }
                        continue;
                    }
                    not_before = Some(started + pace);
                    match wake.park().await {
                        // Parked just now: one more batch sees what committed before.
                        Parking::Parked | Parking::Busy => continue,
                        Parking::Sleep => poll,
                    }
                }
                // Stopped, acks still outstanding after the wait: those events stay
                // unpublished, their claims released.
                Ok(o) if shutdown.is_cancelled() => {
                    tracing::info!(not_acked = o.failed, "outbox relay stopped with events in flight");
                    break;
                }
                Ok(o) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(failed = o.failed, published = o.published, retry_in = ?delay,
                        "some outbox events were not acked; they stay unpublished and are retried");
                    self.after_send_failure().await;
                    delay
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?delay, "outbox relay batch failed");
                    m_error(&self.settings.service, 1);
                    self.ensured.clear();
                    delay
                }
            };
            // While backing off, a NOTIFY must not cut the delay short.
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = wake.notified(), if backoff.is_reset() => {}
            }
        }
        wake.close().await;
        let Relay { producer, .. } = self;
        kafka::close(producer, "producer", Duration::from_secs(5)).await;
        tracing::info!("outbox relay stopped");
    }

    /// Re-checks topics and replaces the producer. Every delivery of the batch
    /// has been reported by now, so the old producer holds none of our events
    /// and cannot deliver one late, after the new producer's. A fresh producer
    /// also recovers from idempotence state the broker lost (a broker restart
    /// without persistent storage left librdkafka timing out for ever).
    ///
    /// The old producer is closed on a thread of its own ([`kafka::close`]):
    /// after a broker restart its destroy can hang.
    async fn after_send_failure(&mut self) {
        self.ensured.clear();
        if let Some((code, reason)) = self.producer.client().fatal_error() {
            tracing::error!(%code, %reason, "kafka producer failed fatally");
        }
        match send::producer(&self.kafka, &self.settings) {
            Ok(p) => {
                let old = std::mem::replace(&mut self.producer, p);
                kafka::close(old, "producer", Duration::ZERO).await;
            }
            Err(e) => tracing::error!(error = %e, "cannot create a kafka producer; keeping the old one"),
        }
    }

    async fn publish_batch(&mut self, shutdown: &CancellationToken) -> Result<BatchOutcome, OutboxError> {
        let limit = self.settings.batch_size.max(1);
        let mut tx = self.pool.begin_with(BEGIN_BATCH).await?;
        let rows_limit = self.settings.batch_rows.max(1);
        // Steps 1 and 2 in one statement (one snapshot, one round trip).
        let rows: Vec<Row> = sqlx::query_as(CLAIM).bind(limit).bind(rows_limit).fetch_all(&mut *tx).await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(BatchOutcome::default());
        }
        // Every claimed head has at least its own row here; an aggregate that
        // filled its share may have more waiting.
        let mut per_aggregate: HashMap<&str, i64> = HashMap::new();
        for row in &rows {
            *per_aggregate.entry(row.aggregate_id.as_str()).or_default() += 1;
        }
        let heads = per_aggregate.len() as i64;
        let share = (rows_limit / heads).max(1);
        let more_waiting = per_aggregate.values().any(|n| *n >= share);
        self.ensure_topics(&rows).await?;

        let stop_wait = Duration::from_millis(self.settings.stop_ack_wait_ms);
        let acked =
            send::send_all(&self.producer, &self.kafka, &self.settings.service, &rows, shutdown, stop_wait)
                .await;
        #[cfg(feature = "test-hooks")]
        if self.settings.crash_point == RelayCrashPoint::AfterProduce && acked.contains(&true) {
            let n = acked.iter().filter(|ok| **ok).count();
            crate::crash::abort(&format!(
                "outbox relay of {}: {n} events acked by the broker, not deleted from the outbox",
                self.settings.service
            ));
        }
        // Per aggregate, the prefix up to the first event that was not acked.
        let mut broken: HashSet<&str> = HashSet::new();
        let mut done = Vec::with_capacity(rows.len());
        for (row, ok) in rows.iter().zip(&acked) {
            if *ok && !broken.contains(row.aggregate_id.as_str()) {
                done.push(row.seq);
            } else {
                broken.insert(row.aggregate_id.as_str());
            }
        }
        // Acked rows are deleted: from here on the topic is their record (see the
        // type's docs, "Published means deleted"). Not waiting for the WAL
        // flush: a delete lost in a database crash only publishes its rows
        // again, which delivery allows (at least once). Planned on every run
        // (the simple protocol, the seqs written out): a prepared statement's
        // cached plan, made while the table was small, scans the whole table.
        if !done.is_empty() {
            let seqs = done.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
            let delete = format!("DELETE FROM outbox USING {NO_FLUSH_WAIT} WHERE seq IN ({seqs})");
            sqlx::raw_sql(sqlx::AssertSqlSafe(delete)).execute(&mut *tx).await?;
        }
        tx.commit().await?;

        let failed = rows.len() - done.len();
        let service = &self.settings.service;
        metrics::counter!(m::OUTBOX_PUBLISHED_TOTAL, "service" => service.clone())
            .increment(done.len() as u64);
        if !shutdown.is_cancelled() {
            m_error(service, acked.iter().filter(|ok| !**ok).count() as u64);
        }
        Ok(BatchOutcome { full: heads == limit || more_waiting, published: done.len(), failed })
    }

    async fn ensure_topics(&mut self, rows: &[Row]) -> Result<(), OutboxError> {
        let missing: Vec<String> = rows
            .iter()
            .map(|r| kafka::topic_name(&self.kafka, &r.aggregate_type))
            .filter(|t| !self.ensured.contains(t))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        kafka::ensure_topics(&self.kafka, &missing, self.settings.topics).await?;
        self.ensured.extend(missing);
        Ok(())
    }
}

fn m_error(service: &str, n: u64) {
    if n > 0 {
        metrics::counter!(m::OUTBOX_PUBLISH_ERRORS_TOTAL, "service" => service.to_string()).increment(n);
    }
}
