//! Where `load` sends its orders, and how each answer maps to an outcome.
//!
//! * [`Target::Gateway`] (the default): `POST /v1/orders` on the gateway (`--api`), with a
//!   bearer token per customer; `201` (or `200`, a replay) with the order is accepted, with
//!   the order's status.
//! * [`Target::Restate`]: the peer of `scripts/bench-peer`, the same saga orchestrated by
//!   Restate (`bench/restate-peer`): a `POST` of the same body to the handler's URL on
//!   Restate's ingress, [`ORDER_ID`] in the URL replaced by a fresh UUIDv7 (the virtual
//!   object's key: the order id), the same `Idempotency-Key` header (Restate dedupes on it),
//!   no bearer token (the peer has no authentication). `200` with `{order_id, status}` is
//!   accepted; any other status (a terminal error's code, Restate's own 4xx/5xx) is rejected.
//! * [`Target::Temporal`]: the other peer, the same saga as a Temporal workflow
//!   (`bench/temporal-peer`), through that peer's HTTP front, which answers as Restate's
//!   ingress does (the same URL shape, body and answers): the same client as for Restate.
//!
//! The generator, the latency measurement, the CPU accounting and the report are the same
//! for both ([`crate::load`], [`crate::open_loop`]); only [`Orders::place_order`] differs.

use crate::api::{OrderBody, not_an_order};
use crate::{Api, PlaceOutcome, ToolError};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// In a Restate target's URL: replaced by a fresh order id (UUIDv7) per order.
pub const ORDER_ID: &str = "{order_id}";

/// `--target`: the gateway, `restate=URL` or `temporal=URL`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Target {
    #[default]
    Gateway,
    /// The saga handler's URL on Restate's ingress, e.g.
    /// `http://127.0.0.1:18080/OrderSaga/{order_id}/place`.
    Restate { url: String },
    /// The Temporal peer's HTTP front, e.g. `http://127.0.0.1:19090/OrderSaga/{order_id}/place`.
    Temporal { url: String },
}

impl Target {
    /// A short name for the report.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Gateway => "sagaworks (POST /v1/orders)",
            Self::Restate { .. } => "restate peer",
            Self::Temporal { .. } => "temporal peer",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gateway => f.write_str("gateway"),
            Self::Restate { url } => write!(f, "restate={url}"),
            Self::Temporal { url } => write!(f, "temporal={url}"),
        }
    }
}

impl FromStr for Target {
    type Err = String;

    /// `gateway`, `restate=URL` or `temporal=URL` (http or https, with a host; [`ORDER_ID`]
    /// anywhere in it).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "gateway" {
            return Ok(Self::Gateway);
        }
        let Some((peer, url)) = s.split_once('=').filter(|(p, _)| matches!(*p, "restate" | "temporal"))
        else {
            return Err(format!("{s:?} is neither `gateway`, `restate=URL` nor `temporal=URL`"));
        };
        let probe = url.replace(ORDER_ID, &uuid::Uuid::nil().to_string());
        let parsed = reqwest::Url::parse(&probe).map_err(|e| format!("{peer}={url}: not a URL: {e}"))?;
        match parsed.scheme() {
            "http" | "https" if parsed.has_host() => Ok(if peer == "restate" {
                Self::Restate { url: url.to_string() }
            } else {
                Self::Temporal { url: url.to_string() }
            }),
            _ => Err(format!("{peer}={url}: must be an http:// or https:// URL with a host")),
        }
    }
}

/// What the Restate peer's answer means: `200` with `{order_id, status}` (the handler's
/// result) is accepted; any other status is a rejection (Restate answers a terminal error
/// with its code, an unknown service with 404, an overloaded ingress with 503, ...).
pub fn restate_outcome(status: u16, body: &[u8]) -> Result<PlaceOutcome, ToolError> {
    if status != 200 {
        return Ok(PlaceOutcome::Rejected { status });
    }
    let order: OrderBody = serde_json::from_slice(body).map_err(|e| not_an_order("restate", status, &e))?;
    Ok(PlaceOutcome::Accepted { order_id: order.order_id, status: order.status })
}

/// The client `load` places its orders with.
pub struct Orders {
    client: Client,
    /// Orders sent a second time after their connection ended unanswered.
    resent: AtomicU64,
}

enum Client {
    Gateway(Api),
    Restate(RestatePeer),
}

impl Orders {
    /// The client of `target`: `api` for the gateway; a plain HTTP client for a peer (Restate's
    /// ingress, or the Temporal peer's front, which answers alike).
    pub fn new(target: &Target, api: Api, timeout: Duration) -> Result<Self, ToolError> {
        let client = match target {
            Target::Gateway => Client::Gateway(api),
            Target::Restate { url } | Target::Temporal { url } => {
                Client::Restate(RestatePeer::new(url, timeout)?)
            }
        };
        Ok(Self { client, resent: AtomicU64::new(0) })
    }

    /// Places the order with `idempotency_key`. Transport failures (connection refused,
    /// timeout) are the `Err`.
    ///
    /// A request whose connection ended before any answer came (not refused, not timed
    /// out) is sent once more, on another connection, with the same key. That happens when
    /// the server closes a kept-alive connection just as the request goes out on it, as
    /// every HTTP/1.1 server may (RFC 9112, section 9.3.1), and as a gateway that is
    /// shutting down does. The key makes the second attempt safe: the target answers it
    /// with the order the first attempt placed, if it placed one. [`Orders::resent`]
    /// counts these.
    pub async fn place_order(
        &self,
        customer_id: &str,
        items: &[(String, i64)],
        idempotency_key: &str,
    ) -> Result<PlaceOutcome, ToolError> {
        match self.send(customer_id, items, idempotency_key).await {
            Err(ToolError::Http(e)) if ended_unanswered(&e) => {
                self.resent.fetch_add(1, Ordering::Relaxed);
                self.send(customer_id, items, idempotency_key).await
            }
            outcome => outcome,
        }
    }

    /// Orders sent a second time because their connection ended unanswered.
    pub fn resent(&self) -> u64 {
        self.resent.load(Ordering::Relaxed)
    }

    async fn send(
        &self,
        customer_id: &str,
        items: &[(String, i64)],
        idempotency_key: &str,
    ) -> Result<PlaceOutcome, ToolError> {
        match &self.client {
            Client::Gateway(api) => api.place_order(customer_id, items, idempotency_key).await,
            Client::Restate(peer) => peer.place_order(customer_id, items, idempotency_key).await,
        }
    }
}

/// The request went out and its connection ended without an answer: neither refused
/// (nothing was sent), nor timed out (the server may still be working on it), nor an
/// answer that did not decode.
fn ended_unanswered(e: &reqwest::Error) -> bool {
    e.is_request() && !e.is_connect() && !e.is_timeout()
}

/// The Restate peer's saga handler, through Restate's ingress (or the Temporal peer's front,
/// which takes and answers the same).
pub struct RestatePeer {
    http: reqwest::Client,
    url: String,
}

impl RestatePeer {
    pub fn new(url: &str, timeout: Duration) -> Result<Self, ToolError> {
        let http = crate::api::http_client(timeout)?;
        Ok(Self { http, url: url.to_string() })
    }

    /// The URL of one order: [`ORDER_ID`] replaced by `order_id`.
    pub fn url_for(&self, order_id: uuid::Uuid) -> String {
        self.url.replace(ORDER_ID, &order_id.to_string())
    }

    /// `POST`s the gateway's order body to the handler; answers when the saga finished.
    pub async fn place_order(
        &self,
        customer_id: &str,
        items: &[(String, i64)],
        idempotency_key: &str,
    ) -> Result<PlaceOutcome, ToolError> {
        let res = self
            .http
            .post(self.url_for(uuid::Uuid::now_v7()))
            .header("idempotency-key", idempotency_key)
            .json(&crate::api::order_body(customer_id, items))
            .send()
            .await?;
        let status = res.status().as_u16();
        let body = res.bytes().await?;
        restate_outcome(status, &body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::gateway_outcome;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// Reads one request (head and `content-length` body) off `conn`; returns its
    /// `idempotency-key`.
    async fn read_request(conn: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the client closed before sending a whole request");
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            let Some(end) = text.find("\r\n\r\n") else { continue };
            let header = |name: &str| {
                text[..end].lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                })
            };
            let length: usize = header("content-length").map_or(0, |v| v.parse().unwrap());
            if buf.len() >= end + 4 + length {
                return header("idempotency-key").expect("the order carries an Idempotency-Key");
            }
        }
    }

    /// A connection that ends after the request went out, before any answer, gets the
    /// order sent once more, with the same key, on a new connection.
    #[tokio::test]
    async fn an_order_whose_connection_ends_unanswered_is_sent_again_with_its_key() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut first, _) = listener.accept().await.unwrap();
            let first_key = read_request(&mut first).await;
            drop(first);
            let (mut second, _) = listener.accept().await.unwrap();
            let second_key = read_request(&mut second).await;
            let body = r#"{"order_id":"o-1","status":"CONFIRMED"}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            second.write_all(answer.as_bytes()).await.unwrap();
            (first_key, second_key)
        });
        let target = Target::Restate { url: format!("http://127.0.0.1:{port}/OrderSaga/{ORDER_ID}/place") };
        let api = Api::new("http://127.0.0.1:1", crate::Tokens::None, Duration::from_secs(30)).unwrap();
        let orders = Orders::new(&target, api, Duration::from_secs(30)).unwrap();
        let items = [("p-1".to_string(), 1)];
        let outcome = orders.place_order("c-1", &items, "key-1").await.unwrap();
        assert_eq!(outcome, PlaceOutcome::Accepted { order_id: "o-1".into(), status: "CONFIRMED".into() });
        assert_eq!(orders.resent(), 1);
        let (first_key, second_key) = server.await.unwrap();
        assert_eq!((first_key.as_str(), second_key.as_str()), ("key-1", "key-1"));
    }

    /// A refused connection carried no request: it is a failure, not sent again.
    #[tokio::test]
    async fn a_refused_order_is_not_sent_again() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let target = Target::Restate { url: format!("http://127.0.0.1:{port}/OrderSaga/{ORDER_ID}/place") };
        let api = Api::new("http://127.0.0.1:1", crate::Tokens::None, Duration::from_secs(30)).unwrap();
        let orders = Orders::new(&target, api, Duration::from_secs(30)).unwrap();
        let err = orders.place_order("c-1", &[("p-1".to_string(), 1)], "key-1").await.unwrap_err();
        assert!(matches!(&err, ToolError::Http(e) if e.is_connect()), "{err}");
        assert_eq!(orders.resent(), 0);
    }

    #[test]
    fn targets_parse_and_print_back() {
        assert_eq!("gateway".parse::<Target>(), Ok(Target::Gateway));
        let url = "http://127.0.0.1:18080/OrderSaga/{order_id}/place";
        let target: Target = format!("restate={url}").parse().unwrap();
        assert_eq!(target, Target::Restate { url: url.into() });
        assert_eq!(target.to_string(), format!("restate={url}"));
        // A plain service: no key in the URL.
        assert!("restate=https://peer.example/OrderSaga/place".parse::<Target>().is_ok());
        let url = "http://127.0.0.1:19090/OrderSaga/{order_id}/place";
        let target: Target = format!("temporal={url}").parse().unwrap();
        assert_eq!(target, Target::Temporal { url: url.into() });
        assert_eq!(target.to_string(), format!("temporal={url}"));
    }

    #[test]
    fn bad_targets_are_refused() {
        for bad in [
            "",
            "restate",
            "restate=",
            "restate=127.0.0.1:8080/x",
            "temporal=",
            "cadence=http://h/x",
            "Gateway",
        ] {
            assert!(bad.parse::<Target>().is_err(), "{bad:?} parsed");
        }
        assert!("restate=ftp://h/x".parse::<Target>().unwrap_err().contains("http"));
    }

    #[test]
    fn the_order_id_goes_into_the_url() {
        let peer = RestatePeer::new("http://h:1/OrderSaga/{order_id}/place", Duration::from_secs(1)).unwrap();
        let id = uuid::Uuid::now_v7();
        assert_eq!(peer.url_for(id), format!("http://h:1/OrderSaga/{id}/place"));
    }

    #[test]
    fn restate_answers_map_to_outcomes() {
        let body = br#"{"order_id":"o1","status":"CONFIRMED","total_cents":1200,"failure_reason":null}"#;
        assert_eq!(
            restate_outcome(200, body).unwrap(),
            PlaceOutcome::Accepted { order_id: "o1".into(), status: "CONFIRMED".into() }
        );
        let body = br#"{"order_id":"o2","status":"CANCELLED","failure_reason":"charge_payment: insufficient funds"}"#;
        assert_eq!(
            restate_outcome(200, body).unwrap(),
            PlaceOutcome::Accepted { order_id: "o2".into(), status: "CANCELLED".into() }
        );
        // A terminal error's code, Restate's own refusals: rejected, whatever the body.
        let terminal = br#"{"code":422,"message":"customer_id must be a UUID"}"#;
        assert_eq!(restate_outcome(422, terminal).unwrap(), PlaceOutcome::Rejected { status: 422 });
        assert_eq!(restate_outcome(503, b"").unwrap(), PlaceOutcome::Rejected { status: 503 });
        // 201 is the gateway's; Restate answers a result with 200 only.
        assert_eq!(restate_outcome(201, body).unwrap(), PlaceOutcome::Rejected { status: 201 });
        assert!(matches!(restate_outcome(200, b"not json"), Err(ToolError::Answer(_))));
        assert!(matches!(restate_outcome(200, br#"{"status":"CONFIRMED"}"#), Err(ToolError::Answer(_))));
    }

    #[test]
    fn gateway_answers_map_to_outcomes() {
        let body = br#"{"order_id":"o1","status":"PENDING","items":[]}"#;
        let pending = PlaceOutcome::Accepted { order_id: "o1".into(), status: "PENDING".into() };
        assert_eq!(gateway_outcome(201, body).unwrap(), pending);
        assert_eq!(gateway_outcome(200, body).unwrap(), pending);
        assert_eq!(gateway_outcome(429, b"{}").unwrap(), PlaceOutcome::Rejected { status: 429 });
        assert!(matches!(gateway_outcome(201, b"<html>"), Err(ToolError::Answer(_))));
    }
}
