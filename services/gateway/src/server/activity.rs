//! Whether a connection is serving anything: [`Activity`] counts its requests in flight,
//! from the moment a complete request head reaches the router until the response's body
//! has been sent or dropped, and [`Activity::idle_for`] waits until none has been in
//! flight for a given time.
//!
//! This is how the server bounds an HTTP/2 connection that holds a slot without asking
//! for anything: one that only sent the preface, or a HEADERS frame whose header block it
//! never completes (hyper hands a request to the router only once its head is whole).

use axum::body::Body;
use axum::http::{Request, Response};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Notify;

/// The requests in flight on one connection.
#[derive(Debug, Clone, Default)]
pub struct Activity(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    in_flight: AtomicUsize,
    changed: Notify,
}

impl Activity {
    /// Counts a request in flight until the returned guard is dropped.
    pub fn begin(&self) -> Busy {
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
        Busy(self.clone())
    }

    /// Resolves once no request has been in flight for `limit` in a row.
    pub async fn idle_for(&self, limit: Duration) {
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.0.in_flight.load(Ordering::SeqCst) > 0 {
                changed.await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(limit) => {
                    if self.0.in_flight.load(Ordering::SeqCst) == 0 {
                        return;
                    }
                }
                () = changed => {}
            }
        }
    }
}

/// One request in flight (see [`Activity::begin`]).
#[derive(Debug)]
pub struct Busy(Activity);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.0.changed.notify_waiters();
    }
}

/// A service whose requests count on an [`Activity`] until their response body is done.
#[derive(Debug, Clone)]
pub struct Tracked<S> {
    inner: S,
    activity: Activity,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, activity: Activity) -> Self {
        Self { inner, activity }
    }
}

impl<S, B> tower::Service<Request<B>> for Tracked<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let busy = self.activity.begin();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Body::new(Guarded { body, _busy: busy })))
        })
    }
}

/// A response body that keeps its request counted while it is being sent.
struct Guarded {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn idle_time_counts_from_the_end_of_the_last_request() {
        let activity = Activity::default();
        let started = Instant::now();
        activity.idle_for(Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5), "idle from the start");

        let busy = activity.begin();
        let waiting = tokio::spawn({
            let activity = activity.clone();
            async move { activity.idle_for(Duration::from_secs(5)).await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "a request in flight is no idleness");
        let ended = Instant::now();
        drop(busy);
        waiting.await.unwrap();
        assert_eq!(ended.elapsed(), Duration::from_secs(5));
    }
}
