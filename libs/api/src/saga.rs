//! The bodies of the saga resources: an order's saga (`/v1/orders/{id}/saga`)
//! and the operators' views and actions (`/v1/admin/sagas`). What the gateway
//! answers and the admin CLI reads. A client ignores fields it does not know,
//! and an absent optional field is `None`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A saga: its status and each step's attempts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Saga {
    pub saga_id: String,
    pub order_id: String,
    /// The version of the saga's definition it started on (and runs on).
    pub version: u32,
    /// `RUNNING`, `COMPENSATING`, `COMPLETED` or `COMPENSATED`.
    pub status: String,
    /// The step running or to run next; absent once the saga has finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_step: Option<String>,
    pub steps: Vec<SagaStep>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SagaStep {
    /// `check_account` (version 2), `reserve_stock`, `charge_payment`, `confirm_order`, `refund_payment`, `release_stock`.
    pub name: String,
    /// `RUNNING`, `SUCCEEDED` or `FAILED`.
    pub status: String,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Each attempt's outcome, oldest first.
    pub history: Vec<SagaAttempt>,
    /// `compensatable`, `pivot` or `retriable` (forward steps), or `compensation`.
    pub role: String,
}

/// One attempt of a saga step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SagaAttempt {
    pub attempt: u32,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// `succeeded`, `rejected`, `failed`; an operator's `resolved` or `abandoned`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A saga for operators: its steps with their attempts, its trace, and what
/// operators did to it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SagaOperatorAction {
    /// `RETRY`, `COMPENSATE` or `RESOLVE`.
    pub action: String,
    pub step: String,
    pub actor: String,
    pub reason: String,
    pub at: Option<DateTime<Utc>>,
}

/// One saga in a list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// A page of sagas, newest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SagaPage {
    pub sagas: Vec<SagaSummary>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// What an operator's action did, and the saga after it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SagaActionResult {
    /// The step acted on.
    pub step: String,
    /// The key was used before for the same action: nothing was done again.
    pub replayed: bool,
    pub saga: SagaDetail,
}

/// The versions of a saga (`GET /v1/admin/sagas/versions`), newest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SagaVersions {
    pub versions: Vec<SagaVersion>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_saga_detail_reads_its_flattened_saga_and_ignores_unknown_fields() {
        let detail: SagaDetail = serde_json::from_value(json!({
            "saga_id": "s", "order_id": "o", "version": 2, "status": "RUNNING",
            "current_step": "reserve_stock", "steps": [], "created_at": null, "updated_at": null,
            "progressed_at": null, "actions": [], "brand_new": {"x": 1},
        }))
        .unwrap();
        assert_eq!(detail.saga.saga_id, "s");
        assert_eq!(detail.saga.current_step.as_deref(), Some("reserve_stock"));
        assert_eq!(detail.trace_id, None);
        let back = serde_json::to_value(&detail).unwrap();
        assert_eq!(back["version"], 2, "flattened on the way out too");
        assert!(back.get("trace_id").is_none(), "an absent trace is left out");
    }
}
