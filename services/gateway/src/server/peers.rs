//! The per-peer connection cap: at most `max_connections_per_peer` connections at once
//! from one client network (an IPv4 address, an IPv6 /64, as the rate limits count
//! them, [`crate::ratelimit::client_network`]), so one host cannot take every slot of
//! `max_connections`. `rate_limit.trusted_proxies` are exempt: every client behind the
//! ingress arrives from it, so there the cap belongs to the ingress.

use crate::ratelimit::{TrustedProxies, client_network};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// The open connections of each peer.
#[derive(Debug)]
pub struct PeerCaps {
    max: usize,
    exempt: TrustedProxies,
    open: Mutex<HashMap<String, usize>>,
}

impl PeerCaps {
    pub fn new(max: usize, exempt: TrustedProxies) -> Arc<Self> {
        Arc::new(Self { max, exempt, open: Mutex::new(HashMap::new()) })
    }

    /// A slot for one more connection of `peer`, held until it is dropped; `None` when
    /// the peer already holds its cap's worth.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<PeerSlot> {
        let peer = peer.to_canonical();
        if self.exempt.trusts(peer) {
            return Some(PeerSlot { caps: Arc::clone(self), key: None });
        }
        let key = client_network(peer);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(key.clone()).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(PeerSlot { caps: Arc::clone(self), key: Some(key) })
    }

    /// The connections `peer` holds now.
    pub fn open(&self, peer: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(&client_network(peer.to_canonical())).copied().unwrap_or(0)
    }
}

/// One connection counted against its peer's cap (see [`PeerCaps::admit`]).
#[derive(Debug)]
pub struct PeerSlot {
    caps: Arc<PeerCaps>,
    key: Option<String>,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let mut open = self.caps.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn each_peer_has_its_own_cap_and_a_closed_connection_frees_its_slot() {
        let caps = PeerCaps::new(2, TrustedProxies::default());
        let held: Vec<_> = (0..2).map(|_| caps.admit(ip("192.0.2.1")).expect("within the cap")).collect();
        assert!(caps.admit(ip("192.0.2.1")).is_none(), "over the cap");
        assert!(caps.admit(ip("::ffff:192.0.2.1")).is_none(), "the same peer, mapped to IPv6");
        assert!(caps.admit(ip("192.0.2.2")).is_some(), "another peer");
        drop(held);
        assert_eq!(caps.open(ip("192.0.2.1")), 0);
        assert!(caps.open.lock().unwrap().is_empty(), "no entry left for a peer without connections");
        assert!(caps.admit(ip("192.0.2.1")).is_some(), "a freed slot");
    }

    #[test]
    fn an_ipv6_peer_counts_by_its_64_and_trusted_proxies_are_exempt() {
        let proxies = TrustedProxies::parse(&["10.0.0.0/8".to_string()]).unwrap();
        let caps = PeerCaps::new(1, proxies);
        let _one = caps.admit(ip("2001:db8:1:2::1")).unwrap();
        assert!(caps.admit(ip("2001:db8:1:2::ffff")).is_none(), "the same /64");
        assert!(caps.admit(ip("2001:db8:1:3::1")).is_some(), "another /64");
        let behind_the_ingress: Vec<_> = (0..10).map(|_| caps.admit(ip("10.1.2.3"))).collect();
        assert!(behind_the_ingress.iter().all(Option::is_some), "a trusted proxy has no per-peer cap");
    }
}
