//! Orders and sagas.

use super::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, IdempotencyKey};
use crate::model::{self, CreateOrder, Order, OrderList, Saga};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sagaworks_errors::Problem;
use sagaworks_proto::order::v1 as pb;
use serde::Deserialize;

/// Places an order for the caller (admins: for anyone) and runs its saga
/// (reserve stock, charge, confirm; or compensate and cancel). Answers once the saga finished, or after the
/// configured wait with the order still `PENDING`.
#[utoipa::path(
    post, path = "/v1/orders", tag = "orders", request_body = CreateOrder,
    params(IdempotencyKey),
    responses(
        (status = 201, description = "Order created (saga finished or still running)", body = Order),
        (status = 200, description = "Replay of an earlier request with the same Idempotency-Key", body = Order),
        (status = 400, description = "Malformed body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or the key was used for another body", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "A service is unavailable; retry after Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "A service did not answer in time", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_order(
    State(state): State<AppState>,
    caller: Caller,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<CreateOrder>,
) -> Result<Response, ApiError> {
    caller.may_act_for(&body.customer_id)?;
    let request = pb::CreateOrderRequest {
        idempotency_key: key.as_sent(),
        customer_id: body.customer_id,
        items: body
            .items
            .into_iter()
            .map(|i| pb::OrderItem { product_id: i.product_id, quantity: i.quantity, unit_price_cents: 0 })
            .collect(),
        wait_millis: state.settings.order_wait_ms,
    };
    let res =
        state.order.clone().create_order(request).await.map_err(ApiError::downstream("order"))?.into_inner();
    let order: Order = res.order.ok_or_else(|| ApiError::NotFound("order".into()))?.into();
    let status = if res.replayed { StatusCode::OK } else { StatusCode::CREATED };
    let mut response = (status, Json(&order)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/orders/{}", order.order_id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    if res.replayed {
        response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// An order with its items, total, saga steps and event timeline (its customer or an admin).
#[utoipa::path(
    get, path = "/v1/orders/{order_id}", tag = "orders",
    params(("order_id" = uuid::Uuid, Path, description = "Order id (UUID)")),
    responses(
        (status = 200, body = Order),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a UUID", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_order(
    State(state): State<AppState>,
    caller: Caller,
    Path(order_id): Path<String>,
) -> Result<Json<Order>, ApiError> {
    let order = fetch_order(&state, order_id).await?;
    // As the order service answers an unknown id.
    caller
        .may_see(&order.customer_id, || ApiError::NotFound(format!("order {} not found", order.order_id)))?;
    Ok(Json(order.into()))
}

async fn fetch_order(state: &AppState, order_id: String) -> Result<pb::Order, ApiError> {
    let order = state.order.clone().get_order(pb::GetOrderRequest { order_id }).await;
    Ok(order.map_err(ApiError::downstream("order"))?.into_inner())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListOrdersQuery {
    /// Customer id (UUID); customers may list only their own.
    #[param(value_type = uuid::Uuid)]
    pub customer_id: String,
    /// At most this many orders, newest first (default 50, at most 500).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// The largest `limit` of `GET /v1/orders`.
const MAX_LIST_LIMIT: u32 = 500;

/// A customer's orders, newest first (only the caller's own, unless admin).
#[utoipa::path(
    get, path = "/v1/orders", tag = "orders", params(ListOrdersQuery),
    responses(
        (status = 200, body = OrderList),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_orders(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<ListOrdersQuery>, QueryRejection>,
) -> Result<Json<OrderList>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    if q.limit.is_some_and(|limit| !(1..=MAX_LIST_LIMIT).contains(&limit)) {
        return Err(ApiError::invalid("limit", format!("must be between 1 and {MAX_LIST_LIMIT}")));
    }
    caller.may_act_for(&q.customer_id)?;
    let request = pb::ListOrdersRequest { customer_id: q.customer_id, limit: q.limit.unwrap_or(0) };
    let res = state.order.clone().list_orders(request).await.map_err(ApiError::downstream("order"))?;
    Ok(Json(OrderList { orders: res.into_inner().orders.into_iter().map(Into::into).collect() }))
}

/// A saga's state and the history of its steps (only for its order's customer, or an admin).
#[utoipa::path(
    get, path = "/v1/sagas/{saga_id}", tag = "orders",
    params(("saga_id" = uuid::Uuid, Path, description = "Saga id (UUID)")),
    responses(
        (status = 200, body = Saga),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_saga(
    State(state): State<AppState>,
    caller: Caller,
    Path(saga_id): Path<String>,
) -> Result<Json<Saga>, ApiError> {
    let saga = state.order.clone().get_saga(pb::GetSagaRequest { saga_id }).await;
    let saga = saga.map_err(ApiError::downstream("order"))?.into_inner();
    if !caller.is_admin() {
        // A saga belongs to whoever owns its order.
        let order = fetch_order(&state, saga.order_id.clone()).await?;
        caller
            .may_see(&order.customer_id, || ApiError::NotFound(format!("saga {} not found", saga.saga_id)))?;
    }
    Ok(Json(model::saga(saga)))
}
