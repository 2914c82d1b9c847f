//! The public REST API: routes, shared state and the OpenAPI document.

pub mod admin;
pub mod dlq;
pub mod inspector;
pub mod orders;
pub mod sagas;

use crate::auth::{Authenticator, Gate};
use crate::config::ApiSettings;
use crate::error::ApiError;
use crate::ratelimit::Limiter;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::header::CONTENT_TYPE;
use axum::routing::{get, post};
use sagaworks_events::asyncapi;
use sagaworks_proto::deadletter::v1::dead_letter_service_client::DeadLetterServiceClient;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_proto::order::v1::order_service_client::OrderServiceClient;
use sagaworks_proto::payment::v1::payment_service_client::PaymentServiceClient;
use sagaworks_resilience::ResilientChannel;
use sagaworks_telemetry::grpc::ClientTrace;
use std::sync::Arc;

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, HeaderBuilder, ObjectBuilder, Ref, RefOr, Response, ResponseBuilder, Type,
};
use utoipa::{Modify, OpenApi};
use utoipa_swagger_ui::SwaggerUi;

/// A downstream channel: the resilience stack, each call traced.
pub type Channel = ClientTrace<ResilientChannel>;

/// What every handler gets: one resilient client per downstream.
#[derive(Clone)]
pub struct AppState {
    pub order: OrderServiceClient<Channel>,
    /// Dead-letter operations; hosted by the order service, on its channel.
    pub dead_letters: DeadLetterServiceClient<Channel>,
    pub inventory: InventoryServiceClient<Channel>,
    pub payment: PaymentServiceClient<Channel>,
    pub settings: ApiSettings,
    pub auth: Arc<Authenticator>,
    /// `None` when rate limiting is disabled.
    pub limiter: Option<Arc<Limiter>>,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "sagaworks", description = "Order placement as an orchestrated saga across order, inventory and payment services."),
    paths(
        orders::create_order, orders::get_order, orders::list_orders, orders::get_saga,
        admin::create_product, admin::get_product, admin::list_products, admin::add_stock,
        admin::create_customer, admin::get_customer, admin::add_credit,
        sagas::list_sagas, sagas::list_saga_versions, sagas::get_saga, sagas::retry, sagas::compensate,
        sagas::resolve,
        dlq::list_topics, dlq::list_messages, dlq::get_message, dlq::replay, dlq::discard,
    ),
    components(schemas(sagaworks_errors::Problem, sagaworks_errors::FieldError)),
    modifiers(&Security),
    security(("bearerAuth" = [])),
    tags(
        (name = "orders", description = "Customers: their own orders (token `sub` = customer id); admins: all"),
        (name = "admin", description = "Needs the admin role in the token's `roles` claim"),
        (name = "operations", description = "Operating sagas and dead letters (admin role): find stuck sagas, see why, retry, compensate or resolve; inspect, replay or discard dead-lettered messages"),
    )
)]
pub struct ApiDoc;

/// The bearer scheme, and the 401/403/429/503 (and 413) answers every `/v1` operation can give.
struct Security;

/// A problem+json response, optionally with a documented header.
fn problem(description: &str, header: Option<(&str, Type)>) -> Response {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build();
    let mut response =
        ResponseBuilder::new().description(description).content("application/problem+json", content);
    if let Some((name, kind)) = header {
        let header = HeaderBuilder::new().schema(Some(ObjectBuilder::new().schema_type(kind))).build();
        response = response.header(name, header);
    }
    response.build()
}

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearerAuth",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some("HS256 (development secret) or RS256 (JWKS); claims sub, exp, roles"))
                    .build(),
            ),
        );
        let answers = [
            (
                "401",
                problem(
                    "No bearer token, or an invalid or expired one",
                    Some(("WWW-Authenticate", Type::String)),
                ),
            ),
            ("403", problem("The caller may not access this resource", None)),
            (
                "429",
                problem(
                    "Too many requests; retry after Retry-After seconds",
                    Some(("Retry-After", Type::Integer)),
                ),
            ),
            (
                "503",
                problem(
                    "A service, or the token signing keys, unavailable",
                    Some(("Retry-After", Type::Integer)),
                ),
            ),
        ];
        let too_large = problem("Request body too large (api.max_body_bytes)", None);
        for item in openapi.paths.paths.values_mut() {
            let ops = [&mut item.get, &mut item.post, &mut item.put, &mut item.delete, &mut item.patch];
            for op in ops.into_iter().flatten() {
                let responses = &mut op.responses.responses;
                for (code, response) in &answers {
                    responses.entry(code.to_string()).or_insert_with(|| RefOr::T(response.clone()));
                }
                if op.request_body.is_some() {
                    responses.entry("413".into()).or_insert_with(|| RefOr::T(too_large.clone()));
                }
            }
        }
    }
}

/// The `/v1` routes, `/openapi.json` with its explorer at `/docs`, `/asyncapi.json`,
/// and a problem+json fallback.
pub fn router(state: AppState) -> Router {
    let limit = state.settings.max_body_bytes;
    let guarded = Router::new()
        .route("/v1/orders", post(orders::create_order).get(orders::list_orders))
        .route("/v1/orders/{order_id}", get(orders::get_order))
        .route("/v1/sagas/{saga_id}", get(orders::get_saga))
        .route("/v1/products", post(admin::create_product).get(admin::list_products))
        .route("/v1/products/{product_id}", get(admin::get_product))
        .route("/v1/products/{product_id}/stock", post(admin::add_stock))
        .route("/v1/customers", post(admin::create_customer))
        .route("/v1/customers/{customer_id}", get(admin::get_customer))
        .route("/v1/customers/{customer_id}/credit", post(admin::add_credit))
        .route("/v1/admin/sagas", get(sagas::list_sagas))
        .route("/v1/admin/sagas/versions", get(sagas::list_saga_versions))
        .route("/v1/admin/sagas/{saga_id}", get(sagas::get_saga))
        .route("/v1/admin/sagas/{saga_id}/retry", post(sagas::retry))
        .route("/v1/admin/sagas/{saga_id}/compensate", post(sagas::compensate))
        .route("/v1/admin/sagas/{saga_id}/resolve", post(sagas::resolve))
        .route("/v1/admin/dlq", get(dlq::list_topics))
        .route("/v1/admin/dlq/{topic}/messages", get(dlq::list_messages))
        .route("/v1/admin/dlq/{topic}/messages/{id}", get(dlq::get_message))
        .route("/v1/admin/dlq/{topic}/messages/{id}/discard", post(dlq::discard))
        .route("/v1/admin/dlq/{topic}/replay", post(dlq::replay))
        .route_layer(axum::middleware::from_fn_with_state(
            Gate { auth: state.auth.clone(), limiter: state.limiter.clone() },
            crate::auth::guard,
        ));
    Router::new()
        .merge(guarded)
        .merge(inspector::routes())
        // The API explorer (Swagger UI, served from the binary) and the document it reads.
        .merge(SwaggerUi::new("/docs").url("/openapi.json", ApiDoc::openapi()))
        // The events' contract (AsyncAPI 3.0), as committed and validated.
        .route(
            "/asyncapi.json",
            get(|| async { ([(CONTENT_TYPE, "application/json")], asyncapi::COMMITTED) }),
        )
        .fallback(|| async { ApiError::NotFound("no such resource".into()) })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_declares_bearer_auth_and_its_answers_on_every_operation() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        assert_eq!(doc["components"]["securitySchemes"]["bearerAuth"]["scheme"], "bearer");
        assert_eq!(doc["security"][0]["bearerAuth"], serde_json::json!([]));
        let paths = doc["paths"].as_object().unwrap();
        assert_eq!(paths.len(), 20);
        for (path, item) in paths {
            for (method, op) in item.as_object().unwrap() {
                for code in ["401", "403", "429", "503"] {
                    assert!(op["responses"].get(code).is_some(), "{method} {path} lacks {code}");
                }
                let has_body = op.get("requestBody").is_some();
                assert_eq!(op["responses"].get("413").is_some(), has_body, "{method} {path}: 413");
            }
        }
        let replay = &doc["components"]["schemas"]["DlqReplayInput"]["oneOf"];
        assert_eq!(replay.as_array().map(Vec::len), Some(3), "{replay}");
        assert_eq!(replay[2]["properties"]["all"]["enum"], serde_json::json!([true]));
        let r429 = &doc["paths"]["/v1/orders"]["get"]["responses"]["429"];
        assert_eq!(r429["headers"]["Retry-After"]["schema"]["type"], "integer");
        let list = &doc["paths"]["/v1/orders"]["get"]["parameters"][0];
        assert_eq!(
            (&list["name"], &list["in"], &list["required"]),
            (&"customer_id".into(), &"query".into(), &true.into())
        );
        assert_eq!(list["schema"]["format"], "uuid");
    }

    #[test]
    fn the_dead_letter_schema_lists_every_field_of_the_shared_type_and_every_reason() {
        use sagaworks_api::dead_letter::{DeadLetter, DeadLetterAction, OriginalPosition, reason};
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let schema = &doc["components"]["schemas"]["DeadLetter"];
        // Every field set, so that every field is in the JSON the gateway answers.
        let letter = DeadLetter {
            id: "0-1".into(),
            topic: "order".into(),
            dlq_topic: "sagaworks.order.dlq".into(),
            key: Some("k".into()),
            original: Some(OriginalPosition { topic: "sagaworks.order".into(), partition: 0, offset: 7 }),
            group: Some("inventory".into()),
            reason: Some(reason::UNTRUSTED_SOURCE.into()),
            error: "e".into(),
            attempts: 1,
            dead_lettered_at: Some(chrono::Utc::now()),
            event_id: Some("id".into()),
            event_type: Some("OrderPlaced".into()),
            headers: [("ce_id".to_string(), "id".to_string())].into(),
            payload: "{}".into(),
            payload_bytes: 2,
            payload_truncated: false,
            state: "pending".into(),
            actions: vec![DeadLetterAction {
                action: "discard".into(),
                actor: "ops".into(),
                reason: "r".into(),
                at: Some(chrono::Utc::now()),
            }],
        };
        let sent = serde_json::to_value(&letter).unwrap();
        let fields: Vec<&String> = sent.as_object().unwrap().keys().collect();
        let documented: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
        assert_eq!(documented, fields, "{schema}");
        let reasons = schema["properties"]["reason"]["description"].as_str().unwrap_or_default();
        for r in reason::ALL {
            assert!(reasons.contains(&format!("`{r}`")), "reason {r} is not documented: {reasons}");
        }
        let page = &doc["components"]["schemas"]["DeadLetterPage"]["properties"]["messages"]["items"];
        assert_eq!(page["$ref"], "#/components/schemas/DeadLetter");
    }
}
