//! Operating sagas (admin role): find stuck, failing or compensating sagas,
//! see why, and act on one (retry now, compensate, resolve). Backed by the
//! order service (`ListSagas`, `GetSaga`, `ActOnSaga`); see
//! `sagaworks_saga::admin` for what each action does.

use super::AppState;
use crate::auth::Admin;
use crate::error::ApiError;
use crate::extract::{ApiJson, IdempotencyKey};
use crate::model::{
    SagaActionInput, SagaActionResult, SagaDetail, SagaPage, SagaVersions, saga_detail, saga_summary,
    saga_versions,
};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use sagaworks_errors::Problem;
use sagaworks_proto::order::v1 as pb;
use serde::Deserialize;

/// Which sagas `GET /v1/admin/sagas` lists.
#[derive(Debug, Clone, Copy, Deserialize, utoipa::ToSchema)]
pub enum SagaStatusFilter {
    #[serde(rename = "RUNNING")]
    Running,
    #[serde(rename = "COMPENSATING")]
    Compensating,
    #[serde(rename = "COMPLETED")]
    Completed,
    #[serde(rename = "COMPENSATED")]
    Compensated,
    #[serde(rename = "stuck")]
    Stuck,
}

impl SagaStatusFilter {
    fn as_str(self) -> &'static str {
        match self {
            SagaStatusFilter::Running => "RUNNING",
            SagaStatusFilter::Compensating => "COMPENSATING",
            SagaStatusFilter::Completed => "COMPLETED",
            SagaStatusFilter::Compensated => "COMPENSATED",
            SagaStatusFilter::Stuck => "stuck",
        }
    }
}

/// The largest `limit` of `GET /v1/admin/sagas`.
const MAX_LIMIT: u32 = 500;
/// The largest `older_than` (about ten years).
const MAX_AGE_SECS: u64 = 315_360_000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListSagasQuery {
    /// `stuck`: unfinished, no progress for longer than the order service's `saga.stuck_after_ms`.
    #[param(inline)]
    pub status: Option<SagaStatusFilter>,
    /// The current step, e.g. `refund_payment`.
    #[param(pattern = r"^[a-z][a-z0-9_]{0,62}$")]
    pub step: Option<String>,
    /// Created at least this many seconds ago (at most 315360000, about ten years).
    #[param(minimum = 1, maximum = 315_360_000)]
    pub older_than: Option<u64>,
    /// Only this customer's orders (UUID).
    #[param(value_type = Option<uuid::Uuid>)]
    pub customer_id: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(pattern = r"^[0-9a-f]{32}$")]
    pub cursor: Option<String>,
    /// At most this many, newest first (default 50, at most 500).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// Sagas newest first, filtered; keyset pagination (`next_cursor`).
#[utoipa::path(
    get, path = "/v1/admin/sagas", tag = "operations", params(ListSagasQuery),
    responses(
        (status = 200, body = SagaPage),
        (status = 422, description = "Invalid filter or cursor", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_sagas(
    State(state): State<AppState>,
    _: Admin,
    query: Result<Query<ListSagasQuery>, QueryRejection>,
) -> Result<Json<SagaPage>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    if q.limit.is_some_and(|limit| !(1..=MAX_LIMIT).contains(&limit)) {
        return Err(ApiError::invalid("limit", format!("must be between 1 and {MAX_LIMIT}")));
    }
    // Present means given: an empty value is not "no filter".
    for (field, value) in [("cursor", &q.cursor), ("step", &q.step)] {
        if value.as_deref() == Some("") {
            return Err(ApiError::invalid(field, "must not be empty"));
        }
    }
    if let Some(customer) = &q.customer_id {
        sagaworks_errors::validate::uuid("customer_id", customer)?;
    }
    if q.older_than.is_some_and(|age| !(1..=MAX_AGE_SECS).contains(&age)) {
        return Err(ApiError::invalid("older_than", format!("must be between 1 and {MAX_AGE_SECS} seconds")));
    }
    let request = pb::ListSagasRequest {
        status: q.status.map(|s| s.as_str().to_string()).unwrap_or_default(),
        step: q.step.unwrap_or_default(),
        older_than_secs: q.older_than.unwrap_or(0),
        customer_id: q.customer_id.unwrap_or_default(),
        cursor: q.cursor.unwrap_or_default(),
        limit: q.limit.unwrap_or(0),
    };
    let page = state.order.clone().list_sagas(request).await.map_err(ApiError::downstream("order"))?;
    let page = page.into_inner();
    Ok(Json(SagaPage {
        sagas: page.sagas.into_iter().map(saga_summary).collect(),
        next_cursor: (!page.next_cursor.is_empty()).then_some(page.next_cursor),
    }))
}

/// The versions of the order saga, newest first, with their unfinished instances, as
/// the answering order replica sees them: a version at 0 that starts nothing is drained,
/// and its code may be deleted (docs/design.md, "Changing a saga").
#[utoipa::path(
    get, path = "/v1/admin/sagas/versions", tag = "operations",
    responses((status = 200, body = SagaVersions))
)]
pub async fn list_saga_versions(
    State(state): State<AppState>,
    _: Admin,
) -> Result<Json<SagaVersions>, ApiError> {
    let versions = state
        .order
        .clone()
        .list_saga_versions(pb::ListSagaVersionsRequest {})
        .await
        .map_err(ApiError::downstream("order"))?;
    Ok(Json(saga_versions(versions.into_inner())))
}

/// A saga with every step's attempts (start, end, outcome, error), its trace
/// (with a link to the tracing UI) and what operators did to it.
#[utoipa::path(
    get, path = "/v1/admin/sagas/{saga_id}", tag = "operations",
    params(("saga_id" = uuid::Uuid, Path, description = "Saga id (UUID)")),
    responses(
        (status = 200, body = SagaDetail),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a UUID", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_saga(
    State(state): State<AppState>,
    _: Admin,
    Path(saga_id): Path<String>,
) -> Result<Json<SagaDetail>, ApiError> {
    let saga = state.order.clone().get_saga(pb::GetSagaRequest { saga_id }).await;
    let saga = saga.map_err(ApiError::downstream("order"))?.into_inner();
    Ok(Json(saga_detail(saga, &state.settings.trace_url)))
}

/// Runs one operator action; the caller's `sub` is recorded as the actor.
async fn act(
    state: AppState,
    admin: Admin,
    saga_id: String,
    action: &str,
    key: IdempotencyKey,
    body: SagaActionInput,
) -> Result<Json<SagaActionResult>, ApiError> {
    let request = pb::ActOnSagaRequest {
        saga_id,
        action: action.into(),
        actor: admin.0.subject,
        reason: body.reason,
        idempotency_key: key.required()?,
        output_json: match body.output {
            Some(output) => {
                serde_json::to_string(&output).map_err(|e| ApiError::invalid("output", e.to_string()))?
            }
            None => String::new(),
        },
    };
    let res = state.order.clone().act_on_saga(request).await.map_err(ApiError::downstream("order"))?;
    let res = res.into_inner();
    let saga = res.saga.ok_or_else(|| ApiError::NotFound("saga".into()))?;
    Ok(Json(SagaActionResult {
        step: res.step,
        replayed: res.replayed,
        saga: saga_detail(saga, &state.settings.trace_url),
    }))
}

/// Retry now: clears the saga's backoff; its current step runs again at once.
#[utoipa::path(
    post, path = "/v1/admin/sagas/{saga_id}/retry", tag = "operations", request_body = SagaActionInput,
    params(("saga_id" = uuid::Uuid, Path, description = "Saga id (UUID)"), IdempotencyKey),
    responses(
        (status = 200, body = SagaActionResult),
        (status = 400, description = "Malformed body", body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not valid in the saga's state (the reason says why); nothing changed", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or no Idempotency-Key", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn retry(
    State(state): State<AppState>,
    admin: Admin,
    Path(saga_id): Path<String>,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<SagaActionInput>,
) -> Result<Json<SagaActionResult>, ApiError> {
    act(state, admin, saga_id, "retry", key, body).await
}

/// Compensate: aborts a running saga before its pivot; whatever may have
/// taken effect is compensated and the order ends CANCELLED with the reason.
#[utoipa::path(
    post, path = "/v1/admin/sagas/{saga_id}/compensate", tag = "operations", request_body = SagaActionInput,
    params(("saga_id" = uuid::Uuid, Path, description = "Saga id (UUID)"), IdempotencyKey),
    responses(
        (status = 200, body = SagaActionResult),
        (status = 400, description = "Malformed body", body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not valid in the saga's state (finished, compensating, past its pivot, or a driver holds it); nothing changed", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or no Idempotency-Key", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn compensate(
    State(state): State<AppState>,
    admin: Admin,
    Path(saga_id): Path<String>,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<SagaActionInput>,
) -> Result<Json<SagaActionResult>, ApiError> {
    act(state, admin, saga_id, "compensate", key, body).await
}

/// Resolve: states the current step's effect by hand (e.g. a payment done
/// out of band, with the step's `output`); the saga goes on from there.
#[utoipa::path(
    post, path = "/v1/admin/sagas/{saga_id}/resolve", tag = "operations", request_body = SagaActionInput,
    params(("saga_id" = uuid::Uuid, Path, description = "Saga id (UUID)"), IdempotencyKey),
    responses(
        (status = 200, body = SagaActionResult),
        (status = 400, description = "Malformed body", body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not valid in the saga's state; nothing changed", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field (an output the step cannot have), or no Idempotency-Key", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn resolve(
    State(state): State<AppState>,
    admin: Admin,
    Path(saga_id): Path<String>,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<SagaActionInput>,
) -> Result<Json<SagaActionResult>, ApiError> {
    act(state, admin, saga_id, "resolve", key, body).await
}
