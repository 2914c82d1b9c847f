//! The inbox table: recording handled events, and purging expired rows.

use super::ReceivedEvent;
use sqlx::{PgConnection, PgPool};
use std::collections::HashSet;
use std::time::Duration;
use uuid::Uuid;

/// How often a consumer deletes its group's expired inbox rows.
pub(super) const INBOX_PURGE_EVERY: Duration = Duration::from_secs(3600);

/// Deletes `group`'s inbox rows older than `retention_hours`, in chunks;
/// returns how many. Other groups' rows are left alone.
pub(super) async fn purge_inbox(
    pool: &PgPool,
    group: &str,
    retention_hours: i64,
) -> Result<u64, sqlx::Error> {
    crate::delete_in_chunks(|| {
        sqlx::query(
            "DELETE FROM inbox WHERE (consumer_group, event_id) IN (
                 SELECT consumer_group, event_id FROM inbox
                 WHERE consumer_group = $1 AND processed_at < now() - make_interval(hours => $2)
                 LIMIT $3)",
        )
        // Planned on every run: a plan cached while the table was small scans it whole.
        .persistent(false)
        .bind(group)
        .bind(i32::try_from(retention_hours.max(0)).unwrap_or(i32::MAX))
        .bind(crate::PURGE_CHUNK)
        .execute(pool)
    })
    .await
}

/// Records `events` in `group`'s inbox in one statement; returns the ids that
/// were not there yet.
pub(super) async fn record(
    tx: &mut PgConnection,
    group: &str,
    events: &[&ReceivedEvent],
) -> Result<HashSet<Uuid>, sqlx::Error> {
    let new: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO inbox (consumer_group, event_id, event_type, topic, kafka_partition, kafka_offset)
             SELECT $1, * FROM UNNEST($2::uuid[], $3::text[], $4::text[], $5::int[], $6::bigint[])
             ON CONFLICT DO NOTHING
             RETURNING event_id",
    )
    .bind(group)
    .bind(events.iter().map(|e| e.id).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.event_type.as_str()).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.topic.as_str()).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.partition).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.offset).collect::<Vec<_>>())
    .fetch_all(tx)
    .await?;
    Ok(new.into_iter().collect())
}
