//! Transactional outbox, relay to Kafka and idempotent consumer.
//!
//! * [`Event`] — the contract of a typed event (type, aggregate, schema
//!   version, upcasts from older versions): producers
//!   [`append`](OutboxWriter::append) values of it, consumers
//!   [`decode`](ReceivedEvent::decode) them.
//! * [`OutboxWriter`] — two ways to write an event, both taking a typed
//!   [`Event`] or a [`NewEvent`]: [`OutboxWriter::append`] inserts it into the
//!   service's `outbox` table on the caller's transaction, so the event exists
//!   if and only if the business change committed; [`OutboxWriter::stage`]
//!   gives a [`PendingEvent`] that a business statement inserts itself, in the
//!   same round trip ([`PendingEvents`]: several events, of several
//!   aggregates, at once).
//! * [`Relay`] — publishes committed rows to `<topic_prefix>.<aggregate_type>`
//!   (key = aggregate id, CloudEvents binary-mode headers), woken by a
//!   writer's `NOTIFY` (only while it sleeps) with a polling fallback; a row
//!   the broker acked is deleted (the topic is then its record).
//! * [`Consumer`] — feeds a [`Handler`] exactly once per event and consumer
//!   group (inbox table), retries, and dead-letters to `<topic>.dlq`.
//! * [`dead_letter`] — everything about dead letters: why a consumer parks a
//!   message and the headers it adds, and listing, replaying
//!   and discarding them (the operators' API, [`DeadLetters`]).
//! * [`service`] — a service's relay and consumer tasks and readiness (the
//!   broker check and the backlog gauges), wired from its settings.
//! * [`kafka`] — topic names, header names, client config, topic creation.
//! * [`ledger`] — a copy of every event written, for verification runs and
//!   tests (the relay deletes what it published).
//! * [`ConsumerCrashPoint`], [`RelayCrashPoint`] — test-only crash points
//!   for chaos runs (off by default).
//! * `testing` (cargo feature `test-hooks`) — the wake-up protocol's channel
//!   and lock, the payload limit, and the readiness parts [`service`] wires,
//!   for the crate's own tests.
//!
//! The tables come with the crate: run [`migrator`] next to the service's own
//! migrations.
//!
//! # Wiring
//!
//! ```ignore
//! sagaworks_runtime::db::migrate(&pool, &mut [order::migrator(), sagaworks_outbox::migrator()]).await?;
//! tokio::spawn(Relay::new(pool.clone(), &settings.kafka, settings.outbox.clone())?.run(token.clone()));
//! tokio::spawn(Consumer::new(pool.clone(), &settings.kafka, consumer_settings, handler)?.run(token.clone()));
//! let ready = sagaworks_outbox::service::readiness(Readiness::new(), &pool, &settings.kafka, &settings.outbox)?;
//! ```
//!
//! # Guarantees
//!
//! * **No phantom, no lost events.** An event is in the outbox iff its
//!   business transaction committed; the relay deletes nothing unpublished.
//! * **At-least-once delivery.** A row is deleted only after the broker
//!   acked it (`acks=all`, idempotent producer). A crash or a failed commit
//!   between ack and delete publishes the row again: duplicates are
//!   possible, losses are not.
//! * **Effectively once handling.** The consumer records every event id in
//!   `inbox` in the same transaction as the handler's writes, so a redelivered
//!   event changes nothing. Effects outside that database (an HTTP call) must
//!   be idempotent themselves, keyed by the event id.
//! * **Per-aggregate order.** Events of one aggregate are published in commit
//!   order even with several relays (the relay claims aggregate heads; see
//!   [`Relay`] for the argument and its one caveat), land in one partition
//!   (key = aggregate id), and the consumer handles a partition in order. It
//!   relies on writes of one aggregate being serialised (the business row
//!   lock) and one aggregate id being written by one service. There is no
//!   order across aggregates.
//! * **Broker outage.** Rows stay in the outbox; the relay retries with
//!   exponential backoff and jitter and publishes the backlog, in order, once
//!   the broker is back.
//! * **Permanent produce failure** (e.g. the broker rejects a message as too
//!   large, or ACLs deny the topic): the row is retried forever with backoff,
//!   blocking only that aggregate's later events (other aggregates flow), and
//!   shows up in `outbox_publish_errors_total`, `outbox_backlog` and
//!   `outbox_oldest_unpublished_age_seconds`: alert on the age. The writer's
//!   payload limit ([`OutboxError::PayloadTooLarge`]) prevents the common case.
//! * **Poison messages** go to `<topic>.dlq` with the error and the original
//!   coordinates in headers; the partition keeps moving.
//!
//! # Throughput
//!
//! `cargo run --release -p sagaworks-outbox --example relay_bench -- --events 100000`
//! (see `examples/relay_bench.rs`) writes, relays and consumes 100 000 events
//! over 1 000 aggregates against Apache Kafka and local PostgreSQL, and
//! checks every event was handled once in aggregate order. Its figures are in
//! `docs/performance.md`. The consumer commits a database transaction per
//! event (or per batch, `ConsumerSettings::batch_size`): raise
//! `ConsumerSettings::concurrency` and the topic's partition count to scale it.

mod backoff;
mod error;

mod consumer;
mod crash;
pub mod dead_letter;
mod event;
mod health;
pub mod kafka;
pub mod ledger;
mod metrics;
mod relay;
pub mod service;
#[cfg(feature = "test-hooks")]
pub mod testing;
mod wake;
mod writer;

pub use consumer::{
    Consumer, ConsumerSettings, Handler, HandlerError, ReceivedEvent, UnsupportedVersionPolicy,
};
pub use crash::{ConsumerCrashPoint, RelayCrashPoint};
pub use dead_letter::{DeadLetterError, DeadLetterSettings, DeadLetters};
pub use error::OutboxError;
pub use relay::{Relay, RelaySettings};
pub use sagaworks_event::{DecodeError, Event};
pub use writer::{NewEvent, OutboxWriter, PendingEvent, PendingEvents, ToOutbox};

/// Migrations for the `outbox` and `inbox` tables (share `_sqlx_migrations`
/// with the service's own; see `sagaworks_runtime::db::migrate`).
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("../../migrations/outbox")
}

/// Rows one purge statement deletes at most (the inbox's), so a large
/// purge never holds its locks or writes its WAL in one go.
const PURGE_CHUNK: i64 = 10_000;

/// Runs `delete` (a DELETE of at most [`PURGE_CHUNK`] rows) until it deletes
/// fewer than that; returns how many rows went in all.
async fn delete_in_chunks<F, Fut>(mut delete: F) -> Result<u64, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<sqlx::postgres::PgQueryResult, sqlx::Error>>,
{
    let mut total = 0;
    loop {
        let n = delete().await?.rows_affected();
        total += n;
        if (n as i64) < PURGE_CHUNK {
            return Ok(total);
        }
    }
}
