//! Operating sagas: what `/v1/admin/sagas` takes and answers.

use super::{Saga, integer, non_empty, time};
use chrono::{DateTime, Utc};
use sagaworks_proto::order::v1 as ord;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A saga for operators: its steps with their attempts, its trace, and what
/// operators did to it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SagaDetail {
    #[serde(flatten)]
    pub saga: Saga,
    /// The last transition (a step's result).
    pub progressed_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The trace in Jaeger (`api.trace_url`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_url: Option<String>,
    /// Operators' actions, oldest first.
    pub actions: Vec<SagaOperatorAction>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SagaOperatorAction {
    /// `RETRY`, `COMPENSATE` or `RESOLVE`.
    pub action: String,
    pub step: String,
    pub actor: String,
    pub reason: String,
    pub at: Option<DateTime<Utc>>,
}

/// `trace_url` is `trace_url_base` with `{trace_id}` replaced.
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
        saga: s.into(),
    }
}

/// One saga in a list.
#[derive(Debug, Serialize, ToSchema)]
pub struct SagaSummary {
    pub saga_id: String,
    pub order_id: String,
    /// `RUNNING`, `COMPENSATING`, `COMPLETED` or `COMPENSATED`.
    pub status: String,
    /// Absent once the saga has finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_step: Option<String>,
    /// Attempts of the current step so far.
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub progressed_at: Option<DateTime<Utc>>,
    /// Seconds since it was created.
    pub age_secs: i64,
    /// Seconds since its last transition.
    pub idle_secs: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

impl From<ord::SagaSummary> for SagaSummary {
    fn from(s: ord::SagaSummary) -> Self {
        let now = Utc::now();
        let (created_at, progressed_at) = (time(s.created_at), time(s.progressed_at));
        let secs = |t: Option<DateTime<Utc>>| t.map_or(0, |t| (now - t).num_seconds().max(0));
        Self {
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
}

/// A page of sagas, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct SagaPage {
    pub sagas: Vec<SagaSummary>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
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

/// What an operator's action did, and the saga after it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SagaActionResult {
    /// The step acted on.
    pub step: String,
    /// The key was used before for the same action: nothing was done again.
    pub replayed: bool,
    pub saga: SagaDetail,
}

/// The versions of a saga (`GET /v1/admin/sagas/versions`), newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct SagaVersions {
    pub versions: Vec<SagaVersion>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SagaVersion {
    pub saga_type: String,
    pub version: u32,
    /// Instances started on it and not finished.
    pub unfinished: u64,
    /// Its fingerprint when first registered (absent: never registered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// The answering replica can drive its instances.
    pub registered: bool,
    /// The answering replica starts new instances on it; the others drain.
    pub starts_new: bool,
}

impl From<ord::ListSagaVersionsResponse> for SagaVersions {
    fn from(r: ord::ListSagaVersionsResponse) -> Self {
        Self {
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
