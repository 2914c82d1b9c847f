//! The worker: leases the instances nobody drives (new ones handed to it, a
//! retry's backoff run out, a crashed driver's lease expired) and drives
//! each on a task of its own; and the lease's hand-back.

use super::{DriveError, Engine, telemetry};
use crate::step::Saga;
use sagaworks_runtime::Task;
use sagaworks_telemetry::propagation;
use sqlx::PgPool;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

/// How often a worker counts stuck instances (the `saga_stuck` gauge).
const STUCK_COUNT_INTERVAL: Duration = Duration::from_secs(5);

/// The worker's poll: leases up to `$3` runnable instances of type `$4` to
/// owner `$1` for `$2` seconds. It must read only unfinished instances
/// (`saga_instances_runnable`), however many finished ones the table holds:
/// the `testing` feature exposes it for plan tests.
pub const LEASE_SQL: &str =
    "UPDATE saga_instances SET lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2),
        updated_at = now()
 WHERE id IN (
     SELECT id FROM saga_instances
     WHERE status IN ('RUNNING', 'COMPENSATING') AND next_attempt_at <= now() AND saga_type = $4
       AND (lease_expires_at IS NULL OR lease_expires_at < now())
     ORDER BY next_attempt_at
     LIMIT $3
     FOR UPDATE SKIP LOCKED)
 RETURNING id, traceparent";

impl<S: Saga> Engine<S> {
    /// The worker ([`Engine::run_worker`]) as a host's task, named for its logs.
    pub fn worker_task(&self, shutdown: &CancellationToken) -> (&'static str, Task) {
        let worker = self.clone().run_worker(shutdown.clone());
        (
            "saga worker",
            Box::pin(async move {
                worker.await;
                Ok(())
            }),
        )
    }

    /// Resumes instances nobody drives until `shutdown`: every
    /// `poll_interval_ms` it leases due instances of this saga that are
    /// unleased or whose lease expired (their driver crashed), with
    /// `FOR UPDATE SKIP LOCKED` so replicas never take the same one, and
    /// drives each on a task of its own. On shutdown it stops leasing and
    /// waits for the instances in hand, which hand their leases back at the
    /// next step boundary. A resumed instance continues the trace of the
    /// call that started it.
    pub async fn run_worker(self, shutdown: CancellationToken) {
        let poll = Duration::from_millis(self.settings().poll_interval_ms.max(10));
        let stuck_after = Duration::from_millis(self.settings().stuck_after_ms);
        let mut stuck_counted: Option<Instant> = None;
        let mut running = JoinSet::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(poll) => {}
            }
            while running.try_join_next().is_some() {}
            if stuck_counted.is_none_or(|at| at.elapsed() >= STUCK_COUNT_INTERVAL) {
                stuck_counted = Some(Instant::now());
                match count_stuck(self.pool(), S::NAME, stuck_after).await {
                    Ok(n) => telemetry::stuck(S::NAME, n),
                    Err(e) => tracing::warn!(saga = S::NAME, error = %e, "cannot count stuck saga instances"),
                }
                match self.versions().await {
                    Ok(versions) => {
                        for v in versions {
                            telemetry::unfinished(S::NAME, v.version, v.unfinished);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(saga = S::NAME, error = %e, "cannot count saga instances by version")
                    }
                }
            }
            if self.has_crashed() {
                continue;
            }
            let free = self.permits().available_permits() as i64;
            if free == 0 {
                continue;
            }
            let leased = match self.lease(free).await {
                Ok(leased) => leased,
                Err(e) => {
                    tracing::warn!(saga = S::NAME, error = %e, "cannot lease saga instances");
                    continue;
                }
            };
            for (id, traceparent) in leased {
                let Ok(permit) = self.permits().clone().acquire_owned().await else { break };
                telemetry::resumed(S::NAME);
                let (engine, stop) = (self.clone(), shutdown.clone());
                let span = telemetry::saga_span(S::NAME, id);
                if let Some(traceparent) = traceparent {
                    propagation::continue_trace(&span, &traceparent);
                }
                running.spawn(
                    async move {
                        let _permit = permit;
                        telemetry::log_outcome(id, engine.drive(id, &stop).await);
                    }
                    .instrument(span),
                );
            }
        }
        while running.join_next().await.is_some() {}
    }

    /// Leases up to `limit` runnable instances to this replica; returns
    /// their ids and `traceparent`s.
    async fn lease(&self, limit: i64) -> Result<Vec<(Uuid, Option<String>)>, sqlx::Error> {
        sqlx::query_as(LEASE_SQL)
            .bind(self.owner())
            .bind(self.lease_secs())
            .bind(limit)
            .bind(S::NAME)
            .fetch_all(self.pool())
            .await
    }

    /// Gives instance `id` back to the worker pool, runnable after `delay`.
    pub async fn release_lease(&self, id: Uuid, delay: Duration) -> Result<(), DriveError> {
        sqlx::query(
            "UPDATE saga_instances SET lease_owner = NULL, lease_expires_at = NULL,
                    next_attempt_at = now() + make_interval(secs => $3)
             WHERE id = $1 AND lease_owner = $2",
        )
        .bind(id)
        .bind(self.owner())
        .bind(delay.as_secs_f64())
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

/// Unfinished instances of `saga_type` with no progress for longer than `stuck_after`.
pub(crate) async fn count_stuck(
    pool: &PgPool,
    saga_type: &str,
    stuck_after: Duration,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM saga_instances
         WHERE saga_type = $1 AND status IN ('RUNNING', 'COMPENSATING')
           AND progressed_at < now() - make_interval(secs => $2)",
    )
    .bind(saga_type)
    .bind(stuck_after.as_secs_f64())
    .fetch_one(pool)
    .await
}
