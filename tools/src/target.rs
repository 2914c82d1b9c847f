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
pub enum Orders {
    Gateway(Api),
    Restate(RestatePeer),
}

impl Orders {
    /// The client of `target`: `api` for the gateway; a plain HTTP client for a peer (Restate's
    /// ingress, or the Temporal peer's front, which answers alike).
    pub fn new(target: &Target, api: Api, timeout: Duration) -> Result<Self, ToolError> {
        Ok(match target {
            Target::Gateway => Self::Gateway(api),
            Target::Restate { url } | Target::Temporal { url } => {
                Self::Restate(RestatePeer::new(url, timeout)?)
            }
        })
    }

    /// Places the order with `idempotency_key`. Transport failures (connection refused,
    /// timeout) are the `Err`.
    pub async fn place_order(
        &self,
        customer_id: &str,
        items: &[(String, i64)],
        idempotency_key: &str,
    ) -> Result<PlaceOutcome, ToolError> {
        match self {
            Self::Gateway(api) => api.place_order(customer_id, items, idempotency_key).await,
            Self::Restate(peer) => peer.place_order(customer_id, items, idempotency_key).await,
        }
    }
}

/// The Restate peer's saga handler, through Restate's ingress (or the Temporal peer's front,
/// which takes and answers the same).
pub struct RestatePeer {
    http: reqwest::Client,
    url: String,
}

impl RestatePeer {
    pub fn new(url: &str, timeout: Duration) -> Result<Self, ToolError> {
        let http = reqwest::Client::builder().timeout(timeout).pool_max_idle_per_host(1024).build()?;
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
