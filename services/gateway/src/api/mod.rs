//! The public REST API: routes, shared state and the OpenAPI document.

pub mod admin;
pub mod orders;

use crate::config::ApiSettings;
use crate::error::ApiError;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_proto::order::v1::order_service_client::OrderServiceClient;
use sagaworks_proto::payment::v1::payment_service_client::PaymentServiceClient;
use sagaworks_resilience::ResilientChannel;
use sagaworks_telemetry::grpc::ClientTrace;

/// A downstream channel: the resilience stack, each call traced.
pub type Channel = ClientTrace<ResilientChannel>;
use utoipa::OpenApi;

/// What every handler gets: one resilient client per downstream.
#[derive(Clone)]
pub struct AppState {
    pub order: OrderServiceClient<Channel>,
    pub inventory: InventoryServiceClient<Channel>,
    pub payment: PaymentServiceClient<Channel>,
    pub settings: ApiSettings,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "sagaworks", description = "Order placement as an orchestrated saga across order, inventory and payment services."),
    paths(
        orders::create_order, orders::get_order, orders::list_orders, orders::get_saga,
        admin::create_product, admin::get_product, admin::list_products, admin::add_stock,
        admin::create_customer, admin::get_customer, admin::add_credit,
    ),
    components(schemas(sagaworks_errors::Problem, sagaworks_errors::FieldError)),
    tags((name = "orders"), (name = "admin"))
)]
pub struct ApiDoc;

/// The `/v1` routes, `/openapi.json`, and a problem+json fallback.
pub fn router(state: AppState) -> Router {
    let limit = state.settings.max_body_bytes;
    Router::new()
        .route("/v1/orders", post(orders::create_order).get(orders::list_orders))
        .route("/v1/orders/{order_id}", get(orders::get_order))
        .route("/v1/sagas/{saga_id}", get(orders::get_saga))
        .route("/v1/products", post(admin::create_product).get(admin::list_products))
        .route("/v1/products/{product_id}", get(admin::get_product))
        .route("/v1/products/{product_id}/stock", post(admin::add_stock))
        .route("/v1/customers", post(admin::create_customer))
        .route("/v1/customers/{customer_id}", get(admin::get_customer))
        .route("/v1/customers/{customer_id}/credit", post(admin::add_credit))
        .route("/openapi.json", get(|| async { axum::Json(ApiDoc::openapi()) }))
        .fallback(|| async { ApiError::NotFound("no such resource".into()) })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}
