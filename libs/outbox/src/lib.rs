//! Transactional outbox, relay and idempotent consumer.
//!
//! * [`writer`]: [`OutboxWriter::write`] inserts a domain event into the
//!   service's `outbox` table on the caller's transaction, so the event exists
//!   if and only if the business change committed.
//! * relay and consumer: see issue 4.
//!
//! The tables come with the crate: run [`migrator`] next to the service's own
//! migrations.

pub mod writer;

pub use writer::{NewEvent, OutboxError, OutboxWriter, MAX_PAYLOAD_BYTES};

/// Migrations for the `outbox` and `inbox` tables (share `_sqlx_migrations`
/// with the service's own; see `sagaworks_runtime::db::migrate`).
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("../../migrations/outbox")
}
