//! "Was it sent?": whether any attempt of a call may have reached the downstream.
//!
//! A caller that compensates (the saga) must know whether a failed call may have had an
//! effect. The stack knows it per call:
//!
//! * **certainly not sent**: every attempt was rejected by the breaker, or the bulkhead
//!   shed the call, or the attempt failed to connect (`tonic::ConnectError` in the error
//!   chain: TCP connect refused, connect timeout, TLS handshake; or an `std::io::Error`
//!   of kind `ConnectionRefused` from a custom transport);
//! * **may have been sent** otherwise: a timeout after the request may have been
//!   written, a reset or broken connection, any gRPC status the downstream answered.
//!
//! [`AttemptLayer`] sits right above the per-attempt timeout and flags the call as "maybe
//! sent" on the first attempt that was not a connect failure; the flag lives in the
//! request's extensions, which every retried attempt shares. The channel then marks the
//! call's failure with [`SENT_METADATA`] (`no` or `maybe`) via [`mark`], turning a plain
//! transport error into the `tonic::Status` tonic would have made of it (a connect
//! failure becomes `UNAVAILABLE`). [`never_sent`] reads the mark; an unmarked status
//! counts as "maybe", the safe side.

use crate::BoxError;
use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use tonic::metadata::MetadataValue;

/// Metadata key on every error status the stack returns: `no` when no attempt of the
/// call can have reached the downstream, `maybe` otherwise.
pub const SENT_METADATA: &str = "x-sagaworks-sent";

/// `true` when `status` came out of a resilient channel and no attempt of its call can
/// have reached the downstream, so the call certainly had no effect there.
pub fn never_sent(status: &tonic::Status) -> bool {
    status.metadata().get(SENT_METADATA).is_some_and(|v| v.as_bytes() == b"no")
}

/// Shared by all attempts of one call (cloned with the request's extensions).
#[derive(Debug, Clone, Default)]
pub(crate) struct MaybeSent(Arc<AtomicBool>);

impl MaybeSent {
    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// `true` when the error says the attempt never got a connection, so nothing was sent.
pub(crate) fn is_connect_failure(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<tonic::ConnectError>() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Whether one attempt's result means it may have reached the downstream.
fn attempt_may_have_been_sent<B>(result: &Result<Response<B>, BoxError>) -> bool {
    match result {
        Ok(_) => true,
        Err(err) => match err.downcast_ref::<tonic::Status>() {
            // A connect failure already turned into a status below us.
            Some(status) => !never_sent(status),
            None => !is_connect_failure(err.as_ref()),
        },
    }
}

/// Records, per attempt, whether it may have reached the downstream.
#[derive(Debug, Clone, Default)]
pub(crate) struct AttemptLayer;

impl<S> tower::Layer<S> for AttemptLayer {
    type Service = Attempt<S>;
    fn layer(&self, inner: S) -> Attempt<S> {
        Attempt { inner }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Attempt<S> {
    inner: S,
}

impl<S, B, R> tower::Service<Request<B>> for Attempt<S>
where
    S: tower::Service<Request<B>, Response = Response<R>, Error = BoxError>,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<R>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let flag = req.extensions().get::<MaybeSent>().cloned();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            if let Some(flag) = flag
                && attempt_may_have_been_sent(&result)
            {
                flag.0.store(true, Ordering::SeqCst);
            }
            result
        })
    }
}

/// Puts a fresh "maybe sent" flag on a call's request; read it after the call.
pub(crate) fn track<B>(req: &mut Request<B>) -> MaybeSent {
    let flag = MaybeSent::default();
    req.extensions_mut().insert(flag.clone());
    flag
}

/// Marks a call's final result: an error becomes a `tonic::Status` carrying
/// [`SENT_METADATA`]; a trailers-only error answer from the downstream is marked `maybe`
/// (overwriting whatever the downstream put there).
pub(crate) fn mark<B>(
    result: Result<Response<B>, BoxError>,
    maybe_sent: bool,
) -> Result<Response<B>, BoxError> {
    match result {
        Ok(mut response) => {
            let failed = response.headers().get("grpc-status").is_some_and(|code| code.as_bytes() != b"0");
            if failed {
                response.headers_mut().insert(SENT_METADATA, HeaderValue::from_static("maybe"));
            }
            Ok(response)
        }
        Err(err) => {
            let mut status = match err.downcast::<tonic::Status>() {
                Ok(status) => *status,
                // tonic would say UNKNOWN for a connect failure it did not wrap itself.
                Err(err) if is_connect_failure(err.as_ref()) => {
                    let mut status = tonic::Status::unavailable(format!("cannot connect: {err}"));
                    status.set_source(Arc::from(err));
                    status
                }
                // Exactly the status tonic's client would make of it.
                Err(err) => tonic::Status::from_error(err),
            };
            let value = MetadataValue::from_static(if maybe_sent { "maybe" } else { "no" });
            status.metadata_mut().insert(SENT_METADATA, value);
            Err(Box::new(status))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> BoxError {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        Box::new(tonic::ConnectError(Box::new(io)))
    }

    fn status_of(result: Result<Response<()>, BoxError>) -> tonic::Status {
        tonic::Status::from_error(result.unwrap_err())
    }

    #[test]
    fn a_connect_failure_is_unavailable_and_never_sent() {
        assert!(is_connect_failure(refused().as_ref()));
        let plain: BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(is_connect_failure(plain.as_ref()));
        let status = status_of(mark(Err(plain), false));
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(never_sent(&status));
        let status = status_of(mark(Err(refused()), false));
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(never_sent(&status));
    }

    #[test]
    fn a_reset_may_have_been_sent() {
        let reset: BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(!is_connect_failure(reset.as_ref()));
        let result: Result<Response<()>, BoxError> = Err(reset);
        assert!(attempt_may_have_been_sent(&result));
        let status = status_of(mark(result, true));
        assert!(!never_sent(&status));
        let tonics =
            tonic::Status::from_error(Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        assert_eq!(
            status.code(),
            tonics.code(),
            "the code tonic's own client gives it, not a connect failure's"
        );
        assert_ne!(status.code(), tonic::Code::Unavailable);
    }

    #[test]
    fn a_downstream_answer_is_marked_maybe_even_if_it_claims_otherwise() {
        let response =
            Response::builder().header("grpc-status", "14").header(SENT_METADATA, "no").body(()).unwrap();
        let marked = mark(Ok(response), false).unwrap();
        assert_eq!(marked.headers()[SENT_METADATA], "maybe");
        let status = tonic::Status::from_header_map(marked.headers()).unwrap();
        assert!(!never_sent(&status));
        let ok = mark(Ok(Response::new(())), false).unwrap();
        assert!(ok.headers().get(SENT_METADATA).is_none(), "successes are left alone");
    }

    #[test]
    fn an_unmarked_status_counts_as_maybe_sent() {
        assert!(!never_sent(&tonic::Status::unavailable("from somewhere else")));
    }
}
