//! Admin endpoints: the catalogue (inventory) and customer accounts (payment).

use super::AppState;
use crate::auth::Admin;
use crate::error::ApiError;
use crate::extract::{ApiJson, IdempotencyKey};
use crate::model::{
    AddCredit, AddStock, CreateCustomer, CreateProduct, Customer, Product, ProductList, optional_id,
};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use sagaworks_errors::Problem;
use sagaworks_proto::inventory::v1 as inv;
use sagaworks_proto::payment::v1 as pay;

/// Adds a product with its price and initial stock.
#[utoipa::path(
    post, path = "/v1/products", tag = "admin", request_body = CreateProduct, params(IdempotencyKey),
    responses(
        (status = 201, body = Product),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "SKU or id taken", body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_product(
    State(state): State<AppState>,
    _: Admin,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<CreateProduct>,
) -> Result<(StatusCode, Json<Product>), ApiError> {
    let request = inv::CreateProductRequest {
        sku: body.sku,
        name: body.name,
        price_cents: body.price_cents,
        initial_stock: body.initial_stock,
        id: optional_id("id", body.id)?,
        idempotency_key: key.scoped("create-product"),
    };
    let p =
        state.inventory.clone().create_product(request).await.map_err(ApiError::downstream("inventory"))?;
    Ok((StatusCode::CREATED, Json(p.into_inner().into())))
}

/// A product with its stock counters (available, reserved, sold).
#[utoipa::path(
    get, path = "/v1/products/{product_id}", tag = "admin",
    params(("product_id" = uuid::Uuid, Path, description = "Product id (UUID)")),
    responses(
        (status = 200, body = Product),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_product(
    State(state): State<AppState>,
    _: Admin,
    Path(product_id): Path<String>,
) -> Result<Json<Product>, ApiError> {
    let p = state.inventory.clone().get_stock(inv::GetStockRequest { product_id }).await;
    Ok(Json(p.map_err(ApiError::downstream("inventory"))?.into_inner().into()))
}

/// Every product, by SKU (at most 1000).
#[utoipa::path(get, path = "/v1/products", tag = "admin", responses((status = 200, body = ProductList)))]
pub async fn list_products(State(state): State<AppState>, _: Admin) -> Result<Json<ProductList>, ApiError> {
    let res = state.inventory.clone().list_products(inv::ListProductsRequest { limit: 1000 }).await;
    let products = res.map_err(ApiError::downstream("inventory"))?.into_inner().products;
    Ok(Json(ProductList { products: products.into_iter().map(Into::into).collect() }))
}

/// Adds units to a product's available stock.
#[utoipa::path(
    post, path = "/v1/products/{product_id}/stock", tag = "admin", request_body = AddStock,
    params(("product_id" = uuid::Uuid, Path, description = "Product id (UUID)"), IdempotencyKey),
    responses(
        (status = 200, body = Product),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn add_stock(
    State(state): State<AppState>,
    _: Admin,
    Path(product_id): Path<String>,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<AddStock>,
) -> Result<Json<Product>, ApiError> {
    let idempotency_key = key.scoped("add-stock");
    let request = inv::AddStockRequest { product_id, quantity: body.quantity, idempotency_key };
    let p = state.inventory.clone().add_stock(request).await.map_err(ApiError::downstream("inventory"))?;
    Ok(Json(p.into_inner().into()))
}

/// Opens a customer account with an initial credit.
#[utoipa::path(
    post, path = "/v1/customers", tag = "admin", request_body = CreateCustomer, params(IdempotencyKey),
    responses(
        (status = 201, body = Customer),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 409, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_customer(
    State(state): State<AppState>,
    _: Admin,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<CreateCustomer>,
) -> Result<(StatusCode, Json<Customer>), ApiError> {
    let request = pay::CreateCustomerRequest {
        name: body.name,
        initial_credit_cents: body.initial_credit_cents,
        customer_id: optional_id("customer_id", body.customer_id)?,
        idempotency_key: key.scoped("create-customer"),
    };
    let a = state.payment.clone().create_customer(request).await.map_err(ApiError::downstream("payment"))?;
    Ok((StatusCode::CREATED, Json(a.into_inner().into())))
}

/// A customer's account and balance.
#[utoipa::path(
    get, path = "/v1/customers/{customer_id}", tag = "admin",
    params(("customer_id" = uuid::Uuid, Path, description = "Customer id (UUID)")),
    responses(
        (status = 200, body = Customer),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_customer(
    State(state): State<AppState>,
    _: Admin,
    Path(customer_id): Path<String>,
) -> Result<Json<Customer>, ApiError> {
    let a = state.payment.clone().get_account(pay::GetAccountRequest { customer_id }).await;
    Ok(Json(a.map_err(ApiError::downstream("payment"))?.into_inner().into()))
}

/// Adds credit to a customer's balance.
#[utoipa::path(
    post, path = "/v1/customers/{customer_id}/credit", tag = "admin", request_body = AddCredit,
    params(("customer_id" = uuid::Uuid, Path, description = "Customer id (UUID)"), IdempotencyKey),
    responses(
        (status = 200, body = Customer),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn add_credit(
    State(state): State<AppState>,
    _: Admin,
    Path(customer_id): Path<String>,
    key: IdempotencyKey,
    ApiJson(body): ApiJson<AddCredit>,
) -> Result<Json<Customer>, ApiError> {
    let idempotency_key = key.scoped("add-credit");
    let request = pay::AddCreditRequest { customer_id, amount_cents: body.amount_cents, idempotency_key };
    let a = state.payment.clone().add_credit(request).await.map_err(ApiError::downstream("payment"))?;
    Ok(Json(a.into_inner().into()))
}
