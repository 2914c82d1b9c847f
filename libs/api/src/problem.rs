//! RFC 9457 problem details: the body of every error answer of the REST API.

#[cfg(feature = "axum")]
use axum::http::{HeaderValue, StatusCode, header};
#[cfg(feature = "axum")]
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// One invalid input field.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default)]
pub struct FieldError {
    /// JSON pointer-ish path of the field, e.g. `items[0].quantity`.
    pub field: String,
    pub message: String,
}

/// An RFC 9457 problem detail. Read leniently (a client also reads the
/// answers of proxies): only `title` must be there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// A URI reference naming the problem type.
    #[serde(rename = "type", default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub kind: String,
    pub title: String,
    /// The HTTP status of the answer.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Invalid fields, for 400/422.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub errors: Vec<FieldError>,
    /// Seconds, mirrored in the `Retry-After` header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl Problem {
    /// A problem of type `https://sagaworks.dev/problems/{kind}` with HTTP `status`.
    pub fn new(status: u16, kind: &str, title: &str) -> Self {
        Self {
            kind: format!("https://sagaworks.dev/problems/{kind}"),
            title: title.into(),
            status,
            detail: None,
            instance: None,
            errors: Vec::new(),
            retry_after: None,
        }
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn field(mut self, field: impl Into<String>, message: impl Into<String>) -> Self {
        self.errors.push(FieldError { field: field.into(), message: message.into() });
        self
    }

    /// Sets `Retry-After`, rounded up to whole seconds (at least 1).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after.as_secs_f64().ceil().max(1.0) as u64);
        self
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(400, "bad-request", "The request is malformed").detail(detail)
    }

    pub fn validation(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(422, "validation", "The request is invalid").field(field, message)
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(404, "not-found", "Not found").detail(what)
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(409, "conflict", "Conflict").detail(detail)
    }

    pub fn unavailable(detail: impl Into<String>, retry_after: Duration) -> Self {
        Self::new(503, "unavailable", "A downstream service is unavailable")
            .detail(detail)
            .retry_after(retry_after)
    }

    pub fn timeout(detail: impl Into<String>) -> Self {
        Self::new(504, "timeout", "A downstream service did not answer in time").detail(detail)
    }

    pub fn internal() -> Self {
        Self::new(500, "internal", "Internal error")
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (HTTP {})", self.title, self.status)?;
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        Ok(())
    }
}

#[cfg(feature = "axum")]
impl Problem {
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

#[cfg(feature = "axum")]
impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status_code();
        let retry = self.retry_after;
        let mut res = (status, axum::Json(self)).into_response();
        res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = retry {
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "axum")]
    #[test]
    fn problem_sets_content_type_and_retry_after() {
        let res = Problem::unavailable("order service", Duration::from_millis(1500)).into_response();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(res.headers()[header::RETRY_AFTER], "2");
    }

    #[test]
    fn a_problem_without_type_or_status_is_read() {
        let p: Problem = serde_json::from_str(r#"{"title":"Bad Gateway","extra":1}"#).unwrap();
        assert_eq!((p.title.as_str(), p.status, p.kind.as_str()), ("Bad Gateway", 0, ""));
        assert!(serde_json::from_str::<Problem>(r#"{"detail":"no title"}"#).is_err());
    }

    #[test]
    fn validation_names_the_field() {
        let p = Problem::validation("items[0].quantity", "must be positive");
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["status"], 422);
        assert_eq!(json["errors"][0]["field"], "items[0].quantity");
        assert!(json.get("retry_after").is_none());
    }
}
