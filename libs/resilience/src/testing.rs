//! Test helpers: the inner services of the unit tests answer with real `http::Response`s
//! carrying `grpc-status` headers, exactly what a tonic server sends for a unary call.

use crate::BoxError;
use futures::future::BoxFuture;
use http::Request;

pub(crate) type TestFuture = BoxFuture<'static, Result<http::Response<()>, BoxError>>;

/// What a test's inner service looks like.
pub(crate) trait Svc<B>:
    tower::Service<Request<B>, Response = http::Response<()>, Error = BoxError, Future = TestFuture>
    + Clone
    + Send
    + 'static
{
}
impl<B, T> Svc<B> for T where
    T: tower::Service<Request<B>, Response = http::Response<()>, Error = BoxError, Future = TestFuture>
        + Clone
        + Send
        + 'static
{
}

/// A request to `InventoryService/<method>`.
pub(crate) fn path<B: Default>(method: &str) -> Request<B> {
    Request::builder()
        .uri(format!("http://inventory/sagaworks.inventory.v1.InventoryService/{method}"))
        .body(B::default())
        .expect("valid test request")
}

/// A trailers-only style response: `grpc-status` in the headers unless `code` is 0.
pub(crate) fn grpc_response(code: i32) -> http::Response<()> {
    let mut b = http::Response::builder().header("content-type", "application/grpc");
    if code != 0 {
        b = b.header("grpc-status", code.to_string());
    }
    b.body(()).expect("valid test response")
}
