//! Every failure the gateway answers, mapped to problem+json in one place.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sagaworks_errors::Problem;
use sagaworks_errors::status::invalid_field;
use sagaworks_resilience::Rejection;
use std::time::Duration;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON, or not the JSON this endpoint takes.
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("request body too large")]
    TooLarge,
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("{0}")]
    NotFound(String),
    #[error("downstream {downstream}: {status}")]
    Downstream { downstream: &'static str, status: Status },
    /// No bearer token, or one that does not verify (401).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// A valid caller without the right to this resource (403).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The caller's request budget is spent (429).
    #[error("rate limited for {retry_after:?}")]
    RateLimited { retry_after: Duration },
    /// The identity provider's signing keys cannot be fetched (503).
    #[error("signing keys unavailable: {0}")]
    KeysUnavailable(String),
    /// The request took longer than `server.request_timeout_ms` (504).
    #[error("request timed out after {0:?}")]
    RequestTimeout(Duration),
}

impl ApiError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid { field: field.into(), message: message.into() }
    }

    /// Wraps an error status from `downstream`.
    pub fn downstream(downstream: &'static str) -> impl FnOnce(Status) -> Self {
        move |status| Self::Downstream { downstream, status }
    }
}

impl From<sagaworks_errors::InvalidField> for ApiError {
    fn from(e: sagaworks_errors::InvalidField) -> Self {
        Self::Invalid { field: e.field, message: e.message }
    }
}

fn downstream_problem(downstream: &str, status: &Status) -> Problem {
    match sagaworks_resilience::rejection(status) {
        Some(Rejection::CircuitOpen { retry_after }) => {
            return Problem::unavailable(
                format!("{downstream} is failing; its circuit is open"),
                retry_after,
            );
        }
        Some(Rejection::BulkheadFull) => {
            return Problem::unavailable(format!("{downstream} is at capacity"), Duration::from_secs(1));
        }
        Some(Rejection::Timeout) => return Problem::timeout(format!("{downstream} did not answer in time")),
        None => {}
    }
    let message = status.message().to_string();
    match status.code() {
        Code::InvalidArgument => {
            let field = invalid_field(status).unwrap_or("body").to_string();
            let message = message.strip_prefix(&format!("{field}: ")).unwrap_or(&message).to_string();
            Problem::validation(field, message)
        }
        Code::NotFound => Problem::not_found(message),
        Code::AlreadyExists | Code::FailedPrecondition | Code::Aborted => Problem::conflict(message),
        Code::Unavailable | Code::ResourceExhausted => {
            Problem::unavailable(format!("{downstream} is unavailable"), Duration::from_secs(1))
        }
        Code::DeadlineExceeded => Problem::timeout(format!("{downstream} did not answer in time")),
        _ => {
            tracing::error!(downstream, %status, "downstream error");
            Problem::internal()
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = match &self {
            ApiError::Malformed(detail) => Problem::bad_request(detail.clone()),
            ApiError::TooLarge => {
                // The rest of the body is never read, so the server closes the
                // connection after this answer: say so, or a client may send its
                // next request on it and see the connection drop instead.
                let problem = Problem::new(
                    StatusCode::PAYLOAD_TOO_LARGE.as_u16(),
                    "too-large",
                    "Request body too large",
                );
                let mut res = problem.into_response();
                res.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                return res;
            }
            ApiError::Invalid { field, message } => Problem::validation(field.clone(), message.clone()),
            ApiError::NotFound(what) => Problem::not_found(what.clone()),
            ApiError::Downstream { downstream, status } => downstream_problem(downstream, status),
            ApiError::Unauthenticated(detail) => {
                let problem = Problem::new(
                    StatusCode::UNAUTHORIZED.as_u16(),
                    "unauthenticated",
                    "Authentication required",
                )
                .detail(detail.clone());
                let mut res = problem.into_response();
                res.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return res;
            }
            ApiError::Forbidden(detail) => {
                Problem::new(StatusCode::FORBIDDEN.as_u16(), "forbidden", "Not allowed")
                    .detail(detail.clone())
            }
            ApiError::RateLimited { retry_after } => {
                Problem::new(StatusCode::TOO_MANY_REQUESTS.as_u16(), "rate-limited", "Too many requests")
                    .detail("request rate limit exceeded; retry after Retry-After seconds")
                    .retry_after(*retry_after)
            }
            ApiError::RequestTimeout(after) => Problem::timeout(format!(
                "the request took longer than the gateway allows ({} ms); it may still complete: \
                 retry with the same Idempotency-Key",
                after.as_millis()
            )),
            ApiError::KeysUnavailable(detail) => {
                tracing::error!(%detail, "cannot load token signing keys");
                Problem::unavailable("token signing keys are unavailable", Duration::from_secs(1))
            }
        };
        problem.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_too_large_closes_the_connection() {
        let res = ApiError::TooLarge.into_response();
        assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(res.headers()[header::CONNECTION], "close");
    }

    fn status_of(status: Status) -> StatusCode {
        ApiError::Downstream { downstream: "order", status }.into_response().status()
    }

    #[test]
    fn grpc_codes_map_to_http() {
        assert_eq!(status_of(Status::not_found("x")), StatusCode::NOT_FOUND);
        assert_eq!(
            status_of(sagaworks_errors::status::invalid_argument("items", "x")),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(status_of(Status::already_exists("x")), StatusCode::CONFLICT);
        assert_eq!(status_of(Status::unavailable("x")), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status_of(Status::deadline_exceeded("x")), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(status_of(Status::internal("secret detail")), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn auth_failures_are_401_with_a_bearer_challenge_403_and_429() {
        let res = ApiError::Unauthenticated("no token".into()).into_response();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(res.headers()[header::WWW_AUTHENTICATE], "Bearer");
        assert_eq!(res.headers()[header::CONTENT_TYPE], "application/problem+json");
        assert_eq!(ApiError::Forbidden("x".into()).into_response().status(), StatusCode::FORBIDDEN);
        let res = ApiError::RateLimited { retry_after: Duration::from_millis(200) }.into_response();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn unavailable_carries_retry_after() {
        let res =
            ApiError::Downstream { downstream: "order", status: Status::unavailable("down") }.into_response();
        assert_eq!(res.headers()["retry-after"], "1");
    }
}
