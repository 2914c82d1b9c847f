//! The consumer's runtime: the poll loop that routes messages by partition
//! to workers, each worker's loop, offset commits and lag.

use super::inbox::{self, INBOX_PURGE_EVERY};
use super::subscription;
use super::{ConsumerSettings, Handler};
use crate::OutboxError;
use crate::backoff::Backoff;
use crate::crash::ConsumerCrashPoint;
use crate::kafka;
use crate::metrics as m;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use sagaworks_config::KafkaSettings;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Messages buffered per worker before the poll loop waits.
const WORKER_QUEUE: usize = 256;

/// The worker of a partition (a stable hash of topic and partition).
fn worker_for(topic: &str, partition: i32, workers: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (topic, partition).hash(&mut h);
    (h.finish() % workers.max(1) as u64) as usize
}

/// Shutdown arrived before the message was finished; its offset stays uncommitted.
pub(super) struct Interrupted;

/// Consumes one group's topics into a [`Handler`].
///
/// The idempotent consumer: Kafka -> inbox + handler, with retries and a DLQ.
///
/// ```ignore
/// let consumer = Consumer::new(pool.clone(), &settings.kafka, consumer_settings, MyHandler)?;
/// tokio::spawn(consumer.run(token.clone()));
/// ```
///
/// Messages are routed by partition to `concurrency` workers; a worker
/// handles its messages one after the other, so a partition is handled in
/// order. Each message:
///
/// 1. The CloudEvents headers are parsed into a [`ReceivedEvent`]. A message
///    without a valid `ce_id` (a UUID) and `ce_type` is poison: dead-lettered.
/// 2. In one database transaction: `INSERT INTO inbox ... ON CONFLICT DO
///    NOTHING`; if the event was already there this is a redelivery and
///    nothing else happens; otherwise the [`Handler`] runs on the same
///    transaction, which then commits. So the handler's database effects happen
///    exactly once per consumer group, however often Kafka delivers.
/// 3. The message's offset is marked for commit; the consumer commits the
///    marked offsets itself (`enable.auto.commit=false`) every
///    `commit_interval_ms` (one `OffsetCommit` for all of them, instead of a
///    request per message) and once more when it stops, after its workers
///    finished. A crash redelivers at most that interval's messages, which
///    the inbox makes no-ops; an offset is never committed before its
///    message was handled or dead-lettered.
///
/// With `batch_size` above 1, the messages already waiting for a worker, and
/// those arriving within `batch_wait_ms`, are handled like this in one
/// transaction (one inbox statement, then [`Handler::handle_many`] with the
/// new events, one commit), and their offsets marked after it; if anything in
/// the batch fails, the batch is rolled back and its messages go through the
/// steps above one at a time, with their own retries and dead-lettering.
///
/// A [`HandlerError::Retryable`] (or a database error) is retried with
/// exponential backoff and full jitter, up to `max_attempts` in all; then,
/// like a [`HandlerError::Permanent`] at once, the message goes to
/// `<topic>.dlq` with the `dlq_*` headers (`dlq_reason` says why:
/// `invalid_envelope`, `rejected`, `retries_exhausted`, `unsupported_schema_version`,
/// `untrusted_source` or `unexpected_type`) and the offset is marked, so the
/// partition moves on. The DLQ send is awaited and retried until it is acked:
/// an offset is never committed for a message that is neither handled nor
/// dead-lettered. Keep the total retry time (`retry_max_ms` x attempts) well
/// under `max_poll_interval_ms`, or the broker evicts the consumer from its
/// group while it waits.
///
/// Each message is handled inside a `process {topic}` consumer span (a new
/// trace with a span link to the producer span named by the message's
/// `traceparent` header), so the handler's spans and logs belong to it; a
/// dead-lettered message ends it with an error status.
///
/// After a rebalance a worker may still finish messages of a partition that
/// moved to another group member (and commit them up to `commit_interval_ms`
/// later); both may then handle (the inbox makes the second a no-op) and
/// commit it, which can only cause redelivery, never loss.
///
/// The inbox keeps a group's rows for `inbox_retention_hours` (default 7
/// days, Kafka's default log retention) and the consumer deletes older ones
/// hourly (`inbox::purge_inbox`). Keep it at least as long as the topics keep
/// their messages: a group that rewinds further (a reset to the earliest
/// offset) would handle again the events whose rows are gone.
///
/// [`ReceivedEvent`]: crate::ReceivedEvent
/// [`HandlerError::Retryable`]: crate::HandlerError::Retryable
/// [`HandlerError::Permanent`]: crate::HandlerError::Permanent
pub struct Consumer<H> {
    pub(super) pool: PgPool,
    pub(super) kafka: KafkaSettings,
    pub(super) settings: ConsumerSettings,
    pub(super) handler: H,
    consumer: subscription::Client,
    pub(super) dlq: kafka::OffRuntimeDrop<FutureProducer>,
    /// Per partition, the offset after the last handled message, not committed yet.
    marked: std::sync::Mutex<BTreeMap<(String, i32), i64>>,
}

impl<H: Handler> Consumer<H> {
    /// Builds the Kafka clients; connects nothing yet.
    pub fn new(
        pool: PgPool,
        kafka: &KafkaSettings,
        settings: ConsumerSettings,
        handler: H,
    ) -> Result<Self, OutboxError> {
        if !settings.sources.is_empty()
            && let Some(topic) = settings.topics.iter().find(|t| !settings.sources.contains_key(*t))
        {
            return Err(OutboxError::NoSource { topic: topic.clone() });
        }
        if !settings.types.is_empty()
            && let Some(topic) = settings.topics.iter().find(|t| !settings.types.contains_key(*t))
        {
            return Err(OutboxError::NoTypes { topic: topic.clone() });
        }
        let session = settings.session_timeout_ms.to_string();
        let poll = settings.max_poll_interval_ms.to_string();
        let mut config = kafka::client_config(
            kafka,
            &[
                ("auto.offset.reset", &settings.auto_offset_reset),
                ("session.timeout.ms", &session),
                // Caps the wait of an empty fetch (Kafka answers one as soon as
                // data arrives; a broker that does not then adds at most this).
                ("fetch.wait.max.ms", "100"),
            ],
        );
        // What the processing guarantees rely on: not overridable.
        config
            .set("group.id", kafka::group_name(kafka, &settings.group_id))
            .set("max.poll.interval.ms", &poll)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let consumer: StreamConsumer = config.create()?;
        let dlq: FutureProducer =
            kafka::client_config(kafka, &[("acks", "all"), ("enable.idempotence", "true")]).create()?;
        // The error and DLQ counters of every topic exist from the start (at 0):
        // an alert's rate() sees the first one.
        for topic in &settings.topics {
            let topic = kafka::topic_name(kafka, topic);
            for name in [m::CONSUMER_ERRORS_TOTAL, m::CONSUMER_DLQ_TOTAL] {
                metrics::counter!(name, "group" => settings.group_id.clone(), "topic" => topic.clone())
                    .absolute(0);
            }
        }
        Ok(Self {
            pool,
            kafka: kafka.clone(),
            settings,
            handler,
            consumer: Arc::new(kafka::OffRuntimeDrop::new(consumer, "consumer")),
            dlq: kafka::OffRuntimeDrop::new(dlq, "dlq-producer"),
            marked: std::sync::Mutex::new(BTreeMap::new()),
        })
    }

    fn topics(&self) -> Vec<String> {
        self.settings.topics.iter().map(|t| kafka::topic_name(&self.kafka, t)).collect()
    }

    /// Consumes until `shutdown` is cancelled; the message in hand is finished
    /// first unless it is waiting for a retry (then it is redelivered later).
    pub async fn run(self, shutdown: CancellationToken) {
        let topics = self.topics();
        let mut all = topics.clone();
        all.extend(topics.iter().map(|t| kafka::dlq_topic(t)));
        let mut backoff = Backoff::new(self.settings.retry_base_ms, self.settings.retry_max_ms.max(1_000));
        while let Err(e) = kafka::ensure_topics(&self.kafka, &all, self.settings.topic_settings).await {
            let delay = backoff.next_delay();
            tracing::warn!(error = %e, retry_in = ?delay, "cannot create the consumer's topics");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        if self.settings.crash_point != ConsumerCrashPoint::Off {
            tracing::warn!(crash_point = ?self.settings.crash_point, group = %self.settings.group_id,
                "consumer fault injection is on");
        }
        if !subscription::await_listed(&self.consumer, &topics, &shutdown).await {
            return;
        }
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        if let Err(e) = self.consumer.subscribe(&names) {
            tracing::error!(error = %e, "cannot subscribe; consumer not started");
            return;
        }
        let this = Arc::new(self);
        let workers: Vec<_> = (0..this.settings.concurrency.max(1))
            .map(|_| {
                let (tx, rx) = tokio::sync::mpsc::channel::<OwnedMessage>(WORKER_QUEUE);
                (tx, tokio::spawn(Arc::clone(&this).work(rx, shutdown.clone())))
            })
            .collect();
        let mut lag_tick =
            tokio::time::interval(Duration::from_millis(this.settings.lag_interval_ms.max(100)));
        let mut purge_tick = tokio::time::interval(INBOX_PURGE_EVERY);
        let mut commit_tick =
            tokio::time::interval(Duration::from_millis(this.settings.commit_interval_ms.max(1)));
        commit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = commit_tick.tick() => this.commit_marked(CommitMode::Async),
                _ = lag_tick.tick() => this.report_lag(),
                _ = purge_tick.tick() => this.purge_inbox_in_background(),
                received = this.consumer.recv() => match received {
                    Ok(msg) => {
                        let msg = msg.detach();
                        // One partition, one worker: the partition stays in order.
                        let worker = worker_for(msg.topic(), msg.partition(), workers.len());
                        if workers[worker].0.send(msg).await.is_err() {
                            break; // the worker stopped: shutting down
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, group = %this.settings.group_id, "kafka consume error");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        for (tx, handle) in workers {
            drop(tx);
            if let Err(e) = handle.await {
                tracing::error!(error = %e, "consumer worker panicked");
            }
        }
        // What the workers finished: librdkafka's close waits for this
        // commit before it leaves the group.
        this.commit_marked(CommitMode::Async);
        let group = this.settings.group_id.clone();
        // Leaves the group and destroys the clients, off the runtime (see `kafka::close`).
        kafka::close(this, "consumer", Duration::from_secs(5)).await;
        tracing::info!(%group, "consumer stopped");
    }

    /// Handles the messages of the partitions routed to this worker, in order.
    async fn work(
        self: Arc<Self>,
        mut rx: tokio::sync::mpsc::Receiver<OwnedMessage>,
        shutdown: CancellationToken,
    ) {
        loop {
            let msg = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                msg = rx.recv() => match msg {
                    Some(msg) => msg,
                    None => return,
                },
            };
            let batch = self.fill_batch(msg, &mut rx, &shutdown).await;
            let done = match batch.as_slice() {
                [msg] => self.process(msg, &shutdown).await,
                msgs => self.process_batch(msgs, &shutdown).await,
            };
            if done.is_err() {
                return;
            }
        }
    }

    /// `first` and what follows it within `batch_wait_ms`, up to `batch_size` messages.
    async fn fill_batch(
        &self,
        first: OwnedMessage,
        rx: &mut tokio::sync::mpsc::Receiver<OwnedMessage>,
        shutdown: &CancellationToken,
    ) -> Vec<OwnedMessage> {
        let size = self.settings.batch_size.max(1);
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.settings.batch_wait_ms);
        while batch.len() < size {
            match rx.try_recv() {
                Ok(msg) => batch.push(msg),
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => break,
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                    if self.settings.batch_wait_ms == 0 {
                        break;
                    }
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break,
                        next = tokio::time::timeout_at(deadline, rx.recv()) => match next {
                            Ok(Some(msg)) => batch.push(msg),
                            // The wait is over, or the consumer is stopping.
                            Ok(None) | Err(_) => break,
                        },
                    }
                }
            }
        }
        batch
    }

    /// Marks `msgs` handled: their offsets go out with the next commit (at
    /// once with `commit_interval_ms = 0`).
    pub(super) fn mark(&self, msgs: &[OwnedMessage]) {
        {
            let mut marked = self.marked.lock().unwrap_or_else(|p| p.into_inner());
            for msg in msgs {
                let next = marked.entry((msg.topic().to_owned(), msg.partition())).or_insert(0);
                *next = (*next).max(msg.offset() + 1);
            }
        }
        if self.settings.commit_interval_ms == 0 {
            self.commit_marked(CommitMode::Async);
        }
    }

    /// Commits, per partition, the offset after the last marked message.
    fn commit_marked(&self, mode: CommitMode) {
        let marked = std::mem::take(&mut *self.marked.lock().unwrap_or_else(|p| p.into_inner()));
        if marked.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        let committed = marked
            .iter()
            .try_for_each(|((topic, partition), offset)| {
                tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))
            })
            .and_then(|()| self.consumer.commit(&tpl, mode));
        if let Err(e) = committed {
            // The messages are redelivered later, which the inbox makes harmless.
            tracing::warn!(error = %e, "offset commit failed");
        }
    }

    /// Sets `consumer_lag` per assigned partition (on a blocking thread:
    /// `fetch_watermarks` waits for the broker).
    fn report_lag(&self) {
        let consumer = Arc::clone(&self.consumer);
        let group = self.settings.group_id.clone();
        tokio::task::spawn_blocking(move || {
            let Ok(positions) = consumer.position() else { return };
            for p in positions.elements() {
                let Offset::Offset(position) = p.offset() else { continue };
                match consumer.fetch_watermarks(p.topic(), p.partition(), Duration::from_secs(1)) {
                    Ok((_, high)) => {
                        metrics::gauge!(m::CONSUMER_LAG, "group" => group.clone(),
                            "topic" => p.topic().to_string(), "partition" => p.partition().to_string())
                        .set((high - position).max(0) as f64);
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot fetch watermarks"),
                }
            }
        });
    }

    /// Deletes the group's expired inbox rows on a task of its own, so a long
    /// purge never holds up consuming.
    pub(super) fn purge_inbox_in_background(&self) {
        let (pool, group, hours) =
            (self.pool.clone(), self.settings.group_id.clone(), self.settings.inbox_retention_hours);
        tokio::spawn(async move {
            match inbox::purge_inbox(&pool, &group, hours).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(rows = n, %group, "purged expired inbox rows"),
                Err(e) => tracing::warn!(error = %e, %group, "inbox purge failed"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_always_maps_to_the_same_worker() {
        for p in 0..50 {
            let w = worker_for("t.order", p, 4);
            assert!(w < 4);
            assert_eq!(w, worker_for("t.order", p, 4));
        }
        let used: std::collections::HashSet<_> = (0..50).map(|p| worker_for("t.order", p, 4)).collect();
        assert!(used.len() > 1, "partitions spread over workers");
    }
}
