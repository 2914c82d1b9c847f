//! What the engine tells the outside: its metrics (names below, each labelled
//! with the saga's name), its spans (`saga` per instance, `saga.step` per
//! turn) and its log lines.

use super::DriveError;
use super::Driven;
use crate::step::StepError;
use serde_json::Value;
use std::time::Duration;
use uuid::Uuid;

/// Counter: step outcomes, by `step` and `result` (`succeeded`, `rejected`,
/// `unavailable`, `failed`).
pub const STEPS_TOTAL: &str = "saga_steps_total";
/// Histogram: how long a step's call took, by `step`.
pub const STEP_DURATION_SECONDS: &str = "saga_step_duration_seconds";
/// Histogram: an instance's life, start to end, by `outcome`.
pub const DURATION_SECONDS: &str = "saga_duration_seconds";
/// Counter: instances finished, by `outcome` (`completed`, `compensated`).
pub const FINISHED_TOTAL: &str = "sagas_finished_total";
/// Counter: instances the worker leased (resumed after a crash, a retry's
/// backoff or an operator's action).
pub const RESUMED_TOTAL: &str = "saga_resumed_total";
/// Gauge: unfinished instances without progress for `stuck_after_ms`.
pub const STUCK: &str = "saga_stuck";
/// Gauge: unfinished instances by the `version` they started on (a version drained
/// to 0 may be deleted from the code).
pub const UNFINISHED: &str = "saga_unfinished";

/// Starts the counters a dashboard reads from zero.
pub(super) fn register(saga: &'static str) {
    metrics::counter!(RESUMED_TOTAL, "saga" => saga).absolute(0);
}

pub(super) fn step_done(saga: &'static str, step: &'static str, outcome: &Result<Value, StepError>) {
    metrics::counter!(STEPS_TOTAL, "saga" => saga, "step" => step, "result" => label(outcome)).increment(1);
}

pub(super) fn step_duration(saga: &'static str, step: &'static str, took: Duration) {
    metrics::histogram!(STEP_DURATION_SECONDS, "saga" => saga, "step" => step).record(took.as_secs_f64());
}

pub(super) fn finished(saga: &'static str, completed: bool, lived: Duration) {
    let outcome = if completed { "completed" } else { "compensated" };
    metrics::histogram!(DURATION_SECONDS, "saga" => saga, "outcome" => outcome).record(lived.as_secs_f64());
    metrics::counter!(FINISHED_TOTAL, "saga" => saga, "outcome" => outcome).increment(1);
}

pub(super) fn resumed(saga: &'static str) {
    metrics::counter!(RESUMED_TOTAL, "saga" => saga).increment(1);
}

pub(super) fn stuck(saga: &'static str, count: i64) {
    metrics::gauge!(STUCK, "saga" => saga).set(count as f64);
}

pub(super) fn unfinished(saga: &'static str, version: u32, count: u64) {
    metrics::gauge!(UNFINISHED, "saga" => saga, "version" => version.to_string()).set(count as f64);
}

/// The span of one instance (its steps' spans are its children).
pub(super) fn saga_span(saga: &'static str, id: Uuid) -> tracing::Span {
    tracing::info_span!("saga", saga.id = %id, saga.r#type = saga)
}

/// The span of one step (`saga.step`, inside the `saga` span); its outcome is
/// recorded by [`record_outcome`].
pub(super) fn step_span(name: &str, compensation: bool) -> tracing::Span {
    tracing::info_span!(
        "saga.step",
        saga.step.name = name,
        saga.step.compensation = compensation,
        saga.step.outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
}

/// `saga.step.outcome`; a rejected or failed step is an error span.
pub(super) fn record_outcome(span: &tracing::Span, outcome: &Result<Value, StepError>) {
    span.record("saga.step.outcome", label(outcome));
    if let Err(e) = outcome {
        span.record("otel.status_code", "ERROR");
        span.record("otel.status_description", e.message());
    }
}

/// A step outcome's label for metrics, spans and a step's history.
pub(super) fn label(outcome: &Result<Value, StepError>) -> &'static str {
    match outcome {
        Ok(_) => "succeeded",
        Err(StepError::Rejected(_)) => "rejected",
        Err(StepError::Unavailable { .. }) => "unavailable",
        Err(StepError::Failed(_)) => "failed",
    }
}

/// How a driver that ran on its own task ended, in the log.
pub(super) fn log_outcome(id: Uuid, result: Result<Driven, DriveError>) {
    match result {
        Ok(_) | Err(DriveError::Crashed(_)) => {}
        Err(DriveError::LeaseLost(_)) => tracing::info!(saga.id = %id, "saga taken over by another replica"),
        Err(e @ DriveError::Undrivable(..)) => {
            tracing::error!(saga.id = %id, error = %e, "saga left for an operator")
        }
        // The lease runs out and the worker (here or elsewhere) resumes it.
        Err(e) => tracing::warn!(saga.id = %id, error = %e, "saga driver stopped; it will be resumed"),
    }
}
