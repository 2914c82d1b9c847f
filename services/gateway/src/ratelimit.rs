//! Per-client rate limiting: one GCRA bucket per client key (governor's
//! keyed limiter), `burst` requests at once, refilled at `per_second` (or one
//! every `refill_interval_ms`).
//!
//! The key is the verified token subject, else the client's IP address
//! (see [`crate::auth::guard`]): the peer's, or behind one of
//! `rate_limit.trusted_proxies`, the one [`TrustedProxies::client_ip`] reads
//! from `X-Forwarded-For`. Buckets of clients that have been quiet long
//! enough to be full again are dropped every few thousand requests, so the
//! map stays as large as the set of recently active clients.

use crate::config::RateLimitSettings;
use crate::error::ApiError;
use axum::http::HeaderMap;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use ipnet::IpNet;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Checks between two sweeps of idle buckets.
const SWEEP_EVERY: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum RateLimitError {
    #[error("rate_limit.{0} must be at least 1 (or set rate_limit.enabled = false)")]
    Zero(&'static str),
    #[error(
        "rate_limit.trusted_proxies (APP_RATE_LIMIT__TRUSTED_PROXIES): {0:?} is neither an IP address \
         nor a CIDR block"
    )]
    TrustedProxy(String),
}

pub struct Limiter {
    buckets: DefaultKeyedRateLimiter<String>,
    clock: DefaultClock,
    checks: AtomicU64,
    proxies: TrustedProxies,
}

impl Limiter {
    /// `None` when rate limiting is disabled.
    pub fn new(settings: &RateLimitSettings) -> Result<Option<Self>, RateLimitError> {
        let proxies = TrustedProxies::parse(&settings.trusted_proxies)?;
        if !settings.enabled {
            return Ok(None);
        }
        let burst = NonZeroU32::new(settings.burst).ok_or(RateLimitError::Zero("burst"))?;
        let quota = match settings.refill_interval_ms {
            Some(ms) => Quota::with_period(Duration::from_millis(ms))
                .ok_or(RateLimitError::Zero("refill_interval_ms"))?,
            None => Quota::per_second(
                NonZeroU32::new(settings.per_second).ok_or(RateLimitError::Zero("per_second"))?,
            ),
        };
        Ok(Some(Self {
            buckets: DefaultKeyedRateLimiter::keyed(quota.allow_burst(burst)),
            clock: DefaultClock::default(),
            checks: 0.into(),
            proxies,
        }))
    }

    /// The bucket of a request: `sub:<subject>` for a verified token, else
    /// `ip:<client address>` (see [`TrustedProxies::client_ip`]), an IPv6 client by its
    /// /64 ([`client_network`]).
    pub fn key(&self, subject: Option<&str>, peer: Option<SocketAddr>, headers: &HeaderMap) -> String {
        match (subject, peer) {
            (Some(subject), _) => format!("sub:{subject}"),
            (None, Some(peer)) => {
                format!("ip:{}", client_network(self.proxies.client_ip(peer.ip(), headers)))
            }
            (None, None) => "ip:unknown".to_string(),
        }
    }

    /// Takes one request from `key`'s bucket, or says when the next one fits.
    pub fn check(&self, key: &str) -> Result<(), ApiError> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.buckets.retain_recent();
        }
        self.buckets.check_key(&key.to_string()).map_err(|not_until| ApiError::RateLimited {
            retry_after: not_until.wait_time_from(self.clock.now()),
        })
    }
}

/// What an anonymous client is limited as: an IPv4 address itself, an IPv6 address by
/// its /64. A subscriber usually gets a /64 or more, so keying by the address would give
/// one client 2^64 buckets.
pub fn client_network(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match IpNet::new(IpAddr::V6(v6), 64) {
            Ok(net) => net.trunc().to_string(),
            Err(_) => v6.to_string(),
        },
    }
}

/// `rate_limit.trusted_proxies`: the peers whose `X-Forwarded-For` is believed.
#[derive(Debug, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// IP addresses (`192.0.2.7`, `::1`) and CIDR blocks (`10.0.0.0/8`).
    pub fn parse(entries: &[String]) -> Result<Self, RateLimitError> {
        entries
            .iter()
            .map(|entry| {
                let entry = entry.trim();
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| RateLimitError::TrustedProxy(entry.to_string()))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether `ip` is one of the proxies.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The address a request is limited by. The peer's own, unless the peer is
    /// a trusted proxy: then `X-Forwarded-For` (all its lines, in order) is read
    /// from the right, each trusted proxy there is stepped over, and the first
    /// address that is not one is the client. Everything left of it was written
    /// by the client and is never believed. An entry that is no IP address ends
    /// the walk at the last trusted hop, and a chain of trusted proxies only
    /// ends at its left-most one: either way, a bucket a client cannot choose.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer.to_canonical();
        if !self.trusts(client) {
            return client;
        }
        let mut hops = Vec::new();
        for value in headers.get_all("x-forwarded-for") {
            match value.to_str() {
                Ok(text) => hops.extend(text.split(',')),
                // Not text: no address of a proxy, so it ends the walk there.
                Err(_) => hops.push(""),
            }
        }
        for hop in hops.into_iter().rev() {
            let Some(ip) = parse_hop(hop) else { break };
            client = ip;
            if !self.trusts(ip) {
                break;
            }
        }
        client
    }
}

/// One `X-Forwarded-For` entry: an address, possibly with a port (`192.0.2.1:443`,
/// `[2001:db8::1]:443`) or in brackets.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    hop.parse::<IpAddr>()
        .or_else(|_| hop.parse::<SocketAddr>().map(|a| a.ip()))
        .or_else(|_| hop.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>())
        .ok()
        .map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limiter(per_second: u32, burst: u32) -> Limiter {
        Limiter::new(&RateLimitSettings { per_second, burst, ..Default::default() }).unwrap().unwrap()
    }

    fn rate(enabled: bool, per_second: u32, burst: u32) -> RateLimitSettings {
        RateLimitSettings { enabled, per_second, burst, ..Default::default() }
    }

    #[test]
    fn burst_then_refusal_with_the_wait_then_refill() {
        let l = limiter(10, 3);
        for _ in 0..3 {
            l.check("a").unwrap();
        }
        match l.check("a") {
            Err(ApiError::RateLimited { retry_after }) => {
                assert!(
                    retry_after > Duration::ZERO && retry_after <= Duration::from_millis(100),
                    "{retry_after:?}"
                )
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        // Another client has its own bucket.
        l.check("b").unwrap();
        std::thread::sleep(Duration::from_millis(120));
        l.check("a").unwrap();
    }

    #[test]
    fn zero_rates_are_refused_and_disabled_means_none() {
        assert!(Limiter::new(&rate(true, 0, 1)).is_err());
        assert!(Limiter::new(&rate(true, 1, 0)).is_err());
        assert!(Limiter::new(&rate(false, 0, 0)).unwrap().is_none());
        let zero_interval = RateLimitSettings { refill_interval_ms: Some(0), ..Default::default() };
        assert!(matches!(Limiter::new(&zero_interval), Err(RateLimitError::Zero("refill_interval_ms"))));
    }

    #[test]
    fn a_refill_interval_replaces_per_second() {
        let hourly =
            RateLimitSettings { burst: 2, refill_interval_ms: Some(3_600_000), ..Default::default() };
        let l = Limiter::new(&hourly).unwrap().unwrap();
        l.check("a").unwrap();
        l.check("a").unwrap();
        match l.check("a") {
            Err(ApiError::RateLimited { retry_after }) => {
                assert!(retry_after > Duration::from_secs(3_500), "{retry_after:?}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn proxies(entries: &[&str]) -> TrustedProxies {
        TrustedProxies::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn forwarded(lines: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append("x-forwarded-for", line.parse().unwrap());
        }
        headers
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_client_address_is_read_from_x_forwarded_for_of_trusted_proxies_only() {
        let trusted = proxies(&["10.0.0.0/8", "192.0.2.7", "2001:db8::/32"]);
        let proxy = ip("10.1.2.3");
        let client = |peer: &str, lines: &[&str]| trusted.client_ip(ip(peer), &forwarded(lines));
        // An untrusted peer's header is ignored.
        assert_eq!(client("198.51.100.9", &["203.0.113.1"]), ip("198.51.100.9"));
        // A trusted peer: the right-most entry that is not a trusted proxy.
        assert_eq!(client("10.1.2.3", &["203.0.113.1"]), ip("203.0.113.1"));
        assert_eq!(
            client("10.1.2.3", &["198.51.100.66, 203.0.113.1"]),
            ip("203.0.113.1"),
            "left of it: the client's"
        );
        assert_eq!(
            client("10.1.2.3", &["198.51.100.66, 203.0.113.1, 192.0.2.7, 10.9.9.9"]),
            ip("203.0.113.1")
        );
        assert_eq!(
            client("10.1.2.3", &["198.51.100.66", "203.0.113.1, 192.0.2.7"]),
            ip("203.0.113.1"),
            "lines in order"
        );
        assert_eq!(client("10.1.2.3", &["203.0.113.1:4711"]), ip("203.0.113.1"));
        assert_eq!(client("10.1.2.3", &["[2001:db9::1]:443"]), ip("2001:db9::1"));
        // No header, only proxies, or garbage: a trusted hop, never a value the client chose.
        assert_eq!(trusted.client_ip(proxy, &HeaderMap::new()), proxy);
        assert_eq!(client("10.1.2.3", &["192.0.2.7, 10.9.9.9"]), ip("192.0.2.7"));
        assert_eq!(client("10.1.2.3", &["203.0.113.1, bogus"]), proxy);
        assert_eq!(client("10.1.2.3", &["203.0.113.1, 10.9.9.9, unknown"]), proxy);
        // An IPv4 peer seen through a dual-stack socket.
        assert_eq!(client("::ffff:10.1.2.3", &["203.0.113.1"]), ip("203.0.113.1"));
        // Nothing trusted by default.
        let none = TrustedProxies::default();
        assert_eq!(none.client_ip(proxy, &forwarded(&["203.0.113.1"])), proxy);
    }

    #[test]
    fn trusted_proxies_must_be_addresses_or_cidr_blocks() {
        for bad in ["10.0.0.0/33", "ingress", "10.0.0.*"] {
            let err = TrustedProxies::parse(&[bad.to_string()]).unwrap_err();
            assert!(err.to_string().contains("APP_RATE_LIMIT__TRUSTED_PROXIES"), "{err}");
        }
        let disabled =
            RateLimitSettings { enabled: false, trusted_proxies: vec!["nope".into()], ..Default::default() };
        assert!(Limiter::new(&disabled).is_err(), "checked even when rate limiting is off");
    }

    #[test]
    fn keys_are_the_subject_else_the_client_address() {
        let settings = RateLimitSettings { trusted_proxies: vec!["127.0.0.1".into()], ..Default::default() };
        let l = Limiter::new(&settings).unwrap().unwrap();
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let headers = forwarded(&["203.0.113.1"]);
        assert_eq!(l.key(Some("alice"), Some(peer), &headers), "sub:alice");
        assert_eq!(l.key(None, Some(peer), &headers), "ip:203.0.113.1");
        assert_eq!(l.key(None, None, &headers), "ip:unknown");
        // IPv6 clients by their /64: two addresses of one network share a bucket.
        let a = forwarded(&["2001:db8:1:2:aaaa::1"]);
        let b = forwarded(&["2001:db8:1:2:ffff:eeee:dddd:cccc"]);
        assert_eq!(l.key(None, Some(peer), &a), "ip:2001:db8:1:2::/64");
        assert_eq!(l.key(None, Some(peer), &a), l.key(None, Some(peer), &b));
        assert_ne!(l.key(None, Some(peer), &a), l.key(None, Some(peer), &forwarded(&["2001:db8:1:3::1"])));
    }
}
