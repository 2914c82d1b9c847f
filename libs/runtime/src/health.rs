//! Liveness, readiness and metrics endpoints.
//!
//! * `GET /health/live`: 200 while the process serves requests at all.
//! * `GET /health/ready`: 200 when every [`Check`] passes, else 503; the body
//!   names each check and its error, so an operator sees *why*.
//! * `GET /metrics`: Prometheus text; [`Readiness::with_gauges`] refreshes
//!   gauges that are cheaper to compute on scrape (outbox backlog) first.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// One readiness dependency.
pub trait Check: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn check(&self) -> BoxFuture<'_, Result<(), String>>;
}

/// Something that updates gauges right before `/metrics` is rendered.
pub trait ScrapeHook: Send + Sync + 'static {
    fn refresh(&self) -> BoxFuture<'_, ()>;
}

/// The database answers `SELECT 1` within a second.
pub struct DbCheck(pub PgPool);

impl Check for DbCheck {
    fn name(&self) -> &str {
        "database"
    }
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(crate::db::ping(&self.0, Duration::from_secs(1)))
    }
}

#[derive(Clone, Default)]
pub struct Readiness {
    checks: Vec<Arc<dyn Check>>,
    hooks: Vec<Arc<dyn ScrapeHook>>,
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_check(mut self, check: impl Check) -> Self {
        self.checks.push(Arc::new(check));
        self
    }

    pub fn with_gauges(mut self, hook: impl ScrapeHook) -> Self {
        self.hooks.push(Arc::new(hook));
        self
    }

    /// Runs every check concurrently; `Ok` when all pass.
    pub async fn evaluate(&self) -> (bool, Map<String, Value>) {
        let results = futures::future::join_all(
            self.checks.iter().map(|c| async move { (c.name().to_string(), c.check().await) }),
        )
        .await;
        let mut ok = true;
        let mut body = Map::new();
        for (name, r) in results {
            match r {
                Ok(()) => {
                    body.insert(name, json!("ok"));
                }
                Err(e) => {
                    ok = false;
                    body.insert(name, json!({ "error": e }));
                }
            }
        }
        (ok, body)
    }

    /// `/health/live`, `/health/ready` and `/metrics`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/health/live", get(|| async { Json(json!({ "status": "live" })) }))
            .route("/health/ready", get(ready))
            .route("/metrics", get(scrape))
            .with_state(Arc::new(self))
    }
}

async fn ready(State(r): State<Arc<Readiness>>) -> impl IntoResponse {
    let (ok, checks) = r.evaluate().await;
    let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let word = if ok { "ready" } else { "not_ready" };
    (status, Json(json!({ "status": word, "checks": checks })))
}

async fn scrape(State(r): State<Arc<Readiness>>) -> impl IntoResponse {
    futures::future::join_all(r.hooks.iter().map(|h| h.refresh())).await;
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], crate::metrics::render())
}
