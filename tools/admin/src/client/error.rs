//! Why a call fails, and the exit code each failure gives: the one place
//! that maps an HTTP status to an [`Error`] ([`Error::from_problem`]) and an
//! error to the process exit code ([`Error::exit_code`]).

use super::model::Fetched;
use reqwest::StatusCode;
use sagaworks_api::Problem;
use serde::Deserialize;
use serde_json::Value;

/// The process exit codes (see the crate docs).
pub mod exit {
    pub const OK: u8 = 0;
    /// Another API error, or no answer at all.
    pub const FAILURE: u8 = 1;
    /// Bad flags (clap exits with it by itself).
    pub const USAGE: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const CONFLICT: u8 = 4;
    pub const AUTH: u8 = 5;
    pub const UNAVAILABLE: u8 = 6;
}

/// Why a call failed. (The problem is boxed to keep `Result`s small.)
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 404.
    #[error("not found: {}", .0.value)]
    NotFound(Box<ErrorAnswer>),
    /// 409: not valid in the resource's state; nothing changed.
    #[error("conflict: {}", .0.value)]
    Conflict(Box<ErrorAnswer>),
    /// 401 or 403.
    #[error("not allowed: {}", .0.value)]
    Auth(Box<ErrorAnswer>),
    /// 503 or 429: try again later.
    #[error("unavailable: {}", .0.value)]
    Unavailable(Box<ErrorAnswer>),
    /// Any other error status (400, 422, 500, ...).
    #[error("{}", .0.value)]
    Api(Box<ErrorAnswer>),
    /// No answer: connection refused, DNS, TLS, timeout.
    #[error("cannot reach the API at {url}")]
    Network {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// A 2xx answer that is not the JSON expected.
    #[error("unexpected answer from {url}: {message}")]
    Protocol { url: String, message: String },
    /// The HTTP client could not be built (TLS setup).
    #[error("cannot set up the HTTP client")]
    Setup(#[source] reqwest::Error),
}

impl Error {
    /// The error for an error answer, by its HTTP status.
    pub fn from_problem(problem: ErrorAnswer) -> Self {
        let problem = Box::new(problem);
        match problem.value.status {
            404 => Error::NotFound(problem),
            409 => Error::Conflict(problem),
            401 | 403 => Error::Auth(problem),
            429 | 503 => Error::Unavailable(problem),
            _ => Error::Api(problem),
        }
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::NotFound(_) => exit::NOT_FOUND,
            Error::Conflict(_) => exit::CONFLICT,
            Error::Auth(_) => exit::AUTH,
            Error::Unavailable(_) => exit::UNAVAILABLE,
            Error::Api(_) | Error::Network { .. } | Error::Protocol { .. } | Error::Setup(_) => exit::FAILURE,
        }
    }

    /// The API's problem document, when the API answered.
    pub fn problem(&self) -> Option<&ErrorAnswer> {
        match self {
            Error::NotFound(p)
            | Error::Conflict(p)
            | Error::Auth(p)
            | Error::Unavailable(p)
            | Error::Api(p) => Some(p),
            Error::Network { .. } | Error::Protocol { .. } | Error::Setup(_) => None,
        }
    }
}

/// An error answer: its problem document (`status` the answer's HTTP status,
/// whatever the document says) and the JSON as sent (or as made up here).
pub type ErrorAnswer = Fetched<Problem>;

/// Reads an error answer's body; a body that is not a problem document (a
/// proxy's HTML page, say) gives a problem with the status's name as title
/// and the start of the body as detail.
pub fn error_answer(status: u16, retry_after_header: Option<u64>, body: &[u8]) -> ErrorAnswer {
    let reason = StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Error");
    if let Ok(raw) = serde_json::from_slice::<Value>(body)
        && let Ok(mut problem) = Problem::deserialize(&raw)
    {
        problem.status = status;
        if problem.title.is_empty() {
            problem.title = reason.to_string();
        }
        problem.detail = problem.detail.filter(|d| !d.is_empty());
        problem.retry_after = problem.retry_after.or(retry_after_header);
        return Fetched { value: problem, raw };
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let detail = (!text.is_empty()).then(|| match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    });
    let raw = serde_json::json!({ "title": reason, "status": status, "detail": detail });
    let problem = Problem {
        kind: String::new(),
        title: reason.to_string(),
        status,
        detail,
        instance: None,
        errors: Vec::new(),
        retry_after: retry_after_header,
    };
    Fetched { value: problem, raw }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sagaworks_api::FieldError;
    use serde_json::json;

    fn exit_code_of(status: u16) -> u8 {
        Error::from_problem(error_answer(status, None, b"")).exit_code()
    }

    #[test]
    fn statuses_map_to_the_documented_exit_codes() {
        for (status, code) in [
            (400, exit::FAILURE),
            (401, exit::AUTH),
            (403, exit::AUTH),
            (404, exit::NOT_FOUND),
            (409, exit::CONFLICT),
            (422, exit::FAILURE),
            (429, exit::UNAVAILABLE),
            (500, exit::FAILURE),
            (502, exit::FAILURE),
            (503, exit::UNAVAILABLE),
        ] {
            assert_eq!(exit_code_of(status), code, "HTTP {status}");
        }
        assert_eq!(exit::OK, 0);
        assert_eq!(exit::USAGE, 2);
    }

    #[test]
    fn a_problem_document_is_read() {
        let body = json!({
            "type": "https://sagaworks.dev/problems/invalid", "title": "Invalid request", "status": 422,
            "detail": "see errors", "errors": [{"field": "limit", "message": "must be between 1 and 500"}],
            "extra": true,
        });
        let answer = error_answer(422, None, body.to_string().as_bytes());
        let problem = &answer.value;
        assert_eq!(problem.title, "Invalid request");
        assert_eq!(problem.detail.as_deref(), Some("see errors"));
        assert_eq!(
            problem.errors,
            [FieldError { field: "limit".into(), message: "must be between 1 and 500".into() }]
        );
        assert_eq!(answer.raw, body);
    }

    #[test]
    fn a_body_that_is_not_a_problem_still_gives_one() {
        let answer = error_answer(503, Some(7), b"<html>upstream down</html>");
        assert_eq!(answer.value.title, "Service Unavailable");
        assert_eq!(answer.value.detail.as_deref(), Some("<html>upstream down</html>"));
        assert_eq!(answer.value.retry_after, Some(7));
        assert_eq!(answer.raw["status"], 503);
        let empty = error_answer(502, None, b"").value;
        assert_eq!((empty.title.as_str(), empty.detail), ("Bad Gateway", None));
    }
}
