//! Liveness, readiness and metrics endpoints.
//!
//! * `GET /health/live`: 200 while the process serves requests at all.
//! * `GET /health/ready`: 200 when every critical [`Check`] passes, else 503;
//!   the body names each check and its error, so an operator sees *why*. A
//!   failing non-critical check ([`Readiness::with_non_critical`], e.g. the
//!   broker: events wait in the outbox, requests are still served) makes the
//!   status `degraded`, still 200, so the instance stays in its load balancer.
//!   Every evaluation sets the gauge `health_check_up{check}` (1 or 0).
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
pub(crate) struct DbCheck(pub PgPool);

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
    /// With whether the check is critical.
    checks: Vec<(Arc<dyn Check>, bool)>,
    hooks: Vec<Arc<dyn ScrapeHook>>,
}

/// Gauge: 1 when a readiness check passed at its last evaluation, else 0.
pub(crate) const HEALTH_CHECK_UP: &str = "health_check_up";

/// What the checks said.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// Every critical check passed.
    pub ready: bool,
    /// A non-critical check failed.
    pub degraded: bool,
    /// Each check: `"ok"` or `{"error": ..}` (plus `"critical": false` for a
    /// non-critical one).
    pub checks: Map<String, Value>,
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    /// A dependency without which the service cannot serve: failing, it takes
    /// the instance out of its load balancer (503).
    pub fn with_check(mut self, check: impl Check) -> Self {
        self.checks.push((Arc::new(check), true));
        self
    }

    /// A dependency the service degrades without (reported, 200 `degraded`).
    pub fn with_non_critical(mut self, check: impl Check) -> Self {
        self.checks.push((Arc::new(check), false));
        self
    }

    pub fn with_gauges(mut self, hook: impl ScrapeHook) -> Self {
        self.hooks.push(Arc::new(hook));
        self
    }

    /// Runs every check concurrently.
    pub async fn evaluate(&self) -> Evaluation {
        let results = futures::future::join_all(
            self.checks
                .iter()
                .map(|(c, critical)| async move { (c.name().to_string(), *critical, c.check().await) }),
        )
        .await;
        let mut evaluation = Evaluation { ready: true, degraded: false, checks: Map::new() };
        for (name, critical, r) in results {
            metrics::gauge!(HEALTH_CHECK_UP, "check" => name.clone()).set(if r.is_ok() { 1.0 } else { 0.0 });
            let entry = match r {
                Ok(()) => json!("ok"),
                Err(e) if critical => {
                    evaluation.ready = false;
                    json!({ "error": e })
                }
                Err(e) => {
                    evaluation.degraded = true;
                    json!({ "error": e, "critical": false })
                }
            };
            evaluation.checks.insert(name, entry);
        }
        evaluation
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
    let e = r.evaluate().await;
    let (status, word) = match (e.ready, e.degraded) {
        (false, _) => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
        (true, true) => (StatusCode::OK, "degraded"),
        (true, false) => (StatusCode::OK, "ready"),
    };
    (status, Json(json!({ "status": word, "checks": e.checks })))
}

async fn scrape(State(r): State<Arc<Readiness>>) -> impl IntoResponse {
    futures::future::join_all(r.hooks.iter().map(|h| h.refresh())).await;
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], crate::metrics::render())
}
