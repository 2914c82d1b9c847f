//! A small client of the gateway's REST API: what seeding and load need.

use crate::{Tokens, ToolError};
use serde_json::json;
use std::time::Duration;

/// How often an admin call waits out a 429 before giving up.
const MAX_RATE_LIMITED: u32 = 30;

/// A pooled connection unused this long is closed by the client. It stays under the
/// gateway's own idle limit (`server.header_read_timeout_ms`, 10 s by default), so the
/// client does not send a request on a connection the gateway is closing as idle.
pub(crate) const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP client of the tools: `timeout` per request, up to 1024 idle connections
/// kept, each for [`POOL_IDLE_TIMEOUT`].
pub(crate) fn http_client(timeout: Duration) -> Result<reqwest::Client, ToolError> {
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .pool_max_idle_per_host(1024)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build()?)
}

/// The gateway at `base` (e.g. `http://127.0.0.1:8080`), with the bearer
/// tokens to send (admin calls with the admin token, orders with the
/// customer's).
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    tokens: Tokens,
}

/// What `POST /v1/orders` answered.
#[derive(Debug, Clone, PartialEq)]
pub enum PlaceOutcome {
    /// 201 (or 200, a replay): the order exists; `status` is `PENDING`,
    /// `CONFIRMED` or `CANCELLED`.
    Accepted { order_id: String, status: String },
    /// Any other HTTP status (a problem+json answer).
    Rejected { status: u16 },
}

impl Api {
    pub fn new(base: &str, tokens: Tokens, timeout: Duration) -> Result<Self, ToolError> {
        let http = http_client(timeout)?;
        Ok(Self { http, base: base.trim_end_matches('/').to_string(), tokens })
    }

    fn post(&self, path: &str, token: Option<String>) -> reqwest::RequestBuilder {
        let req = self.http.post(format!("{}{path}", self.base));
        match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// An admin `POST`; waits out `429 Too Many Requests` (the gateway rate-limits
    /// per caller) as its `Retry-After` says, up to [`MAX_RATE_LIMITED`] times.
    async fn create(
        &self,
        what: &str,
        path: &str,
        body: serde_json::Value,
        id_field: &str,
    ) -> Result<String, ToolError> {
        let mut attempt = 0;
        let res = loop {
            let res = self.post(path, self.tokens.admin()?).json(&body).send().await?;
            if res.status() != reqwest::StatusCode::TOO_MANY_REQUESTS || attempt == MAX_RATE_LIMITED {
                break res;
            }
            attempt += 1;
            let wait = res
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(wait.clamp(1, 10))).await;
        };
        let status = res.status();
        if !status.is_success() {
            let body = res.text().await.unwrap_or_default();
            return Err(ToolError::Api { what: what.into(), status: status.as_u16(), body });
        }
        let v: serde_json::Value = res.json().await?;
        v.get(id_field).and_then(|id| id.as_str()).map(String::from).ok_or_else(|| ToolError::Api {
            what: what.into(),
            status: status.as_u16(),
            body: format!("no {id_field} in {v}"),
        })
    }

    /// `POST /v1/products`; returns the product id.
    pub async fn create_product(
        &self,
        sku: &str,
        price_cents: i64,
        initial_stock: i64,
    ) -> Result<String, ToolError> {
        let body =
            json!({ "sku": sku, "name": sku, "price_cents": price_cents, "initial_stock": initial_stock });
        self.create("create product", "/v1/products", body, "id").await
    }

    /// `POST /v1/customers`; returns the customer id.
    pub async fn create_customer(&self, name: &str, initial_credit_cents: i64) -> Result<String, ToolError> {
        let body = json!({ "name": name, "initial_credit_cents": initial_credit_cents });
        self.create("create customer", "/v1/customers", body, "customer_id").await
    }

    /// `POST /v1/orders` as `customer_id`, with an `Idempotency-Key`.
    /// Transport failures (connection refused, timeout) are the `Err`.
    pub async fn place_order(
        &self,
        customer_id: &str,
        items: &[(String, i64)],
        idempotency_key: &str,
    ) -> Result<PlaceOutcome, ToolError> {
        let res = self
            .post("/v1/orders", self.tokens.customer(customer_id)?)
            .header("idempotency-key", idempotency_key)
            .json(&order_body(customer_id, items))
            .send()
            .await?;
        let status = res.status().as_u16();
        let body = res.bytes().await?;
        gateway_outcome(status, &body)
    }
}

/// The answer of a target that is not an order (a body that does not parse).
pub(crate) fn not_an_order(target: &str, status: u16, e: &serde_json::Error) -> ToolError {
    ToolError::Answer(format!("{target} answered {status} with a body that is not an order: {e}"))
}

/// An accepted order as the gateway and the Restate peer answer it.
#[derive(serde::Deserialize)]
pub(crate) struct OrderBody {
    pub(crate) order_id: String,
    pub(crate) status: String,
}

/// What the gateway's answer to `POST /v1/orders` means: `201`/`200` with the order is
/// accepted; any other status is a rejection.
pub fn gateway_outcome(status: u16, body: &[u8]) -> Result<PlaceOutcome, ToolError> {
    if status != 200 && status != 201 {
        return Ok(PlaceOutcome::Rejected { status });
    }
    let order: OrderBody =
        serde_json::from_slice(body).map_err(|e| not_an_order("the gateway", status, &e))?;
    Ok(PlaceOutcome::Accepted { order_id: order.order_id, status: order.status })
}

/// The body of `POST /v1/orders` (the Restate peer takes the same one).
pub fn order_body(customer_id: &str, items: &[(String, i64)]) -> serde_json::Value {
    let items: Vec<_> = items.iter().map(|(p, q)| json!({ "product_id": p, "quantity": q })).collect();
    json!({ "customer_id": customer_id, "items": items })
}
