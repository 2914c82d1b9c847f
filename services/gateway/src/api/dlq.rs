//! Operating dead letters (admin role): see what the consumers parked in
//! `<topic>.dlq` and why, replay it to the original topic in its original
//! per-key order once the cause is fixed, or discard it with a reason.
//! Backed by the order service's `DeadLetterService` (see
//! `sagaworks_outbox::dead_letter`). `{topic}` is the original topic as
//! configured: `order`, `reservation` or `payment`.

use super::AppState;
use crate::auth::Admin;
use crate::error::ApiError;
use crate::extract::{ApiJson, IdempotencyKey};
use crate::model::{dead_letter, dead_letter_page, dlq_topics};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use sagaworks_api::dead_letter::{
    DeadLetter, DeadLetterPage, Discarded, DlqActionInput, DlqReplayInput, DlqTopics, Replayed,
};
use sagaworks_errors::Problem;
use sagaworks_proto::deadletter::v1 as pb;
use serde::Deserialize;

/// The largest `limit` of a page.
const MAX_LIMIT: u32 = 500;

/// A message id: `<partition>-<offset>` in the dead-letter topic.
fn message_id(field: &str, id: &str) -> Result<(), ApiError> {
    let digits = |t: &str| (1..=19).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_digit());
    match id.split_once('-') {
        Some((p, o)) if digits(p) && digits(o) && p.len() <= 10 => Ok(()),
        _ => Err(ApiError::invalid(field, "must be <partition>-<offset>, e.g. 0-17")),
    }
}

/// Which messages are listed.
#[derive(Debug, Clone, Copy, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeadLetterState {
    Pending,
    Replayed,
    Discarded,
}

impl DeadLetterState {
    fn as_str(self) -> &'static str {
        match self {
            DeadLetterState::Pending => "pending",
            DeadLetterState::Replayed => "replayed",
            DeadLetterState::Discarded => "discarded",
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListDeadLettersQuery {
    /// Only messages in this state.
    #[param(inline)]
    pub state: Option<DeadLetterState>,
    /// Only messages with this Kafka key (the aggregate id).
    #[param(min_length = 1, max_length = 255)]
    pub key: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(pattern = r"^[0-9]{1,10}-[0-9]{1,19}$")]
    pub cursor: Option<String>,
    /// At most this many, oldest first (default 50, at most 500).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// Every operated dead-letter topic with its counts.
#[utoipa::path(
    get, path = "/v1/admin/dlq", tag = "operations",
    responses((status = 200, body = DlqTopics))
)]
pub async fn list_topics(State(state): State<AppState>, _: Admin) -> Result<Json<DlqTopics>, ApiError> {
    let res = state.dead_letters.clone().list_topics(pb::ListTopicsRequest {}).await;
    let res = res.map_err(ApiError::downstream("order"))?.into_inner();
    Ok(Json(dlq_topics(res)))
}

/// A dead-letter topic's messages, oldest first, with why each failed;
/// keyset pagination (`next_cursor`).
#[utoipa::path(
    get, path = "/v1/admin/dlq/{topic}/messages", tag = "operations",
    params(("topic" = String, Path, description = "Original topic: order, reservation or payment"), ListDeadLettersQuery),
    responses(
        (status = 200, body = DeadLetterPage),
        (status = 404, description = "No such topic", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid filter or cursor", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_messages(
    State(state): State<AppState>,
    _: Admin,
    Path(topic): Path<String>,
    query: Result<Query<ListDeadLettersQuery>, QueryRejection>,
) -> Result<Json<DeadLetterPage>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    if q.limit.is_some_and(|limit| !(1..=MAX_LIMIT).contains(&limit)) {
        return Err(ApiError::invalid("limit", format!("must be between 1 and {MAX_LIMIT}")));
    }
    if let Some(key) = &q.key
        && !(1..=255).contains(&key.chars().count())
    {
        return Err(ApiError::invalid("key", "must be 1 to 255 characters"));
    }
    if let Some(cursor) = &q.cursor {
        message_id("cursor", cursor)?;
    }
    let request = pb::ListDeadLettersRequest {
        topic,
        state: q.state.map(|s| s.as_str().to_string()).unwrap_or_default(),
        key: q.key.unwrap_or_default(),
        cursor: q.cursor.unwrap_or_default(),
        limit: q.limit.unwrap_or(0),
    };
    let page = state.dead_letters.clone().list_dead_letters(request).await;
    let page = page.map_err(ApiError::downstream("order"))?.into_inner();
    Ok(Json(dead_letter_page(page)))
}

/// One dead-lettered message: its headers, payload (at most 64 KiB), error,
/// original position and what operators did with it.
#[utoipa::path(
    get, path = "/v1/admin/dlq/{topic}/messages/{id}", tag = "operations",
    params(
        ("topic" = String, Path, description = "Original topic: order, reservation or payment"),
        ("id" = String, Path, description = "`<partition>-<offset>` in the dead-letter topic", pattern = r"^[0-9]{1,10}-[0-9]{1,19}$"),
    ),
    responses(
        (status = 200, body = DeadLetter),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a message id", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_message(
    State(state): State<AppState>,
    _: Admin,
    Path((topic, id)): Path<(String, String)>,
) -> Result<Json<DeadLetter>, ApiError> {
    message_id("id", &id)?;
    let res = state.dead_letters.clone().get_dead_letter(pb::GetDeadLetterRequest { topic, id }).await;
    Ok(Json(dead_letter(res.map_err(ApiError::downstream("order"))?.into_inner())))
}

fn operator(admin: Admin, key: IdempotencyKey, reason: String) -> Result<pb::Operator, ApiError> {
    Ok(pb::Operator { actor: admin.0.subject, reason, idempotency_key: key.required()? })
}

/// Replay: sends pending messages (one, all of one key, or all) back to the
/// original topic, each key's in their original order. Safe: consumers are
/// idempotent, so a group that already handled a message skips it.
#[utoipa::path(
    post, path = "/v1/admin/dlq/{topic}/replay", tag = "operations", request_body = DlqReplayInput,
    params(("topic" = String, Path, description = "Original topic: order, reservation or payment"), IdempotencyKey),
    responses(
        (status = 200, body = Replayed),
        (status = 400, description = "Malformed body", body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The message is not pending (already replayed or discarded); nothing sent", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, no Idempotency-Key, or the key was used for another request", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn replay(
    State(state): State<AppState>,
    admin: Admin,
    Path(topic): Path<String>,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<DlqReplayInput>,
) -> Result<Json<Replayed>, ApiError> {
    use pb::replay_request::Selector;
    let (reason, selector) = match body {
        DlqReplayInput::One { reason, id } => {
            message_id("id", &id)?;
            (reason, Selector::Id(id))
        }
        DlqReplayInput::Key { reason, key } => (reason, Selector::Key(key)),
        DlqReplayInput::All { reason, .. } => (reason, Selector::All(true)),
    };
    let request =
        pb::ReplayRequest { topic, operator: Some(operator(admin, key, reason)?), selector: Some(selector) };
    let res = state.dead_letters.clone().replay(request).await.map_err(ApiError::downstream("order"))?;
    let res = res.into_inner();
    Ok(Json(Replayed { replayed: res.ids, replay: res.replayed }))
}

/// Discard: records that the message needs nothing (who, when, why); it is
/// no longer pending and never replayed.
#[utoipa::path(
    post, path = "/v1/admin/dlq/{topic}/messages/{id}/discard", tag = "operations", request_body = DlqActionInput,
    params(
        ("topic" = String, Path, description = "Original topic: order, reservation or payment"),
        ("id" = String, Path, description = "`<partition>-<offset>` in the dead-letter topic", pattern = r"^[0-9]{1,10}-[0-9]{1,19}$"),
        IdempotencyKey,
    ),
    responses(
        (status = 200, body = Discarded),
        (status = 400, description = "Malformed body", body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The message is not pending; nothing changed", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, no Idempotency-Key, or the key was used for another request", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn discard(
    State(state): State<AppState>,
    admin: Admin,
    Path((topic, id)): Path<(String, String)>,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<DlqActionInput>,
) -> Result<Json<Discarded>, ApiError> {
    message_id("id", &id)?;
    let request =
        pb::DiscardRequest { topic, id: id.clone(), operator: Some(operator(admin, key, body.reason)?) };
    let res = state.dead_letters.clone().discard(request).await.map_err(ApiError::downstream("order"))?;
    Ok(Json(Discarded { id, state: "discarded".into(), replay: res.into_inner().replayed }))
}
