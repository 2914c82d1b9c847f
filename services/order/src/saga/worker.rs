//! Resumes sagas nobody is driving.
//!
//! Every `poll_interval_ms` the worker leases runnable sagas — unfinished,
//! due (`next_attempt_at`), and either unleased or with an expired lease (the
//! replica driving it crashed) — with `FOR UPDATE SKIP LOCKED`, so replicas
//! never take the same saga, and drives each on its own task. On shutdown it
//! stops leasing and waits for the sagas in hand, which hand their leases
//! back at the next step boundary.
//!
//! A resumed saga continues its order's trace: its `saga` span is a child
//! of the `CreateOrder` call's span (the `traceparent` stored with the
//! order), like the span of the drive that call started, so a saga that
//! crashed, waited for a retry or moved to another replica is still one
//! trace in Jaeger.

use super::orchestrator::{DriveError, NewSaga, Orchestrator};
use sagaworks_telemetry::propagation;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

/// Leases up to `limit` runnable sagas to this replica; returns their ids
/// with their orders' `traceparent`.
async fn lease(
    orchestrator: &Orchestrator,
    pool: &sqlx::PgPool,
    limit: i64,
) -> Result<Vec<(Uuid, Option<String>)>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE sagas SET lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2), updated_at = now()
         WHERE id IN (
             SELECT id FROM sagas
             WHERE status IN ('RUNNING', 'COMPENSATING') AND next_attempt_at <= now()
               AND (lease_expires_at IS NULL OR lease_expires_at < now())
             ORDER BY next_attempt_at
             LIMIT $3
             FOR UPDATE SKIP LOCKED)
         RETURNING id, (SELECT o.traceparent FROM orders o WHERE o.id = sagas.order_id)",
    )
    .bind(orchestrator.owner())
    .bind(orchestrator.settings().lease_ms as f64 / 1000.0)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Runs until `shutdown`; see the module docs.
pub async fn run(orchestrator: Orchestrator, pool: sqlx::PgPool, shutdown: CancellationToken) {
    let permits = orchestrator.permits();
    let poll = Duration::from_millis(orchestrator.settings().poll_interval_ms.max(10));
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(poll) => {}
        }
        while running.try_join_next().is_some() {}
        if orchestrator.has_crashed() {
            continue;
        }
        let free = permits.available_permits() as i64;
        if free == 0 {
            continue;
        }
        let ids = match lease(&orchestrator, &pool, free).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(error = %e, "cannot lease sagas");
                continue;
            }
        };
        for (id, traceparent) in ids {
            let Ok(permit) = permits.clone().acquire_owned().await else { break };
            metrics::counter!("saga_resumed_total").increment(1);
            let (orchestrator, stop) = (orchestrator.clone(), shutdown.clone());
            let span = tracing::info_span!("saga", saga.id = %id);
            if let Some(traceparent) = traceparent {
                propagation::continue_trace(&span, &traceparent);
            }
            running.spawn(
                async move {
                    let _permit = permit;
                    log_outcome(id, orchestrator.drive(id, &stop).await);
                }
                .instrument(span),
            );
        }
    }
    while running.join_next().await.is_some() {}
}

/// Drives a saga this replica just created (its lease was taken in the same
/// statement) on a task of its own, holding `permit` (taken before the saga
/// was created, see [`Orchestrator::permits`]); returns when the saga
/// finished, must wait for a retry, or `wait` elapsed — the saga goes on
/// regardless. Without a permit the replica is at its bound: the saga is
/// handed to the worker like any other.
pub async fn start(
    orchestrator: &Orchestrator,
    saga: NewSaga,
    permit: Option<OwnedSemaphorePermit>,
    wait: Duration,
    stop: &CancellationToken,
) {
    let id = saga.saga_id;
    let (orchestrator, stop) = (orchestrator.clone(), stop.clone());
    // The task carries the caller's span, so the saga's spans join the
    // CreateOrder trace (a saga resumed by `run` starts a trace of its own).
    let task = tokio::spawn(
        async move {
            let Some(_permit) = permit else {
                let _ = orchestrator.release_lease(id, Duration::ZERO).await;
                return;
            };
            log_outcome(id, orchestrator.drive_new(saga, &stop).await);
        }
        .in_current_span(),
    );
    let _ = tokio::time::timeout(wait, task).await;
}

fn log_outcome(id: Uuid, result: Result<super::orchestrator::Driven, DriveError>) {
    match result {
        Ok(_) => {}
        Err(DriveError::Crashed(_)) => {}
        Err(DriveError::LeaseLost(_)) => tracing::info!(saga.id = %id, "saga taken over by another replica"),
        // The lease runs out and the worker (here or elsewhere) resumes it.
        Err(e) => tracing::warn!(saga.id = %id, error = %e, "saga driver stopped; it will be resumed"),
    }
}
