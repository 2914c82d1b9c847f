//! What the API answers: [`Fetched`] (the typed body and the JSON as sent)
//! and the JSON shapes the CLI reads. The saga shapes are the CLI's own small
//! copies of the gateway's JSON: unknown fields are ignored and missing ones
//! take their default, so a newer gateway does not break an older CLI. The
//! dead-letter shapes and [`Problem`] are the gateway's own types
//! (`sagaworks_api`), which ignore unknown fields too.

use chrono::{DateTime, Utc};
pub use sagaworks_api::Problem;
pub use sagaworks_api::dead_letter::{
    DeadLetter, DeadLetterAction, DeadLetterPage, Discarded, DlqTopic, DlqTopics, OriginalPosition, Replayed,
};
use serde::Deserialize;
use serde_json::Value;

/// An answer: the typed body and the JSON as sent.
#[derive(Debug, Clone)]
pub struct Fetched<T> {
    pub value: T,
    pub raw: Value,
}

// The saga shapes (only what the CLI shows; unknown fields are ignored).

/// `GET /v1/admin/sagas`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaPage {
    pub sagas: Vec<SagaSummary>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaSummary {
    pub saga_id: String,
    pub order_id: String,
    pub status: String,
    pub current_step: Option<String>,
    /// Attempts of the current step so far.
    pub attempts: u32,
    pub last_error: Option<String>,
    pub failure_reason: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub progressed_at: Option<DateTime<Utc>>,
    pub age_secs: i64,
    /// Seconds since the last progress.
    pub idle_secs: i64,
    pub trace_id: Option<String>,
}

/// `GET /v1/admin/sagas/versions`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaVersions {
    pub versions: Vec<SagaVersion>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaVersion {
    pub saga_type: String,
    pub version: u32,
    pub unfinished: u64,
    pub fingerprint: Option<String>,
    pub registered: bool,
    pub starts_new: bool,
}

/// `GET /v1/admin/sagas/{id}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaDetail {
    pub saga_id: String,
    pub order_id: String,
    pub status: String,
    pub current_step: Option<String>,
    pub steps: Vec<SagaStep>,
    pub failure_reason: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    pub progressed_at: Option<DateTime<Utc>>,
    pub trace_id: Option<String>,
    pub trace_url: Option<String>,
    pub actions: Vec<SagaOperatorAction>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaStep {
    pub name: String,
    pub status: String,
    pub attempts: u32,
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub history: Vec<SagaAttempt>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaAttempt {
    pub attempt: u32,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub outcome: String,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaOperatorAction {
    pub action: String,
    pub step: String,
    pub actor: String,
    pub reason: String,
    pub at: Option<DateTime<Utc>>,
}

/// `POST /v1/admin/sagas/{id}/{action}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaActionResult {
    pub step: String,
    /// The key was used before: nothing was done again.
    pub replayed: bool,
    pub saga: SagaDetail,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes_tolerate_unknown_and_missing_fields() {
        let page: SagaPage = serde_json::from_value(json!({
            "sagas": [{"saga_id": "s", "status": "RUNNING", "brand_new": {"x": 1}, "created_at": null}],
        }))
        .unwrap();
        assert_eq!(page.sagas[0].saga_id, "s");
        assert_eq!(page.sagas[0].attempts, 0);
        assert_eq!(page.next_cursor, None);
    }
}
