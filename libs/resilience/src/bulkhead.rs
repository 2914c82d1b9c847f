//! Bulkhead: at most `max_concurrent_calls` calls in flight to one downstream; the next
//! one is rejected at once with `RESOURCE_EXHAUSTED` marked `bulkhead_full`.
//!
//! The limit is a semaphore shared by every clone of the channel. A permit is taken in
//! `call` (never in `poll_ready`, so a caller that readies a clone and then drops it
//! holds nothing) and held until the call's response future finishes, retries and
//! backoff included: the bulkhead bounds the work this client puts on the downstream.

use crate::BoxError;
use crate::rejection::{Rejection, reject};
use futures::future::BoxFuture;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::Semaphore;

#[derive(Debug, Clone)]
pub(crate) struct BulkheadLayer {
    downstream: &'static str,
    permits: Arc<Semaphore>,
}

impl BulkheadLayer {
    pub(crate) fn new(downstream: &'static str, max_concurrent_calls: usize) -> Self {
        Self { downstream, permits: Arc::new(Semaphore::new(max_concurrent_calls)) }
    }
}

impl<S> tower::Layer<S> for BulkheadLayer {
    type Service = Bulkhead<S>;
    fn layer(&self, inner: S) -> Bulkhead<S> {
        Bulkhead { inner, layer: self.clone() }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Bulkhead<S> {
    inner: S,
    layer: BulkheadLayer,
}

impl<S, Req> tower::Service<Req> for Bulkhead<S>
where
    S: tower::Service<Req, Error = BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match Arc::clone(&self.layer.permits).try_acquire_owned() {
            Ok(permit) => {
                let fut = self.inner.call(req);
                Box::pin(async move {
                    let result = fut.await;
                    drop(permit);
                    result
                })
            }
            Err(_) => {
                let err = reject(self.layer.downstream, Rejection::BulkheadFull);
                Box::pin(std::future::ready(Err(err)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{TestFuture, grpc_response, path};
    use std::time::Duration;
    use tokio::sync::oneshot;
    use tower::{Layer, ServiceExt};

    #[tokio::test(start_paused = true)]
    async fn rejects_the_call_beyond_the_limit_at_once_and_admits_again_after_one_finishes() {
        // Each inner call hands the test a sender and blocks until the test uses it.
        let (release_tx, mut releases) = tokio::sync::mpsc::unbounded_channel::<oneshot::Sender<()>>();
        let inner = tower::service_fn(move |_req: http::Request<()>| -> TestFuture {
            let (tx, rx) = oneshot::channel();
            let sent = release_tx.send(tx);
            Box::pin(async move {
                sent.map_err(|_| "test dropped the receiver")?;
                let _ = rx.await;
                Ok(grpc_response(0))
            })
        });
        let svc = BulkheadLayer::new("inventory", 2).layer(inner);
        let first = tokio::spawn(svc.clone().oneshot(path("GetStock")));
        let second = tokio::spawn(svc.clone().oneshot(path("GetStock")));
        let release_first = releases.recv().await.unwrap();
        let release_second = releases.recv().await.unwrap();

        let started = tokio::time::Instant::now();
        let err = svc.clone().oneshot(path("GetStock")).await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::ZERO, "rejected without waiting");
        let status = err.downcast::<tonic::Status>().unwrap();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(crate::rejection(&status), Some(Rejection::BulkheadFull));

        release_first.send(()).unwrap();
        assert!(first.await.unwrap().is_ok());
        let third = tokio::spawn(svc.clone().oneshot(path("GetStock")));
        let release_third = tokio::time::timeout(Duration::from_secs(1), releases.recv())
            .await
            .expect("the third call reached the inner service")
            .unwrap();
        release_second.send(()).unwrap();
        release_third.send(()).unwrap();
        assert!(second.await.unwrap().is_ok());
        assert!(third.await.unwrap().is_ok(), "admitted once a slot was free");
    }
}
