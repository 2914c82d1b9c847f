//! Every failure the gateway answers, mapped to problem+json in one place.

use axum::http::StatusCode;
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
            return Problem::unavailable(format!("{downstream} is failing; its circuit is open"), retry_after);
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
            ApiError::TooLarge => Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "too-large", "Request body too large"),
            ApiError::Invalid { field, message } => Problem::validation(field.clone(), message.clone()),
            ApiError::NotFound(what) => Problem::not_found(what.clone()),
            ApiError::Downstream { downstream, status } => downstream_problem(downstream, status),
        };
        problem.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(status: Status) -> StatusCode {
        ApiError::Downstream { downstream: "order", status }.into_response().status()
    }

    #[test]
    fn grpc_codes_map_to_http() {
        assert_eq!(status_of(Status::not_found("x")), StatusCode::NOT_FOUND);
        assert_eq!(status_of(sagaworks_errors::status::invalid_argument("items", "x")), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(status_of(Status::already_exists("x")), StatusCode::CONFLICT);
        assert_eq!(status_of(Status::unavailable("x")), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status_of(Status::deadline_exceeded("x")), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(status_of(Status::internal("secret detail")), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn unavailable_carries_retry_after() {
        let res = ApiError::Downstream { downstream: "order", status: Status::unavailable("down") }.into_response();
        assert_eq!(res.headers()["retry-after"], "1");
    }
}
