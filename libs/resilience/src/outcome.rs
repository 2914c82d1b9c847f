//! What an attempt's result means: one classification shared by retry, breaker and metrics.
//!
//! A tonic server answers a failed unary call with a *trailers-only* response: HTTP 200
//! whose headers already carry `grpc-status`. So the code is read from the response
//! headers; a response without `grpc-status` in its headers is a success (its status
//! follows in the trailers). Errors are either a boxed `tonic::Status` (from a layer of
//! this stack, or from tonic) or a transport error (connect refused, reset, ...).

use crate::{BoxError, Rejection, rejection};
use tonic::Code;

/// Outcome of one attempt or one whole call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A response without an error code in its headers.
    Ok,
    /// The downstream (or tonic) answered with this gRPC code.
    Code(Code),
    /// A layer of this stack refused or cut the call.
    Rejected(Rejection),
    /// The request never got a gRPC answer (connect error, broken connection).
    Transport,
}

impl Outcome {
    pub(crate) fn of<B>(result: &Result<http::Response<B>, BoxError>) -> Self {
        match result {
            Ok(response) => match response.headers().get("grpc-status") {
                Some(v) => match Code::from_bytes(v.as_bytes()) {
                    Code::Ok => Outcome::Ok,
                    code => Outcome::Code(code),
                },
                None => Outcome::Ok,
            },
            Err(err) => match err.downcast_ref::<tonic::Status>() {
                Some(status) => match rejection(status) {
                    Some(r) => Outcome::Rejected(r),
                    None => Outcome::Code(status.code()),
                },
                None => Outcome::Transport,
            },
        }
    }

    /// Worth another attempt: the request may not have reached a healthy server.
    /// Rejections by the breaker or bulkhead are not (retrying would defeat them).
    pub(crate) fn is_retryable(self) -> bool {
        matches!(
            self,
            Outcome::Transport
                | Outcome::Rejected(Rejection::Timeout)
                | Outcome::Code(Code::Unavailable | Code::DeadlineExceeded)
        )
    }

    /// Counts against the downstream's health. Business codes (`INVALID_ARGUMENT`,
    /// `FAILED_PRECONDITION`, ...) mean the downstream works, so they are successes.
    pub(crate) fn is_failure(self) -> bool {
        matches!(
            self,
            Outcome::Transport
                | Outcome::Rejected(Rejection::Timeout)
                | Outcome::Code(Code::Unavailable | Code::DeadlineExceeded | Code::Internal | Code::Unknown)
        )
    }

    /// `outcome` label of `resilience_calls_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Rejected(r) => r.reason(),
            Outcome::Transport => "transport_error",
            Outcome::Code(code) => code_label(code),
        }
    }
}

fn code_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: Option<&'static str>) -> Result<http::Response<()>, BoxError> {
        let mut b = http::Response::builder();
        if let Some(s) = status {
            b = b.header("grpc-status", s);
        }
        Ok(b.body(()).unwrap())
    }

    #[test]
    fn classifies_trailers_only_codes_statuses_and_transport_errors() {
        assert_eq!(Outcome::of(&response(None)), Outcome::Ok);
        assert_eq!(Outcome::of(&response(Some("0"))), Outcome::Ok);
        assert_eq!(Outcome::of(&response(Some("14"))), Outcome::Code(Code::Unavailable));
        let status: Result<http::Response<()>, BoxError> = Err(Box::new(tonic::Status::not_found("x")));
        assert_eq!(Outcome::of(&status), Outcome::Code(Code::NotFound));
        let rejected: Result<http::Response<()>, BoxError> = Err(Box::new(Rejection::Timeout.to_status("x")));
        assert_eq!(Outcome::of(&rejected), Outcome::Rejected(Rejection::Timeout));
        let io: Result<http::Response<()>, BoxError> = Err(Box::new(std::io::Error::other("refused")));
        assert_eq!(Outcome::of(&io), Outcome::Transport);
    }

    #[test]
    fn business_codes_are_neither_retryable_nor_failures() {
        for code in [Code::InvalidArgument, Code::NotFound, Code::FailedPrecondition, Code::Aborted] {
            assert!(!Outcome::Code(code).is_retryable(), "{code:?}");
            assert!(!Outcome::Code(code).is_failure(), "{code:?}");
        }
        assert!(!Outcome::Rejected(Rejection::BulkheadFull).is_retryable());
        assert!(Outcome::Code(Code::Internal).is_failure());
        assert!(!Outcome::Code(Code::Internal).is_retryable());
    }
}
