//! The gateway's admin REST API, as the CLI calls it.
//!
//! [`Client`] sends each request with the bearer token and answers a
//! [`Fetched`]: the typed body for human output and the JSON exactly as the
//! API sent it for `--json`. The saga shapes here are the CLI's own small
//! copies of the gateway's JSON: unknown fields are ignored and missing ones
//! take their default, so a newer gateway does not break an older CLI. The
//! dead-letter shapes and [`Problem`] are the gateway's own types
//! (`sagaworks_api`), which ignore unknown fields too.
//!
//! A non-2xx answer becomes an [`Error`] carrying the [`Problem`] document
//! (RFC 9457, or one made up from the status when the body is not one, as a
//! proxy's HTML error page is not) with the JSON as sent ([`ErrorAnswer`]). [`Error::from_problem`] maps the HTTP
//! status to the error, and [`Error::exit_code`] the error to the exit code:
//! change the mapping there and nowhere else.

use chrono::{DateTime, Utc};
use reqwest::{Method, RequestBuilder, StatusCode, Url};
pub use sagaworks_api::Problem;
pub use sagaworks_api::dead_letter::{
    DeadLetter, DeadLetterAction, DeadLetterPage, Discarded, DlqTopic, DlqTopics, OriginalPosition, Replayed,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::time::Duration;

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

/// An answer: the typed body and the JSON as sent.
#[derive(Debug, Clone)]
pub struct Fetched<T> {
    pub value: T,
    pub raw: Value,
}

/// A bearer token. `Debug` shows it as `[REDACTED]`: a client or a parsed command
/// line can be logged or printed in a panic without handing out the operator's token.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The token itself, for the `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Token {
    fn from(token: &str) -> Self {
        Self(token.to_owned())
    }
}

impl std::str::FromStr for Token {
    type Err = std::convert::Infallible;

    fn from_str(token: &str) -> Result<Self, Self::Err> {
        Ok(Self::from(token))
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

/// What a secret shows as in `Debug`.
pub const REDACTED: &str = "[REDACTED]";

/// The REST client: base URL, bearer token, timeout. `Debug` shows neither the token
/// nor a password in the base URL.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    token: Token,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut base = self.base.clone();
        if base.password().is_some() {
            let _ = base.set_password(Some(REDACTED));
        }
        f.debug_struct("Client")
            .field("base", &base.as_str())
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// The filters of `GET /v1/admin/sagas` (the cursor is handled by paging).
#[derive(Debug, Clone, Default)]
pub struct SagaFilter<'a> {
    pub status: Option<&'static str>,
    pub step: Option<&'a str>,
    pub older_than_secs: Option<u64>,
    pub customer_id: Option<String>,
    pub limit: Option<u32>,
}

/// The filters of `GET /v1/admin/dlq/{topic}/messages`.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterFilter<'a> {
    pub state: Option<&'static str>,
    pub key: Option<&'a str>,
    pub limit: Option<u32>,
}

type Query = Vec<(&'static str, String)>;

impl Client {
    /// A client for the API at `base` (e.g. `http://127.0.0.1:8080`, or
    /// `https://ops.example.com/api` behind an ingress with a path prefix).
    pub fn new(base: &Url, token: Token, timeout: Duration) -> Result<Self, Error> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(concat!("sagaworks-admin/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(Error::Setup)?;
        Ok(Self { http, base: base.clone(), token })
    }

    /// The URL of `segments` below the base, each segment percent-encoded.
    pub fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.set_query(None);
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// `GET /v1/admin/sagas`; with `all`, every page from `cursor` on, merged.
    pub async fn list_sagas(
        &self,
        filter: &SagaFilter<'_>,
        cursor: Option<String>,
        all: bool,
    ) -> Result<Fetched<SagaPage>, Error> {
        let mut query: Query = Vec::new();
        push(&mut query, "status", filter.status);
        push(&mut query, "step", filter.step);
        push(&mut query, "older_than", filter.older_than_secs);
        push(&mut query, "customer_id", filter.customer_id.as_deref());
        push(&mut query, "limit", filter.limit);
        self.pages(self.url(&["v1", "admin", "sagas"]), query, cursor, all).await
    }

    /// `GET /v1/admin/sagas/versions`.
    pub async fn saga_versions(&self) -> Result<Fetched<SagaVersions>, Error> {
        self.call(Method::GET, self.url(&["v1", "admin", "sagas", "versions"]), &[], None, None).await
    }

    /// `GET /v1/admin/sagas/{id}`.
    pub async fn get_saga(&self, id: &str) -> Result<Fetched<SagaDetail>, Error> {
        self.call(Method::GET, self.url(&["v1", "admin", "sagas", id]), &[], None, None).await
    }

    /// `POST /v1/admin/sagas/{id}/{action}` (`retry`, `compensate`, `resolve`).
    pub async fn act_on_saga(
        &self,
        id: &str,
        action: &str,
        idempotency_key: &str,
        body: &Value,
    ) -> Result<Fetched<SagaActionResult>, Error> {
        let url = self.url(&["v1", "admin", "sagas", id, action]);
        self.call(Method::POST, url, &[], Some(idempotency_key), Some(body)).await
    }

    /// `GET /v1/admin/dlq`.
    pub async fn dlq_topics(&self) -> Result<Fetched<DlqTopics>, Error> {
        self.call(Method::GET, self.url(&["v1", "admin", "dlq"]), &[], None, None).await
    }

    /// `GET /v1/admin/dlq/{topic}/messages`; with `all`, every page from `cursor` on, merged.
    pub async fn list_dead_letters(
        &self,
        topic: &str,
        filter: &DeadLetterFilter<'_>,
        cursor: Option<String>,
        all: bool,
    ) -> Result<Fetched<DeadLetterPage>, Error> {
        let mut query: Query = Vec::new();
        push(&mut query, "state", filter.state);
        push(&mut query, "key", filter.key);
        push(&mut query, "limit", filter.limit);
        self.pages(self.url(&["v1", "admin", "dlq", topic, "messages"]), query, cursor, all).await
    }

    /// `GET /v1/admin/dlq/{topic}/messages/{id}`.
    pub async fn get_dead_letter(&self, topic: &str, id: &str) -> Result<Fetched<DeadLetter>, Error> {
        self.call(Method::GET, self.url(&["v1", "admin", "dlq", topic, "messages", id]), &[], None, None)
            .await
    }

    /// `POST /v1/admin/dlq/{topic}/replay`.
    pub async fn replay_dead_letters(
        &self,
        topic: &str,
        idempotency_key: &str,
        body: &Value,
    ) -> Result<Fetched<Replayed>, Error> {
        let url = self.url(&["v1", "admin", "dlq", topic, "replay"]);
        self.call(Method::POST, url, &[], Some(idempotency_key), Some(body)).await
    }

    /// `POST /v1/admin/dlq/{topic}/messages/{id}/discard`.
    pub async fn discard_dead_letter(
        &self,
        topic: &str,
        id: &str,
        idempotency_key: &str,
        body: &Value,
    ) -> Result<Fetched<Discarded>, Error> {
        let url = self.url(&["v1", "admin", "dlq", topic, "messages", id, "discard"]);
        self.call(Method::POST, url, &[], Some(idempotency_key), Some(body)).await
    }

    /// Gets one page, or with `all` follows `next_cursor` to the last page and
    /// merges them: the items one after the other, `next_cursor` the last page's.
    async fn pages<P: Page>(
        &self,
        url: Url,
        query: Query,
        cursor: Option<String>,
        all: bool,
    ) -> Result<Fetched<P>, Error> {
        let mut cursor = cursor;
        let mut merged: Option<Fetched<P>> = None;
        loop {
            let mut page_query = query.clone();
            push(&mut page_query, "cursor", cursor.as_deref());
            let page: Fetched<P> = self.call(Method::GET, url.clone(), &page_query, None, None).await?;
            let next = page.value.next_cursor().map(str::to_string);
            merged = Some(match merged {
                None => page,
                Some(mut so_far) => {
                    merge_raw(&mut so_far.raw, page.raw, P::ITEMS);
                    so_far.value.append(page.value);
                    so_far
                }
            });
            match next {
                // A server that hands back the same cursor would loop forever.
                Some(next) if all && cursor.as_deref() != Some(next.as_str()) => cursor = Some(next),
                _ => break,
            }
        }
        Ok(merged.expect("the loop runs at least once"))
    }

    /// Sends one request and reads its answer.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        query: &[(&str, String)],
        idempotency_key: Option<&str>,
        body: Option<&Value>,
    ) -> Result<Fetched<T>, Error> {
        let mut request: RequestBuilder =
            self.http.request(method, url.clone()).bearer_auth(self.token.expose());
        if !query.is_empty() {
            request = request.query(query);
        }
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let network = |source| Error::Network { url: url.to_string(), source };
        let response = request.send().await.map_err(network)?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let bytes = response.bytes().await.map_err(network)?;
        if !status.is_success() {
            return Err(Error::from_problem(error_answer(status.as_u16(), retry_after, &bytes)));
        }
        let protocol = |message: String| Error::Protocol { url: url.to_string(), message };
        let raw: Value = serde_json::from_slice(&bytes).map_err(|e| protocol(format!("not JSON: {e}")))?;
        let value = T::deserialize(&raw).map_err(|e| protocol(e.to_string()))?;
        Ok(Fetched { value, raw })
    }
}

fn push(query: &mut Query, name: &'static str, value: Option<impl ToString>) {
    if let Some(value) = value {
        query.push((name, value.to_string()));
    }
}

/// Appends `page[items]` to `so_far[items]` and takes the page's `next_cursor`.
fn merge_raw(so_far: &mut Value, page: Value, items: &str) {
    let Value::Object(mut page) = page else { return };
    if let (Some(Value::Array(all)), Some(Value::Array(more))) = (so_far.get_mut(items), page.remove(items)) {
        all.extend(more);
    }
    if let Value::Object(so_far) = so_far {
        match page.remove("next_cursor") {
            Some(next) => so_far.insert("next_cursor".into(), next),
            None => so_far.remove("next_cursor"),
        };
    }
}

/// A page of a list with keyset pagination.
trait Page: DeserializeOwned {
    /// The field holding the items.
    const ITEMS: &'static str;
    fn next_cursor(&self) -> Option<&str>;
    /// Appends the next page.
    fn append(&mut self, next: Self);
}

impl Page for SagaPage {
    const ITEMS: &'static str = "sagas";
    fn next_cursor(&self) -> Option<&str> {
        self.next_cursor.as_deref()
    }
    fn append(&mut self, next: Self) {
        self.sagas.extend(next.sagas);
        self.next_cursor = next.next_cursor;
    }
}

impl Page for DeadLetterPage {
    const ITEMS: &'static str = "messages";
    fn next_cursor(&self) -> Option<&str> {
        self.next_cursor.as_deref()
    }
    fn append(&mut self, next: Self) {
        self.messages.extend(next.messages);
        self.next_cursor = next.next_cursor;
    }
}

// The API's JSON shapes (only what the CLI shows; unknown fields are ignored).

/// `GET /v1/admin/sagas`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaPage {
    pub sagas: Vec<SagaSummary>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaSummary {
    pub saga_id: String,
    pub order_id: String,
    pub status: String,
    pub current_step: Option<String>,
    /// Attempts of the current step so far.
    pub attempts: u32,
    pub last_error: Option<String>,
    pub failure_reason: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub progressed_at: Option<DateTime<Utc>>,
    pub age_secs: i64,
    /// Seconds since the last progress.
    pub idle_secs: i64,
    pub trace_id: Option<String>,
}

/// `GET /v1/admin/sagas/versions`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaVersions {
    pub versions: Vec<SagaVersion>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaVersion {
    pub saga_type: String,
    pub version: u32,
    pub unfinished: u64,
    pub fingerprint: Option<String>,
    pub registered: bool,
    pub starts_new: bool,
}

/// `GET /v1/admin/sagas/{id}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaDetail {
    pub saga_id: String,
    pub order_id: String,
    pub status: String,
    pub current_step: Option<String>,
    pub steps: Vec<SagaStep>,
    pub failure_reason: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    pub progressed_at: Option<DateTime<Utc>>,
    pub trace_id: Option<String>,
    pub trace_url: Option<String>,
    pub actions: Vec<SagaOperatorAction>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaStep {
    pub name: String,
    pub status: String,
    pub attempts: u32,
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub history: Vec<SagaAttempt>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaAttempt {
    pub attempt: u32,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub outcome: String,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaOperatorAction {
    pub action: String,
    pub step: String,
    pub actor: String,
    pub reason: String,
    pub at: Option<DateTime<Utc>>,
}

/// `POST /v1/admin/sagas/{id}/{action}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SagaActionResult {
    pub step: String,
    /// The key was used before: nothing was done again.
    pub replayed: bool,
    pub saga: SagaDetail,
}

#[cfg(test)]
mod tests {
    use super::*;
    use sagaworks_api::FieldError;
    use serde_json::json;

    #[test]
    fn debug_shows_neither_the_token_nor_a_password_in_the_url() {
        let secret = "eyJhbGciOi.the-operators-token.c2ln";
        let base = Url::parse("https://ops:url-password@ops.example/api").unwrap();
        let client = Client::new(&base, Token::from(secret), Duration::from_secs(1)).unwrap();
        let shown = format!("{client:?} {client:#?} {:?}", Token::from(secret));
        assert!(!shown.contains(secret) && !shown.contains("url-password"), "{shown}");
        assert!(shown.contains("[REDACTED]") && shown.contains("ops.example/api"), "{shown}");
    }

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

    #[test]
    fn urls_encode_segments_and_keep_a_path_prefix() {
        let timeout = Duration::from_secs(1);
        let client =
            Client::new(&Url::parse("https://ops.example.com/api/").unwrap(), "t".into(), timeout).unwrap();
        assert_eq!(
            client.url(&["v1", "admin", "dlq", "a/b?c"]).as_str(),
            "https://ops.example.com/api/v1/admin/dlq/a%2Fb%3Fc"
        );
        let client = Client::new(&Url::parse("http://127.0.0.1:8080").unwrap(), "t".into(), timeout).unwrap();
        assert_eq!(client.url(&["v1", "admin", "sagas"]).as_str(), "http://127.0.0.1:8080/v1/admin/sagas");
    }

    #[test]
    fn pages_merge() {
        let mut so_far = json!({"sagas": [1, 2], "next_cursor": "a"});
        merge_raw(&mut so_far, json!({"sagas": [3], "next_cursor": "b"}), "sagas");
        assert_eq!(so_far, json!({"sagas": [1, 2, 3], "next_cursor": "b"}));
        merge_raw(&mut so_far, json!({"sagas": [4]}), "sagas");
        assert_eq!(so_far, json!({"sagas": [1, 2, 3, 4]}));
    }

    #[test]
    fn shapes_tolerate_unknown_and_missing_fields() {
        let page: SagaPage = serde_json::from_value(json!({
            "sagas": [{"saga_id": "s", "status": "RUNNING", "brand_new": {"x": 1}, "created_at": null}],
        }))
        .unwrap();
        assert_eq!(page.sagas[0].saga_id, "s");
        assert_eq!(page.sagas[0].attempts, 0);
        assert_eq!(page.next_cursor, None);
    }
}
