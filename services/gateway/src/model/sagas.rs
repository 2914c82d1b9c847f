//! Operating sagas: what `/v1/admin/sagas` takes, and the saga resources
//! (`sagaworks_api::saga`) made from the order service's answers.

use super::{integer, non_empty, time};
use chrono::{DateTime, Utc};
use sagaworks_api::saga::{
    Saga, SagaAttempt, SagaDetail, SagaOperatorAction, SagaStep, SagaSummary, SagaVersion, SagaVersions,
};
use sagaworks_proto::order::v1 as ord;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An order's saga.
pub fn saga(s: ord::Saga) -> Saga {
    Saga {
        saga_id: s.saga_id,
        order_id: s.order_id,
        version: s.version,
        status: s.status,
        current_step: non_empty(s.current_step),
        steps: s.steps.into_iter().map(saga_step).collect(),
        failure_reason: non_empty(s.failure_reason),
        created_at: time(s.created_at),
        updated_at: time(s.updated_at),
    }
}

fn saga_step(s: ord::SagaStep) -> SagaStep {
    SagaStep {
        name: s.name,
        status: s.status,
        attempts: s.attempts,
        error: non_empty(s.error),
        started_at: time(s.started_at),
        finished_at: time(s.finished_at),
        role: s.role,
        history: s
            .history
            .into_iter()
            .map(|a| SagaAttempt {
                attempt: a.attempt,
                started_at: time(a.started_at),
                ended_at: time(a.ended_at),
                outcome: a.outcome,
                error: non_empty(a.error),
            })
            .collect(),
    }
}

/// A saga for operators; `trace_url` is `trace_url_base` with `{trace_id}` replaced.
pub fn saga_detail(s: ord::Saga, trace_url_base: &str) -> SagaDetail {
    let actions = s
        .actions
        .iter()
        .map(|a| SagaOperatorAction {
            action: a.action.clone(),
            step: a.step.clone(),
            actor: a.actor.clone(),
            reason: a.reason.clone(),
            at: time(a.at),
        })
        .collect();
    let trace_id = non_empty(s.trace_id.clone());
    SagaDetail {
        progressed_at: time(s.progressed_at),
        trace_url: trace_id.as_ref().map(|t| trace_url_base.replace("{trace_id}", t)),
        trace_id,
        actions,
        saga: saga(s),
    }
}

/// One saga in a list; its age and idle time counted from now.
pub fn saga_summary(s: ord::SagaSummary) -> SagaSummary {
    let now = Utc::now();
    let (created_at, progressed_at) = (time(s.created_at), time(s.progressed_at));
    let secs = |t: Option<DateTime<Utc>>| t.map_or(0, |t| (now - t).num_seconds().max(0));
    SagaSummary {
        saga_id: s.saga_id,
        order_id: s.order_id,
        status: s.status,
        current_step: non_empty(s.current_step),
        attempts: s.attempts,
        last_error: non_empty(s.last_error),
        failure_reason: non_empty(s.failure_reason),
        age_secs: secs(created_at),
        idle_secs: secs(progressed_at),
        created_at,
        progressed_at,
        trace_id: non_empty(s.trace_id),
    }
}

pub fn saga_versions(r: ord::ListSagaVersionsResponse) -> SagaVersions {
    SagaVersions {
        versions: r
            .versions
            .into_iter()
            .map(|v| SagaVersion {
                saga_type: v.saga_type,
                version: v.version,
                unfinished: v.unfinished,
                fingerprint: non_empty(v.fingerprint),
                registered: v.registered,
                starts_new: v.starts_new,
            })
            .collect(),
    }
}

/// `POST /v1/admin/sagas/{saga_id}/{retry,compensate,resolve}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SagaActionInput {
    /// Why (recorded with the action), 1 to 1000 characters.
    #[schema(min_length = 1, max_length = 1000)]
    pub reason: String,
    /// `resolve` of `reserve_stock`: what the reservation would have answered.
    /// Omit it (or null) for every other step, whose output is empty.
    #[serde(default)]
    pub output: Option<ReservationOutput>,
}

/// The output of `reserve_stock`: the order's total and each product's unit price.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReservationOutput {
    #[serde(deserialize_with = "integer")]
    pub total_cents: i64,
    pub prices: Vec<PriceOutput>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PriceOutput {
    /// Product id (UUID).
    #[schema(format = Uuid)]
    pub product_id: String,
    #[serde(deserialize_with = "integer")]
    pub unit_price_cents: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saga_detail_links_its_trace() {
        let saga = ord::Saga {
            saga_id: "s".into(),
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            ..Default::default()
        };
        let detail = saga_detail(saga, "http://jaeger:16686/trace/{trace_id}");
        assert_eq!(
            detail.trace_url.as_deref(),
            Some("http://jaeger:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736")
        );
        let untraced = saga_detail(ord::Saga::default(), "http://jaeger:16686/trace/{trace_id}");
        assert_eq!((untraced.trace_id, untraced.trace_url), (None, None));
    }
}
