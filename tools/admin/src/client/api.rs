//! The calls: [`Client`] sends each request with the bearer [`Token`] and
//! answers a [`Fetched`]; a list with `all` follows its pages to the last.

use super::error::{Error, error_answer};
use super::model::{
    DeadLetter, DeadLetterPage, Discarded, DlqTopics, Fetched, Replayed, SagaActionResult, SagaDetail,
    SagaPage, SagaVersions,
};
use reqwest::{Method, RequestBuilder, Url};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;
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
}
