//! The resilience stack for every cross-service gRPC call.
//!
//! STUB: only the public API exists yet (a plain lazily-connected channel with
//! a per-call timeout); issue 5 fills in retry, circuit breaker and bulkhead.
//!
//! ```ignore
//! let channel = sagaworks_resilience::channel("inventory", &settings.inventory)?;
//! let client = InventoryServiceClient::new(channel);
//! ```

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Settings of one downstream client.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ClientSettings {
    /// `http://host:port` of the downstream gRPC server.
    pub url: String,
    /// Per-attempt timeout unless `routes` names the method.
    pub timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// Per-method timeouts, keyed by method name (`ReserveStock`) or full path.
    pub routes: BTreeMap<String, u64>,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self { url: "http://127.0.0.1:50051".into(), timeout_ms: 2_000, connect_timeout_ms: 1_000, routes: BTreeMap::new() }
    }
}

impl ClientSettings {
    pub fn with_url(url: impl Into<String>) -> Self {
        Self { url: url.into(), ..Default::default() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ResilienceError {
    #[error("invalid downstream url {url}: {reason}")]
    InvalidUrl { url: String, reason: String },
}

/// Why the stack refused or cut a call; carried on the `tonic::Status` it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The circuit breaker is open; try again after the given time.
    CircuitOpen { retry_after: Duration },
    /// Too many calls in flight to this downstream.
    BulkheadFull,
    /// No answer within the call's timeout.
    Timeout,
}

/// Metadata key that marks a status produced by the stack itself.
pub const REJECTION_METADATA: &str = "x-sagaworks-rejection";

/// Classifies a status that came out of a resilient channel.
pub fn rejection(status: &tonic::Status) -> Option<Rejection> {
    let v = status.metadata().get(REJECTION_METADATA)?.to_str().ok()?;
    match v {
        "bulkhead_full" => Some(Rejection::BulkheadFull),
        "timeout" => Some(Rejection::Timeout),
        s if s.starts_with("circuit_open") => {
            let ms = s.split(':').nth(1).and_then(|m| m.parse().ok()).unwrap_or(1000);
            Some(Rejection::CircuitOpen { retry_after: Duration::from_millis(ms) })
        }
        _ => None,
    }
}

/// A cloneable gRPC channel to one downstream with the resilience stack applied.
pub type ResilientChannel = tonic::transport::Channel;

/// Builds the channel for downstream `name` (used in metrics and logs). Connects lazily.
pub fn channel(name: &'static str, settings: &ClientSettings) -> Result<ResilientChannel, ResilienceError> {
    let _ = name;
    let endpoint = tonic::transport::Endpoint::from_shared(settings.url.clone())
        .map_err(|e| ResilienceError::InvalidUrl { url: settings.url.clone(), reason: e.to_string() })?
        .connect_timeout(Duration::from_millis(settings.connect_timeout_ms))
        .timeout(Duration::from_millis(settings.timeout_ms));
    Ok(endpoint.connect_lazy())
}
