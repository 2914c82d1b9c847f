//! The operators' records in the service's database: requests (with their
//! Idempotency-Key), the messages each took, and refused replays.

use super::DeadLetters;
use super::model::{Acted, ActionRecord, DeadLetterError, MessageId, Operator, Refusal, Selector, State};
use super::reader::RawMessage;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, HashSet};

impl DeadLetters {
    /// The answer of an earlier request with this key (`None`: the key is new).
    pub(super) async fn earlier(
        &self,
        dlq_topic: &str,
        action: &str,
        selector: &Selector,
        operator: &Operator,
    ) -> Result<Option<Acted>, DeadLetterError> {
        let row: Option<(String, serde_json::Value)> = sqlx::query_as(
            "SELECT action, selector FROM dead_letter_requests WHERE dlq_topic = $1 AND idempotency_key = $2",
        )
        .bind(dlq_topic)
        .bind(&operator.idempotency_key)
        .fetch_optional(&self.inner.pool)
        .await?;
        let Some((was, was_selector)) = row else { return Ok(None) };
        if was != action || was_selector != selector.to_json() {
            return Err(DeadLetterError::KeyReused);
        }
        let ids: Vec<(i32, i64)> = sqlx::query_as(
            "SELECT dlq_partition, dlq_offset FROM dead_letter_actions WHERE dlq_topic = $1 AND idempotency_key = $2",
        )
        .bind(dlq_topic)
        .bind(&operator.idempotency_key)
        .fetch_all(&self.inner.pool)
        .await?;
        let mut ids: Vec<MessageId> =
            ids.into_iter().map(|(partition, offset)| MessageId { partition, offset }).collect();
        ids.sort();
        Ok(Some(Acted { ids, replayed: true }))
    }

    /// Records the `refused` messages of a replay by `operator`.
    pub(super) async fn record_refusals(
        &self,
        dlq_topic: &str,
        operator: &Operator,
        refused: &[Refusal],
    ) -> Result<(), DeadLetterError> {
        let partitions: Vec<i32> = refused.iter().map(|r| r.id.partition).collect();
        let offsets: Vec<i64> = refused.iter().map(|r| r.id.offset).collect();
        let whys: Vec<&str> = refused.iter().map(|r| r.why.as_str()).collect();
        sqlx::query(
            "INSERT INTO dead_letter_refusals (dlq_topic, dlq_partition, dlq_offset, idempotency_key, actor, reason, why)
             SELECT $1, p, o, $2, $3, $4, w FROM unnest($5::int[], $6::bigint[], $7::text[]) AS m(p, o, w)
             ON CONFLICT DO NOTHING",
        )
        .bind(dlq_topic)
        .bind(&operator.idempotency_key)
        .bind(&operator.actor)
        .bind(&operator.reason)
        .bind(&partitions)
        .bind(&offsets)
        .bind(&whys)
        .execute(&self.inner.pool)
        .await?;
        Ok(())
    }

    /// Per message, its state and the operator's action on it.
    pub(super) async fn actions(
        &self,
        dlq_topic: &str,
        ids: impl IntoIterator<Item = MessageId>,
    ) -> Result<BTreeMap<MessageId, (State, ActionRecord)>, DeadLetterError> {
        let (partitions, offsets): (Vec<i32>, Vec<i64>) =
            ids.into_iter().map(|id| (id.partition, id.offset)).unzip();
        if partitions.is_empty() {
            return Ok(BTreeMap::new());
        }
        let rows: Vec<(i32, i64, String, String, String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT a.dlq_partition, a.dlq_offset, r.action, r.actor, r.reason, r.at
             FROM dead_letter_actions a
             JOIN dead_letter_requests r USING (dlq_topic, idempotency_key)
             JOIN unnest($2::int[], $3::bigint[]) AS m(p, o) ON a.dlq_partition = m.p AND a.dlq_offset = m.o
             WHERE a.dlq_topic = $1",
        )
        .bind(dlq_topic)
        .bind(&partitions)
        .bind(&offsets)
        .fetch_all(&self.inner.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(partition, offset, action, actor, reason, at)| {
                let state = if action == "replay" { State::Replayed } else { State::Discarded };
                (MessageId { partition, offset }, (state, ActionRecord { action, actor, reason, at }))
            })
            .collect())
    }

    /// Acted-on messages still in the topic (at or above each partition's low watermark).
    pub(super) async fn acted_count(
        &self,
        dlq_topic: &str,
        marks: &[(i32, i64, i64)],
    ) -> Result<u64, DeadLetterError> {
        let (partitions, lows): (Vec<i32>, Vec<i64>) = marks.iter().map(|(p, low, _)| (*p, *low)).unzip();
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM dead_letter_actions a
             JOIN unnest($2::int[], $3::bigint[]) AS w(p, low) ON a.dlq_partition = w.p AND a.dlq_offset >= w.low
             WHERE a.dlq_topic = $1",
        )
        .bind(dlq_topic)
        .bind(&partitions)
        .bind(&lows)
        .fetch_one(&self.inner.pool)
        .await?;
        Ok(n as u64)
    }
}

/// Inserts the request and the action rows of the `chosen` messages not
/// taken yet. `None`: the key was taken meanwhile (by a concurrent request).
pub(super) async fn record(
    tx: &mut sqlx::PgConnection,
    dlq_topic: &str,
    action: &str,
    selector: &Selector,
    operator: &Operator,
    chosen: &[RawMessage],
) -> Result<Option<HashSet<MessageId>>, DeadLetterError> {
    let inserted = sqlx::query(
        "INSERT INTO dead_letter_requests (dlq_topic, idempotency_key, action, selector, actor, reason)
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
    )
    .bind(dlq_topic)
    .bind(&operator.idempotency_key)
    .bind(action)
    .bind(selector.to_json())
    .bind(&operator.actor)
    .bind(&operator.reason)
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 0 {
        return Ok(None);
    }
    let (partitions, offsets): (Vec<i32>, Vec<i64>) =
        chosen.iter().map(|m| (m.id.partition, m.id.offset)).unzip();
    let taken: Vec<(i32, i64)> = sqlx::query_as(
        "INSERT INTO dead_letter_actions (dlq_topic, dlq_partition, dlq_offset, idempotency_key)
         SELECT $1, p, o, $2 FROM unnest($3::int[], $4::bigint[]) AS m(p, o)
         ON CONFLICT DO NOTHING RETURNING dlq_partition, dlq_offset",
    )
    .bind(dlq_topic)
    .bind(&operator.idempotency_key)
    .bind(&partitions)
    .bind(&offsets)
    .fetch_all(&mut *tx)
    .await?;
    Ok(Some(taken.into_iter().map(|(partition, offset)| MessageId { partition, offset }).collect()))
}
