//! The idempotent consumer: Kafka -> inbox + handler, with retries and a DLQ.
//!
//! ```ignore
//! let consumer = Consumer::new(pool.clone(), &settings.kafka, consumer_settings, MyHandler)?;
//! tokio::spawn(consumer.run(token.clone()));
//! ```
//!
//! Messages are routed by partition to `concurrency` workers; a worker
//! handles its messages one after the other, so a partition is handled in
//! order. Each message:
//!
//! 1. The CloudEvents headers are parsed into a [`ReceivedEvent`]. A message
//!    without a valid `ce_id` (a UUID) and `ce_type` is poison: dead-lettered.
//! 2. In one database transaction: `INSERT INTO inbox ... ON CONFLICT DO
//!    NOTHING`; if the event was already there this is a redelivery and
//!    nothing else happens; otherwise the [`Handler`] runs on the same
//!    transaction, which then commits. So the handler's database effects happen
//!    exactly once per consumer group, however often Kafka delivers.
//! 3. The message's offset is marked for commit; the consumer commits the
//!    marked offsets itself (`enable.auto.commit=false`) every
//!    `commit_interval_ms` (one `OffsetCommit` for all of them, instead of a
//!    request per message) and once more when it stops, after its workers
//!    finished. A crash redelivers at most that interval's messages, which
//!    the inbox makes no-ops; an offset is never committed before its
//!    message was handled or dead-lettered.
//!
//! With `batch_size` above 1, the messages already waiting for a worker, and
//! those arriving within `batch_wait_ms`, are handled like this in one
//! transaction (one inbox statement, then [`Handler::handle_many`] with the
//! new events, one commit), and their offsets marked after it; if anything in
//! the batch fails, the batch is rolled back and its messages go through the
//! steps above one at a time, with their own retries and dead-lettering.
//!
//! A [`HandlerError::Retryable`] (or a database error) is retried with
//! exponential backoff and full jitter, up to `max_attempts` in all; then,
//! like a [`HandlerError::Permanent`] at once, the message goes to
//! `<topic>.dlq` with the `dlq_*` headers (`dlq_reason` says why: see
//! [`DlqReason`]) and the offset is marked, so the
//! partition moves on. The DLQ send is awaited and retried until it is acked:
//! an offset is never committed for a message that is neither handled nor
//! dead-lettered. Keep the total retry time (`retry_max_ms` x attempts) well
//! under `max_poll_interval_ms`, or the broker evicts the consumer from its
//! group while it waits.
//!
//! Each message is handled inside a `process {topic}` consumer span (a new
//! trace with a span link to the producer span named by the message's
//! `traceparent` header), so the handler's spans and logs belong to it; a
//! dead-lettered message ends it with an error status.
//!
//! After a rebalance a worker may still finish messages of a partition that
//! moved to another group member (and commit them up to `commit_interval_ms`
//! later); both may then handle (the inbox makes the second a no-op) and
//! commit it, which can only cause redelivery, never loss.
//!
//! The inbox keeps a group's rows for `inbox_retention_hours` (default 7
//! days, Kafka's default log retention) and the consumer deletes older ones
//! hourly (`inbox::purge_inbox`). Keep it at least as long as the topics keep
//! their messages: a group that rewinds further (a reset to the earliest
//! offset) would handle again the events whose rows are gone.

mod dlq;
mod envelope;
mod handler;
mod inbox;
mod process;
mod settings;
mod worker;

pub use dlq::DlqReason;
pub use envelope::{EnvelopeError, ReceivedEvent};
pub use handler::{Handler, HandlerError};
pub use settings::{ConsumerSettings, UnsupportedVersionPolicy};
pub use worker::Consumer;
