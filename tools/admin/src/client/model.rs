//! What the API answers: [`Fetched`] (the typed body and the JSON as sent)
//! and the JSON shapes the CLI reads, which are the gateway's own types
//! (`sagaworks_api`): they ignore fields they do not know, so a newer
//! gateway does not break an older CLI.

pub use sagaworks_api::Problem;
pub use sagaworks_api::dead_letter::{
    DeadLetter, DeadLetterAction, DeadLetterPage, Discarded, DlqTopic, DlqTopics, OriginalPosition, Replayed,
};
pub use sagaworks_api::saga::{
    SagaActionResult, SagaAttempt, SagaDetail, SagaOperatorAction, SagaPage, SagaStep, SagaSummary,
    SagaVersion, SagaVersions,
};
use serde_json::Value;

/// An answer: the typed body and the JSON as sent.
#[derive(Debug, Clone)]
pub struct Fetched<T> {
    pub value: T,
    pub raw: Value,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes_ignore_unknown_fields_and_take_absent_options_as_none() {
        let page: SagaPage = serde_json::from_value(json!({
            "sagas": [{
                "saga_id": "s", "order_id": "o", "status": "RUNNING", "attempts": 1, "created_at": null,
                "progressed_at": null, "age_secs": 3, "idle_secs": 1, "brand_new": {"x": 1},
            }],
        }))
        .unwrap();
        assert_eq!(page.sagas[0].saga_id, "s");
        assert_eq!(page.sagas[0].current_step, None);
        assert_eq!(page.next_cursor, None);
    }
}
