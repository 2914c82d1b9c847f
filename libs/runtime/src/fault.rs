//! Fault injection: make this service slow or failing at run time, for tests and chaos
//! drills. **Off by default and must stay off in production**: anyone who can reach the
//! HTTP port could then slow down or fail every call.
//!
//! With `[fault] enabled = true` (`APP_FAULT__ENABLED=true`) a [`ServiceHost`] puts a
//! [`FaultLayer`] in front of its gRPC routes and serves, on its HTTP port:
//!
//! * `PUT /fault` with a [`Fault`], e.g.
//!   `{"delay_ms": 800, "error": "unavailable", "error_rate": 1.0, "methods": ["ReserveStock"]}`
//!   or `{"hold": true, "methods": ["GetStock"]}`: from now on, matching calls are delayed,
//!   held and/or failed; answers the active fault. It replaces the fault before, which
//!   releases the calls that one held.
//! * `GET /fault`: the active fault (`null` when none).
//! * `DELETE /fault`: back to normal (204); releases the held calls.
//!
//! When disabled these routes don't exist (404) and no layer is added.
//!
//! What a matching call sees:
//!
//! * `delay_ms` only: the call runs as usual and its answer is held back `delay_ms`
//!   (the work is done, the answer is late: a caller that times out may still have had
//!   its effect, exactly the case a saga must compensate).
//! * `hold: true` (instead of `delay_ms`): like a delay that ends only when the fault is
//!   cleared or replaced (or after 10 minutes, so a forgotten hold cannot keep a call for
//!   ever). Tests use it to synchronise on events instead of on the clock: while the test
//!   holds a call, it *knows* the call has not been answered, so anything that answers
//!   meanwhile (a caller's timeout, a bulkhead shedding the calls beyond its limit, a
//!   health probe) did so without waiting for it. A service stopping gracefully waits for
//!   its held calls: clear the fault first.
//! * `error`: the call is **not** run; after `delay_ms` (or, with `hold`, once released)
//!   it is answered with that gRPC code (a trailers-only response, as a real server
//!   answers a failed unary call). `error_rate` (0..=1, default 1) is the share of
//!   matching calls that fail; it is deterministic (of every `n` matching calls,
//!   `round(n * rate)` fail, evenly spread), so tests can count on it. The others are
//!   only delayed (or held).
//! * `max_calls`: only the first `max_calls` matching calls since the fault was set are
//!   touched; later ones pass untouched (e.g. hold a call's first attempt, let its retry
//!   through).
//!
//! `methods` names gRPC methods (`ReserveStock`, ignoring ASCII case) or full paths
//! (`/sagaworks.inventory.v1.InventoryService/ReserveStock`); empty means every call.
//! Each injected fault is counted in `faults_injected_total{method,kind}` (`delay`, `hold`,
//! `error`), the calls held right now in the gauge `faults_held_calls{method}`, and every
//! change of the fault is logged with `warn!`.
//!
//! [`ServiceHost`]: crate::host::ServiceHost

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use axum::{Json, Router};
use futures::future::BoxFuture;
use sagaworks_errors::Problem;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// `[fault]` section of a service's settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct FaultSettings {
    /// Serve `/fault` and put the fault layer on the gRPC server. Never in production.
    pub enabled: bool,
}

/// The gRPC code a failing call is answered with.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FaultError {
    Unavailable,
    Internal,
    Unknown,
    DeadlineExceeded,
    ResourceExhausted,
    Aborted,
}

impl FaultError {
    fn code(self) -> tonic::Code {
        match self {
            FaultError::Unavailable => tonic::Code::Unavailable,
            FaultError::Internal => tonic::Code::Internal,
            FaultError::Unknown => tonic::Code::Unknown,
            FaultError::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            FaultError::ResourceExhausted => tonic::Code::ResourceExhausted,
            FaultError::Aborted => tonic::Code::Aborted,
        }
    }
}

/// What to do to matching calls (the body of `PUT /fault`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// Hold each matching call (its answer, or its error) back this long.
    #[serde(default)]
    pub delay_ms: u64,
    /// Hold each matching call (its answer, or its error) back until this fault is
    /// cleared or replaced, instead of `delay_ms`.
    #[serde(default)]
    pub hold: bool,
    /// Fail matching calls with this code instead of running them.
    #[serde(default)]
    pub error: Option<FaultError>,
    /// Share of matching calls that fail (0..=1).
    #[serde(default = "always")]
    pub error_rate: f64,
    /// Method names or full paths; empty: every call.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Touch only the first this many matching calls; `None`: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
}

fn always() -> f64 {
    1.0
}

/// The longest delay a fault may ask for, and the longest a call is held.
const MAX_DELAY_MS: u64 = 600_000;

impl Fault {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err(("error_rate", format!("must be between 0 and 1, got {}", self.error_rate)));
        }
        if self.delay_ms > MAX_DELAY_MS {
            return Err(("delay_ms", format!("must be at most {MAX_DELAY_MS}")));
        }
        if self.hold && self.delay_ms > 0 {
            return Err(("delay_ms", "must be 0 with hold (a held call waits until released)".into()));
        }
        if self.max_calls == Some(0) {
            return Err(("max_calls", "must be at least 1 (or left out: every call)".into()));
        }
        if self.methods.iter().any(|m| m.trim().is_empty()) {
            return Err(("methods", "must not contain empty names".into()));
        }
        Ok(())
    }

    fn matches(&self, path: &str) -> bool {
        let method = path.rsplit('/').next().unwrap_or(path);
        self.methods.is_empty() || self.methods.iter().any(|m| m == path || m.eq_ignore_ascii_case(method))
    }
}

#[derive(Debug)]
struct Active {
    fault: Fault,
    /// Matching calls seen since the fault was set (drives the error rate and `max_calls`).
    seen: u64,
    /// Cancelled when this fault is cleared or replaced: releases the calls it holds.
    release: CancellationToken,
}

impl Drop for Active {
    fn drop(&mut self) {
        self.release.cancel();
    }
}

/// Holds the active fault of one service; clones share it.
#[derive(Debug, Clone, Default)]
pub struct FaultInjector {
    active: Arc<Mutex<Option<Active>>>,
}

/// What the layer does to one call.
#[derive(Debug, Clone)]
enum Action {
    Pass,
    Delay(Wait),
    Fail(Wait, tonic::Code),
}

/// How long a touched call's answer is held back.
#[derive(Debug, Clone)]
enum Wait {
    For(Duration),
    /// Until the token is cancelled (the fault is cleared or replaced), at most [`MAX_DELAY_MS`].
    Hold(CancellationToken),
}

impl Wait {
    fn kind(&self) -> &'static str {
        match self {
            Wait::For(_) => "delay",
            Wait::Hold(_) => "hold",
        }
    }

    /// Waits; a held call counts in `faults_held_calls{method}` meanwhile (also when
    /// the caller gives up first and the call is dropped).
    async fn wait(self, method: String) {
        match self {
            Wait::For(delay) => tokio::time::sleep(delay).await,
            Wait::Hold(release) => {
                let _held = Held::new(method);
                tokio::select! {
                    _ = release.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(MAX_DELAY_MS)) => {}
                }
            }
        }
    }
}

/// One call in `faults_held_calls`, from creation to drop.
struct Held(String);

impl Held {
    fn new(method: String) -> Self {
        metrics::gauge!("faults_held_calls", "method" => method.clone()).increment(1.0);
        Self(method)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        metrics::gauge!("faults_held_calls", "method" => std::mem::take(&mut self.0)).decrement(1.0);
    }
}

impl FaultInjector {
    /// An injector with no fault set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the active fault (after [`Fault::validate`]); the calls the fault before
    /// held are released.
    pub fn set(&self, fault: Fault) {
        tracing::warn!(?fault, "fault injection: fault set");
        *self.lock() = Some(Active { fault, seen: 0, release: CancellationToken::new() });
    }

    /// Removes the active fault and releases the calls it held.
    pub fn clear(&self) {
        if self.lock().take().is_some() {
            tracing::warn!("fault injection: fault cleared");
        }
    }

    /// The active fault, if any.
    pub fn current(&self) -> Option<Fault> {
        self.lock().as_ref().map(|a| a.fault.clone())
    }

    /// The layer for the gRPC routes.
    pub fn layer(&self) -> FaultLayer {
        FaultLayer { injector: self.clone() }
    }

    /// `PUT|GET|DELETE /fault`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/fault", put(put_fault).get(get_fault).delete(delete_fault))
            .with_state(self.clone())
    }

    fn action(&self, path: &str) -> Action {
        let mut guard = self.lock();
        let Some(active) = guard.as_mut().filter(|a| a.fault.matches(path)) else {
            return Action::Pass;
        };
        let fault = &active.fault;
        let n = active.seen;
        active.seen += 1;
        if fault.max_calls.is_some_and(|max| n >= max) {
            return Action::Pass;
        }
        let wait = if fault.hold {
            Wait::Hold(active.release.clone())
        } else {
            Wait::For(Duration::from_millis(fault.delay_ms))
        };
        // Call n fails when it takes the count of failures up to round((n + 1) * rate).
        let fails = |k: u64| (k as f64 * fault.error_rate).round() as u64;
        match fault.error {
            Some(error) if fails(n + 1) > fails(n) => Action::Fail(wait, error.code()),
            _ if matches!(wait, Wait::For(delay) if delay.is_zero()) => Action::Pass,
            _ => Action::Delay(wait),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Active>> {
        // Every write leaves the state whole, so a poisoned lock is still usable.
        self.active.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

async fn put_fault(State(injector): State<FaultInjector>, body: Bytes) -> Response {
    let fault: Fault = match serde_json::from_slice(&body) {
        Ok(fault) => fault,
        Err(e) => return Problem::bad_request(format!("invalid fault: {e}")).into_response(),
    };
    if let Err((field, message)) = fault.validate() {
        return Problem::validation(field, message).into_response();
    }
    injector.set(fault.clone());
    Json(fault).into_response()
}

async fn get_fault(State(injector): State<FaultInjector>) -> Json<Option<Fault>> {
    Json(injector.current())
}

async fn delete_fault(State(injector): State<FaultInjector>) -> StatusCode {
    injector.clear();
    StatusCode::NO_CONTENT
}

/// Applies the active fault of a [`FaultInjector`] to gRPC calls.
#[derive(Debug, Clone)]
pub struct FaultLayer {
    injector: FaultInjector,
}

impl<S> tower::Layer<S> for FaultLayer {
    type Service = FaultService<S>;
    fn layer(&self, inner: S) -> FaultService<S> {
        FaultService { inner, injector: self.injector.clone() }
    }
}

#[derive(Debug, Clone)]
pub struct FaultService<S> {
    inner: S,
    injector: FaultInjector,
}

impl<S, B, RB> tower::Service<http::Request<B>> for FaultService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<http::Response<RB>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path().to_owned();
        let action = self.injector.action(&path);
        let method = path.rsplit('/').next().unwrap_or_default().to_owned();
        match action {
            Action::Pass => Box::pin(self.inner.call(req)),
            Action::Delay(wait) => {
                metrics::counter!("faults_injected_total", "method" => method.clone(), "kind" => wait.kind())
                    .increment(1);
                let fut = self.inner.call(req);
                Box::pin(async move {
                    let result = fut.await;
                    wait.wait(method).await;
                    result
                })
            }
            Action::Fail(wait, code) => {
                metrics::counter!("faults_injected_total", "method" => method.clone(), "kind" => "error")
                    .increment(1);
                Box::pin(async move {
                    wait.wait(method).await;
                    Ok(tonic::Status::new(code, "injected fault").into_http())
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Layer, ServiceExt};

    const RESERVE: &str = "/sagaworks.inventory.v1.InventoryService/ReserveStock";
    const GET_STOCK: &str = "/sagaworks.inventory.v1.InventoryService/GetStock";

    fn fault(json: serde_json::Value) -> Fault {
        serde_json::from_value(json).unwrap()
    }

    type Inner = tower::util::BoxCloneSyncService<http::Request<()>, http::Response<String>, Infallible>;

    /// A layered inner service that counts the calls it ran and answers OK.
    fn service(injector: &FaultInjector) -> (Arc<AtomicUsize>, FaultService<Inner>) {
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        let inner = tower::service_fn(move |_req: http::Request<()>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(http::Response::new("ran".to_owned())) }
        });
        (ran, injector.layer().layer(Inner::new(inner)))
    }

    fn request(path: &str) -> http::Request<()> {
        http::Request::builder().uri(format!("http://inventory{path}")).body(()).unwrap()
    }

    fn grpc_status(resp: &http::Response<String>) -> Option<&str> {
        resp.headers().get("grpc-status").map(|v| v.to_str().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_fault_calls_pass_untouched() {
        let injector = FaultInjector::new();
        let (ran, svc) = service(&injector);
        let started = tokio::time::Instant::now();
        let resp = svc.oneshot(request(RESERVE)).await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(resp.body(), "ran");
        assert_eq!(grpc_status(&resp), None);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_fault_answers_the_code_trailers_only_after_the_delay_without_running_the_call() {
        let injector = FaultInjector::new();
        injector.set(fault(
            serde_json::json!({ "delay_ms": 800, "error": "unavailable", "methods": ["reservestock"] }),
        ));
        let (ran, svc) = service(&injector);
        let started = tokio::time::Instant::now();
        let resp = svc.clone().oneshot(request(RESERVE)).await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(800));
        assert_eq!(grpc_status(&resp), Some("14"));
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the failed call did not run");
        let status = tonic::Status::from_header_map(resp.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable);

        let started = tokio::time::Instant::now();
        let other = svc.oneshot(request(GET_STOCK)).await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO, "other methods are not touched");
        assert_eq!(grpc_status(&other), None);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delay_fault_runs_the_call_and_holds_back_its_answer() {
        let injector = FaultInjector::new();
        injector.set(fault(serde_json::json!({ "delay_ms": 300, "methods": [GET_STOCK] })));
        let (ran, svc) = service(&injector);
        let call = tokio::spawn(svc.oneshot(request(GET_STOCK)));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the work is done at once");
        assert!(!call.is_finished(), "the answer is held back");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let resp = call.await.unwrap().unwrap();
        assert_eq!(resp.body(), "ran");
    }

    #[tokio::test(start_paused = true)]
    async fn the_error_rate_fails_that_share_of_matching_calls_evenly() {
        let injector = FaultInjector::new();
        injector.set(fault(serde_json::json!({ "error": "internal", "error_rate": 0.25 })));
        let (ran, svc) = service(&injector);
        let mut failed = vec![];
        for _ in 0..8 {
            let resp = svc.clone().oneshot(request(GET_STOCK)).await.unwrap();
            failed.push(grpc_status(&resp) == Some("13"));
        }
        // round(n / 4) failures after n calls: calls 2 and 6 fail.
        assert_eq!(failed, [false, true, false, false, false, true, false, false]);
        assert_eq!(ran.load(Ordering::SeqCst), 6);

        injector.clear();
        assert_eq!(injector.current(), None);
        let resp = svc.oneshot(request(GET_STOCK)).await.unwrap();
        assert_eq!(grpc_status(&resp), None, "cleared");
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_call_runs_and_its_answer_waits_until_the_fault_is_cleared() {
        let injector = FaultInjector::new();
        injector.set(fault(serde_json::json!({ "hold": true, "methods": ["GetStock"] })));
        let (ran, svc) = service(&injector);
        let started = tokio::time::Instant::now();
        let call = tokio::spawn(svc.oneshot(request(GET_STOCK)));
        // Paused time: this sleep only returns once every task is idle, the held one included.
        tokio::time::sleep(Duration::from_secs(540)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the work is done at once");
        assert!(!call.is_finished(), "the answer is held, 9 minutes on");

        injector.clear();
        let resp = call.await.unwrap().unwrap();
        assert_eq!(resp.body(), "ran");
        // Not a second later: the clear released it, not the 10 minute cap.
        assert_eq!(started.elapsed(), Duration::from_secs(540));
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_error_is_answered_when_the_fault_is_replaced_without_running_the_call() {
        let injector = FaultInjector::new();
        injector.set(fault(serde_json::json!({ "hold": true, "error": "unavailable" })));
        let (ran, svc) = service(&injector);
        let started = tokio::time::Instant::now();
        let call = tokio::spawn(svc.oneshot(request(RESERVE)));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!call.is_finished(), "held");

        // Any new fault ends the old one, and with it its holds.
        injector.set(fault(serde_json::json!({ "delay_ms": 5, "methods": ["Other"] })));
        let resp = call.await.unwrap().unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        assert_eq!(grpc_status(&resp), Some("14"));
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the failed call did not run");
    }

    #[tokio::test(start_paused = true)]
    async fn max_calls_touches_only_the_first_matching_calls() {
        let injector = FaultInjector::new();
        injector.set(fault(serde_json::json!({ "hold": true, "max_calls": 1, "methods": ["GetStock"] })));
        let (ran, svc) = service(&injector);
        let first = tokio::spawn(svc.clone().oneshot(request(GET_STOCK)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!first.is_finished(), "the first call is held");

        let started = tokio::time::Instant::now();
        let second = svc.oneshot(request(GET_STOCK)).await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO, "the second passes untouched");
        assert_eq!(second.body(), "ran");
        assert!(!first.is_finished(), "still held");

        injector.clear();
        assert_eq!(first.await.unwrap().unwrap().body(), "ran");
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn invalid_faults_name_their_field() {
        let bad = fault(serde_json::json!({ "error": "unavailable", "error_rate": 1.5 }));
        assert_eq!(bad.validate().unwrap_err().0, "error_rate");
        let bad = fault(serde_json::json!({ "delay_ms": MAX_DELAY_MS + 1 }));
        assert_eq!(bad.validate().unwrap_err().0, "delay_ms");
        let bad = fault(serde_json::json!({ "methods": [" "] }));
        assert_eq!(bad.validate().unwrap_err().0, "methods");
        let bad = fault(serde_json::json!({ "hold": true, "delay_ms": 100 }));
        assert_eq!(bad.validate().unwrap_err().0, "delay_ms", "a held call waits for its release only");
        let bad = fault(serde_json::json!({ "hold": true, "max_calls": 0 }));
        assert_eq!(bad.validate().unwrap_err().0, "max_calls");
        assert_eq!(fault(serde_json::json!({ "hold": true, "max_calls": 1 })).validate(), Ok(()));
        assert!(serde_json::from_value::<Fault>(serde_json::json!({ "delay": 5 })).is_err(), "unknown field");
        assert!(
            serde_json::from_value::<Fault>(serde_json::json!({ "error": "oops" })).is_err(),
            "unknown code"
        );
    }

    #[tokio::test]
    async fn the_http_api_sets_reads_and_clears_the_fault() {
        let injector = FaultInjector::new();
        let router = injector.router();
        let send = |method: &str, body: &str| {
            axum::http::Request::builder()
                .method(method)
                .uri("/fault")
                .header("content-type", "application/json")
                .body(axum::body::Body::from(body.to_owned()))
                .unwrap()
        };
        let body =
            r#"{"delay_ms": 800, "error": "unavailable", "error_rate": 1.0, "methods": ["ReserveStock"]}"#;
        let resp = router.clone().oneshot(send("PUT", body)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let active = injector.current().expect("set");
        assert_eq!((active.delay_ms, active.error), (800, Some(FaultError::Unavailable)));

        let resp = router.clone().oneshot(send("PUT", r#"{"error_rate": 2}"#)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let resp = router.clone().oneshot(send("PUT", "{")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(injector.current(), Some(active), "a rejected fault changes nothing");

        let resp = router.oneshot(send("DELETE", "")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
        assert_eq!(injector.current(), None);
    }
}
