//! Steps 1 and 2 of a batch: claiming aggregate heads and reading their rows,
//! in one statement whose plan does not depend on the table's statistics.

use chrono::{DateTime, Utc};

/// Steps 1 and 2 of a batch (see [`Relay`]) in one statement: one snapshot,
/// one round trip. `$1`: heads to claim; `$2`: rows to read at most. Run
/// after [`BEGIN_BATCH`]'s settings.
pub(super) const CLAIM: &str = "WITH heads AS MATERIALIZED (
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
pub(super) const BEGIN_BATCH: &str = "BEGIN; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; \
     SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_material = off";

/// One outbox row on its way to Kafka.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct Row {
    pub(super) seq: i64,
    pub(super) id: uuid::Uuid,
    pub(super) aggregate_type: String,
    pub(super) aggregate_id: String,
    pub(super) event_type: String,
    pub(super) schema_version: i32,
    pub(super) data_schema: Option<String>,
    pub(super) source: String,
    pub(super) content_type: String,
    pub(super) payload: Vec<u8>,
    pub(super) traceparent: Option<String>,
    pub(super) tracestate: Option<String>,
    pub(super) created_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

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
