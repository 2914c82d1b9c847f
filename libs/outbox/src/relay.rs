//! The outbox relay: [`Relay`] (its docs say how it publishes and what it guarantees).

use crate::OutboxError;
use crate::backoff::Backoff;
use crate::crash::{self, RelayCrashPoint};
use crate::kafka::{self, TopicSettings, headers};
use crate::metrics as m;
use crate::wake::{Parking, Wake};
use chrono::{DateTime, SecondsFormat, Utc};
use opentelemetry::trace::Status;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use sagaworks_config::KafkaSettings;
use sagaworks_runtime::db::NO_FLUSH_WAIT;
use sagaworks_telemetry::messaging::{KafkaMessage, producer_span};
use sagaworks_telemetry::propagation::{context_from_traceparent, headers_for};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// How often the relay refreshes the backlog gauges itself (a `/metrics`
/// scrape refreshes them too); after every batch would be a query per batch.
const GAUGES_EVERY: Duration = Duration::from_secs(1);

/// The `[outbox]` section of a service's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RelaySettings {
    /// Run the relay in this process (`APP_OUTBOX__ENABLED`).
    pub enabled: bool,
    /// The `service` label of the relay's metrics, e.g. `order`; set it when
    /// wiring (the default is `unknown`).
    pub service: String,
    /// Fallback polling of a parked relay when no NOTIFY arrives.
    pub poll_interval_ms: u64,
    /// Time from the start of one batch to the start of the next while the
    /// relay is busy (unless the first was full). Under load, the events
    /// committed in that time go out in one batch (one claim, one delete, one
    /// commit, one produce round) instead of a batch per commit; an event
    /// waits at most this long for its batch. `0`: the next batch at once.
    /// The default, 50 ms, trades that wait (for events nobody waits on
    /// synchronously: the saga's calls are gRPC) for fewer, fuller batches,
    /// which cost the broker less CPU per event.
    pub min_batch_interval_ms: u64,
    /// Aggregate heads claimed per batch.
    pub batch_size: i64,
    /// Rows sent per batch at most: each claimed aggregate gets an equal
    /// share (at least its head). The default, 4000 (8 per head of a full
    /// claim), carries a backlog of long aggregates in fewer, fuller batches.
    pub batch_rows: i64,
    /// First retry delay after a failed batch.
    pub backoff_base_ms: u64,
    /// Cap of the retry delay.
    pub backoff_max_ms: u64,
    /// librdkafka `message.timeout.ms`: how long one send may take, retries included.
    pub message_timeout_ms: u64,
    /// librdkafka `linger.ms`.
    pub linger_ms: u64,
    /// Used when the relay creates a missing topic.
    pub topics: TopicSettings,
    /// Test-only fault hook (`APP_OUTBOX__CRASH_POINT=after_produce`; see
    /// [`RelayCrashPoint`](crate::RelayCrashPoint)): abort the process after a batch was acked, before
    /// it is deleted from the outbox. `off` by default; never in production.
    pub crash_point: RelayCrashPoint,
}

impl sagaworks_runtime::host::TestHooks for RelaySettings {
    fn hooks_on(&self) -> Vec<(&'static str, &'static str)> {
        if self.crash_point == RelayCrashPoint::Off {
            vec![]
        } else {
            vec![("crash_point", crash::CRASH_POINT)]
        }
    }
}

impl Default for RelaySettings {
    fn default() -> Self {
        Self {
            enabled: true,
            service: "unknown".into(),
            poll_interval_ms: 1_000,
            min_batch_interval_ms: 50,
            batch_size: 500,
            batch_rows: 4_000,
            backoff_base_ms: 100,
            backoff_max_ms: 30_000,
            message_timeout_ms: 30_000,
            linger_ms: 5,
            topics: TopicSettings::default(),
            crash_point: RelayCrashPoint::Off,
        }
    }
}

/// Steps 1 and 2 of a batch (see [`Relay`]) in one statement: one snapshot,
/// one round trip. `$1`: heads to claim; `$2`: rows to read at most. Run
/// after [`BEGIN_BATCH`]'s settings.
const CLAIM: &str = "WITH heads AS MATERIALIZED (
         SELECT o.aggregate_id FROM outbox o
         WHERE NOT EXISTS (SELECT 1 FROM outbox p
                           WHERE p.aggregate_id = o.aggregate_id AND p.seq < o.seq)
         ORDER BY o.seq LIMIT $1
         FOR UPDATE SKIP LOCKED),
     share AS (SELECT greatest(1, $2 / greatest(count(*), 1)) AS per_aggregate FROM heads)
     SELECT r.* FROM heads h CROSS JOIN LATERAL (
         SELECT seq, id, aggregate_type, aggregate_id, event_type, schema_version, data_schema,
                source, content_type, payload, traceparent, tracestate, created_at
         FROM outbox p
         WHERE p.aggregate_id = h.aggregate_id
         ORDER BY p.seq LIMIT (SELECT per_aggregate FROM share)) r
     ORDER BY r.seq";

/// A batch's transaction. The claim's plan must not depend on the table's
/// statistics, which on a queue table are stale or absent most of the time:
/// with them the planner may choose hash joins over whole-table scans, or a
/// nested loop over a materialised scan of the backlog, which read the
/// backlog once per batch or once per head. With these
/// joins and scans off for the batch's transaction (`SET LOCAL`), the one
/// plan left is the intended one: the heads in `seq` order, each probed
/// through `(aggregate_id, seq)` (tested below). Sent with `BEGIN` in one
/// round trip.
const BEGIN_BATCH: &str = "BEGIN; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; \
     SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_material = off";

/// One outbox row on its way to Kafka.
#[derive(Debug, sqlx::FromRow)]
struct Row {
    seq: i64,
    id: uuid::Uuid,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    schema_version: i32,
    data_schema: Option<String>,
    source: String,
    content_type: String,
    payload: Vec<u8>,
    traceparent: Option<String>,
    tracestate: Option<String>,
    created_at: DateTime<Utc>,
}

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
/// (writers notify only while a relay is parked: see [`WAKE_LOCK`](crate::WAKE_LOCK)) or
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
/// A relay told to stop finishes the batch in hand but does not wait for the
/// acks still outstanding: it deletes the acked prefix and commits, which
/// releases its claims at once, so another relay publishes those aggregates
/// right away instead of after `message_timeout_ms` (a broker that is down or
/// stalled). The stopped relay's producer may still deliver some of the
/// events it was not acked for: duplicates behind the other relay's copies
/// (at-least-once; the first copy of each event is still in order).
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
        let producer = producer(kafka, &settings)?;
        // At 0 from the start: an alert's rate() sees the first error.
        metrics::counter!(m::OUTBOX_PUBLISH_ERRORS_TOTAL, "service" => settings.service.clone()).absolute(0);
        metrics::gauge!(crate::kafka::KAFKA_CLIENTS_CLOSING).increment(0.0);
        Ok(Self { pool, kafka: kafka.clone(), settings, producer, ensured: HashSet::new() })
    }

    /// Relays until `shutdown` is cancelled, then returns after finishing the
    /// batch in hand without waiting for its outstanding acks (see the module
    /// docs). Returns at once when `enabled` is false.
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
                // Stopped with acks outstanding: those events stay unpublished, their claims released.
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
        match producer(&self.kafka, &self.settings) {
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

        let acked = self.send_all(&rows, shutdown).await;
        if self.settings.crash_point == RelayCrashPoint::AfterProduce && acked.contains(&true) {
            let n = acked.iter().filter(|ok| **ok).count();
            crash::abort(&format!(
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

    /// Enqueues every row in order and awaits the acks; `true` = acked. Once
    /// one event of an aggregate cannot be enqueued, its later events are not
    /// enqueued either. Each row is sent inside its own producer span, which
    /// ends when the broker acked (or refused) it. Once `shutdown` is
    /// cancelled, acks still outstanding are not waited for (`false`).
    async fn send_all(&self, rows: &[Row], shutdown: &CancellationToken) -> Vec<bool> {
        let mut pending: Vec<Option<DeliveryFuture>> = Vec::with_capacity(rows.len());
        let mut spans: Vec<tracing::Span> = Vec::with_capacity(rows.len());
        let mut blocked: HashSet<&str> = HashSet::new();
        let mut topics: HashMap<&str, String> = HashMap::new();
        for row in rows {
            let topic = topics
                .entry(row.aggregate_type.as_str())
                .or_insert_with(|| kafka::topic_name(&self.kafka, &row.aggregate_type));
            let span = send_span(topic, row);
            if blocked.contains(row.aggregate_id.as_str()) {
                span.set_status(Status::error("not sent: an earlier event of the aggregate failed"));
                spans.push(span);
                pending.push(None);
                continue;
            }
            match self.enqueue(topic, row, &span).instrument(span.clone()).await {
                Ok(f) => pending.push(Some(f)),
                Err(e) => {
                    span.in_scope(
                        || tracing::warn!(error = %e, event_id = %row.id, "cannot enqueue outbox event"),
                    );
                    span.set_status(Status::error(e.to_string()));
                    blocked.insert(row.aggregate_id.as_str());
                    pending.push(None);
                }
            }
            spans.push(span);
        }
        let service = &self.settings.service;
        // `None`: the relay stopped before the ack came.
        let results = futures::future::join_all(pending.into_iter().map(|f| async move {
            match f {
                Some(f) => tokio::select! {
                    biased;
                    r = f => Some(r),
                    _ = shutdown.cancelled() => None,
                },
                None => Some(Err(futures::channel::oneshot::Canceled)),
            }
        }))
        .await;
        rows.iter()
            .zip(results)
            .zip(spans)
            .map(|((row, r), span)| match r {
                Some(Ok(Ok(delivery))) => {
                    span.record("messaging.destination.partition.id", delivery.partition.to_string());
                    span.record("messaging.kafka.offset", delivery.offset);
                    let age = (Utc::now() - row.created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
                    metrics::histogram!(m::OUTBOX_PUBLISH_LATENCY_SECONDS, "service" => service.clone())
                        .record(age.max(0.0));
                    true
                }
                Some(Ok(Err((e, _)))) => {
                    span.in_scope(
                        || tracing::debug!(error = %e, event_id = %row.id, "outbox event not acked"),
                    );
                    span.set_status(Status::error(e.to_string()));
                    false
                }
                Some(Err(_)) => false,
                None => {
                    span.set_status(Status::error("not acked before the relay stopped"));
                    false
                }
            })
            .collect()
    }

    /// Enqueues one row, waiting while librdkafka's queue is full. `span` is
    /// the row's producer span: its context goes into the trace headers.
    async fn enqueue(
        &self,
        topic: &str,
        row: &Row,
        span: &tracing::Span,
    ) -> Result<DeliveryFuture, KafkaError> {
        let time = row.created_at.to_rfc3339_opts(SecondsFormat::Micros, true);
        let id = row.id.to_string();
        let schema_version = row.schema_version.to_string();
        let mut h = OwnedHeaders::new_with_capacity(11)
            .insert(Header { key: headers::CE_ID, value: Some(id.as_str()) })
            .insert(Header { key: headers::CE_TYPE, value: Some(row.event_type.as_str()) })
            .insert(Header { key: headers::CE_SOURCE, value: Some(row.source.as_str()) })
            .insert(Header { key: headers::CE_SPECVERSION, value: Some(headers::SPECVERSION) })
            .insert(Header { key: headers::CE_TIME, value: Some(time.as_str()) })
            .insert(Header { key: headers::CE_SCHEMAVERSION, value: Some(schema_version.as_str()) })
            .insert(Header { key: headers::CE_AGGREGATEID, value: Some(row.aggregate_id.as_str()) })
            .insert(Header { key: headers::CONTENT_TYPE, value: Some(row.content_type.as_str()) });
        if let Some(schema) = &row.data_schema {
            h = h.insert(Header { key: headers::CE_DATASCHEMA, value: Some(schema.as_str()) });
        }
        for (key, value) in trace_headers(row, span) {
            h = h.insert(Header { key: key.as_str(), value: Some(value.as_str()) });
        }
        let mut record =
            FutureRecord::to(topic).key(row.aggregate_id.as_str()).payload(&row.payload).headers(h);
        loop {
            match self.producer.send_result(record) {
                Ok(f) => return Ok(f),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
}

/// The `send {topic}` span of one row: a child of the context the writer
/// stored with the row (a new root when it stored none).
fn send_span(topic: &str, row: &Row) -> tracing::Span {
    let parent = row
        .traceparent
        .as_deref()
        .map(|tp| context_from_traceparent(tp, row.tracestate.as_deref()))
        .unwrap_or_default();
    producer_span(&KafkaMessage::new(topic).with_key(&row.aggregate_id), parent)
}

/// The `traceparent`/`tracestate` headers of a row: the producer span's
/// context, so a consumer links to the send; without OpenTelemetry installed
/// (the span has no context) the writer's stored values, passed through.
fn trace_headers(row: &Row, span: &tracing::Span) -> Vec<(String, String)> {
    let from_span = headers_for(&span.context());
    if !from_span.is_empty() {
        return from_span;
    }
    [(headers::TRACEPARENT, &row.traceparent), (headers::TRACESTATE, &row.tracestate)]
        .into_iter()
        .filter_map(|(key, value)| Some((key.to_owned(), value.clone()?)))
        .collect()
}

fn m_error(service: &str, n: u64) {
    if n > 0 {
        metrics::counter!(m::OUTBOX_PUBLISH_ERRORS_TOTAL, "service" => service.to_string()).increment(n);
    }
}

fn producer(
    kafka: &KafkaSettings,
    settings: &RelaySettings,
) -> Result<kafka::OffRuntimeDrop<FutureProducer>, OutboxError> {
    let timeout = settings.message_timeout_ms.to_string();
    let linger = settings.linger_ms.to_string();
    let config = kafka::client_config(
        kafka,
        &[
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("linger.ms", &linger),
            ("message.timeout.ms", &timeout),
        ],
    );
    Ok(kafka::OffRuntimeDrop::new(config.create()?, "producer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_default_and_partial_sections() {
        let s: RelaySettings = serde_json::from_str(r#"{"enabled": false, "batch_size": 50}"#).unwrap();
        assert!(!s.enabled);
        assert_eq!(s.batch_size, 50);
        assert_eq!(s.poll_interval_ms, 1_000, "missing keys keep their defaults");
        assert_eq!(s.min_batch_interval_ms, 50);
        assert!(RelaySettings::default().enabled);
    }

    /// Rows of `outbox` the plan of `EXPLAIN (ANALYZE, FORMAT JSON)` read:
    /// per scan node of the table, its rows times its loops.
    fn outbox_rows_read(plan: &serde_json::Value) -> f64 {
        let own = if plan["Relation Name"] == "outbox" {
            plan["Actual Rows"].as_f64().unwrap_or(0.0) * plan["Actual Loops"].as_f64().unwrap_or(1.0)
        } else {
            0.0
        };
        own + plan["Plans"].as_array().map_or(0.0, |ps| ps.iter().map(outbox_rows_read).sum())
    }

    /// The claim reads about a batch, not the backlog, whatever the table's
    /// statistics say and whatever size the table had when a connection
    /// first ran it: never analyzed, analyzed when the table held one
    /// aggregate (every row "matches" an aggregate), and current; each both
    /// planned afresh and as the prepared statement a connection cached while
    /// the table was nearly empty (a generic plan is cached after five runs,
    /// and made again only after an `ANALYZE`). Without [`BEGIN_BATCH`]'s
    /// settings the second state is planned as a hash join of two whole-table
    /// scans.
    #[tokio::test]
    async fn the_claim_reads_a_batch_not_the_backlog_whatever_the_statistics() {
        use sqlx::{Connection, Executor};
        let db = sagaworks_test_support::TestDatabase::create("relay_claim_plan").await;
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sagaworks_runtime::db::migrate(&db.pool().await, &mut [crate::migrator()]).await.unwrap();
        conn.execute("ALTER TABLE outbox SET (autovacuum_enabled = false)").await.unwrap();
        conn.execute(sqlx::AssertSqlSafe(format!("PREPARE claim(bigint, bigint) AS {CLAIM}"))).await.unwrap();
        async fn write(conn: &mut sqlx::PgConnection, aggregates: i64, rows: i64) {
            sqlx::query(
                "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, schema_version, source,
                                     content_type, payload)
                 SELECT gen_random_uuid(), 'account', 'agg-' || (i % $1), 'E', 1, '/test',
                        'application/json', '\\x7b7d'
                 FROM generate_series(1, $2) AS i",
            )
            .bind(aggregates)
            .bind(rows)
            .execute(conn)
            .await
            .unwrap();
        }
        const BACKLOG: i64 = 20_000;
        // `statement` in a batch's transaction, rolled back; the rows of `outbox` it read.
        async fn read(conn: &mut sqlx::PgConnection, statement: &str, state: &str) {
            let mut tx = conn.begin_with(BEGIN_BATCH).await.unwrap();
            let sql = format!("EXPLAIN (ANALYZE, FORMAT JSON) {statement}");
            let (plan,): (serde_json::Value,) =
                sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_one(&mut *tx).await.unwrap();
            tx.rollback().await.unwrap();
            let n = outbox_rows_read(&plan[0]["Plan"]);
            assert!(n > 0.0 && n < BACKLOG as f64 / 2.0, "{state}, {statement:.40}: read {n} rows: {plan:#}");
        }
        let fresh = CLAIM.replace("$1", "500").replace("$2", "4000");
        // A connection that claimed on a nearly empty table, often enough to cache a generic plan.
        write(&mut conn, 5, 10).await;
        for _ in 0..8 {
            let mut tx = conn.begin_with(BEGIN_BATCH).await.unwrap();
            tx.execute("EXECUTE claim(500, 4000)").await.unwrap();
            tx.rollback().await.unwrap();
        }
        conn.execute("TRUNCATE outbox").await.unwrap();
        write(&mut conn, 2_000, BACKLOG).await;
        for state in ["never analyzed", "analyzed on one aggregate", "analyzed"] {
            match state {
                "analyzed on one aggregate" => {
                    conn.execute("TRUNCATE outbox").await.unwrap();
                    write(&mut conn, 1, 200).await;
                    conn.execute("ANALYZE outbox").await.unwrap();
                    conn.execute("DELETE FROM outbox").await.unwrap();
                    write(&mut conn, 2_000, BACKLOG).await;
                }
                "analyzed" => {
                    conn.execute("ANALYZE outbox").await.unwrap();
                }
                _ => {}
            }
            read(&mut conn, "EXECUTE claim(500, 4000)", state).await;
            read(&mut conn, &fresh, state).await;
        }
    }
}
