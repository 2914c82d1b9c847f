//! Buffers the request body so that the retry can send it again.
//!
//! tonic's `Body` is a one-shot stream. The outermost layer collects it into `Bytes`
//! (a unary request is one small message), the layers below work on
//! `http::Request<Bytes>`, which is cheap to clone, and [`to_tonic_body`] turns each
//! attempt back into a `tonic::body::Body` right above the transport. Client-streaming
//! calls would be buffered whole before the first byte is sent, so this stack is for unary
//! calls (every cross-service call in sagaworks is unary).

use crate::BoxError;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::Request;
use http_body_util::BodyExt;
use std::task::{Context, Poll};
use tower::ServiceExt;

#[derive(Debug, Clone, Default)]
pub(crate) struct BufferBodyLayer;

impl<S> tower::Layer<S> for BufferBodyLayer {
    type Service = BufferBody<S>;
    fn layer(&self, inner: S) -> BufferBody<S> {
        BufferBody { inner }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct BufferBody<S> {
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for BufferBody<S>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    S: tower::Service<Request<Bytes>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    /// Always ready: the inner service is readied inside the call, after buffering.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
            inner.oneshot(Request::from_parts(parts, bytes)).await
        })
    }
}

/// One attempt's request as tonic's transport wants it.
pub(crate) fn to_tonic_body(req: Request<Bytes>) -> Request<tonic::body::Body> {
    req.map(|bytes| tonic::body::Body::new(http_body_util::Full::new(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{TestFuture, grpc_response};
    use tower::Layer;

    #[tokio::test]
    async fn the_inner_service_gets_the_whole_body_and_the_head() {
        let inner = tower::service_fn(|req: Request<Bytes>| -> TestFuture {
            assert_eq!(req.uri().path(), "/svc/Method");
            assert_eq!(req.headers()["x-key"], "k1");
            let mut resp = grpc_response(0);
            resp.headers_mut().insert("x-body-len", req.body().len().into());
            Box::pin(async move { Ok(resp) })
        });
        let frames = futures::stream::iter([
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from_static(b"abc"))),
            Ok(http_body::Frame::data(Bytes::from_static(b"de"))),
        ]);
        let req = Request::builder()
            .uri("http://x/svc/Method")
            .header("x-key", "k1")
            .body(http_body_util::StreamBody::new(frames))
            .unwrap();
        let resp = BufferBodyLayer.layer(inner).oneshot(req).await.unwrap();
        assert_eq!(resp.headers()["x-body-len"], "5");
    }
}
