//! The injector behind `/fault` and its tower layer (the cargo feature `test-hooks`).

use super::request::{Fault, MAX_DELAY_MS};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use axum::{Json, Router};
use futures::future::BoxFuture;
use sagaworks_errors::Problem;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

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
pub(crate) struct FaultInjector {
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
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Replaces the active fault (after [`Fault::validate`]); the calls the fault before
    /// held are released.
    pub(crate) fn set(&self, fault: Fault) {
        tracing::warn!(?fault, "fault injection: fault set");
        *self.lock() = Some(Active { fault, seen: 0, release: CancellationToken::new() });
    }

    /// Removes the active fault and releases the calls it held.
    pub(crate) fn clear(&self) {
        if self.lock().take().is_some() {
            tracing::warn!("fault injection: fault cleared");
        }
    }

    /// The active fault, if any.
    pub(crate) fn current(&self) -> Option<Fault> {
        self.lock().as_ref().map(|a| a.fault.clone())
    }

    /// The layer for the gRPC routes.
    pub(crate) fn layer(&self) -> FaultLayer {
        FaultLayer { injector: self.clone() }
    }

    /// `PUT|GET|DELETE /fault`.
    pub(crate) fn router(&self) -> Router {
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
pub(crate) struct FaultLayer {
    injector: FaultInjector,
}

impl<S> tower::Layer<S> for FaultLayer {
    type Service = FaultService<S>;
    fn layer(&self, inner: S) -> FaultService<S> {
        FaultService { inner, injector: self.injector.clone() }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct FaultService<S> {
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
    use crate::fault::request::FaultError;
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
