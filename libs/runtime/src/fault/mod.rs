//! Fault injection: make this service slow or failing at run time, for tests and chaos
//! drills. **Off by default and must stay off in production**: anyone who can reach the
//! HTTP port could then slow down or fail every call.
//!
//! With `[fault] enabled = true` (`APP_FAULT__ENABLED=true`) a [`ServiceHost`] puts a
//! [`FaultLayer`] in front of its gRPC routes and serves, on its HTTP port:
//!
//! * `PUT /fault` with a [`Fault`], e.g.
//!   `{"delay_ms": 800, "error": "unavailable", "error_rate": 1.0, "methods": ["ReserveStock"]}`
//!   or `{"hold": true, "methods": ["GetStock"]}`: from now on, matching calls are delayed,
//!   held and/or failed; answers the active fault. It replaces the fault before, which
//!   releases the calls that one held.
//! * `GET /fault`: the active fault (`null` when none).
//! * `DELETE /fault`: back to normal (204); releases the held calls.
//!
//! When disabled these routes don't exist (404) and no layer is added. The injector is
//! built only with the cargo feature `test-hooks`: without it a service refuses
//! `fault.enabled` in every environment ([`crate::host::HostSettings::check`]), and
//! the binary holds none of it. Release images leave the feature off.
//!
//! What a matching call sees:
//!
//! * `delay_ms` only: the call runs as usual and its answer is held back `delay_ms`
//!   (the work is done, the answer is late: a caller that times out may still have had
//!   its effect, exactly the case a saga must compensate).
//! * `hold: true` (instead of `delay_ms`): like a delay that ends only when the fault is
//!   cleared or replaced (or after 10 minutes, so a forgotten hold cannot keep a call for
//!   ever). Tests use it to synchronise on events instead of on the clock: while the test
//!   holds a call, it *knows* the call has not been answered, so anything that answers
//!   meanwhile (a caller's timeout, a bulkhead shedding the calls beyond its limit, a
//!   health probe) did so without waiting for it. A service stopping gracefully waits for
//!   its held calls: clear the fault first.
//! * `error`: the call is **not** run; after `delay_ms` (or, with `hold`, once released)
//!   it is answered with that gRPC code (a trailers-only response, as a real server
//!   answers a failed unary call). `error_rate` (0..=1, default 1) is the share of
//!   matching calls that fail; it is deterministic (of every `n` matching calls,
//!   `round(n * rate)` fail, evenly spread), so tests can count on it. The others are
//!   only delayed (or held).
//! * `max_calls`: only the first `max_calls` matching calls since the fault was set are
//!   touched; later ones pass untouched (e.g. hold a call's first attempt, let its retry
//!   through).
//!
//! `methods` names gRPC methods (`ReserveStock`, ignoring ASCII case) or full paths
//! (`/sagaworks.inventory.v1.InventoryService/ReserveStock`); empty means every call.
//! Each injected fault is counted in `faults_injected_total{method,kind}` (`delay`, `hold`,
//! `error`), the calls held right now in the gauge `faults_held_calls{method}`, and every
//! change of the fault is logged with `warn!`.
//!
//! [`ServiceHost`]: crate::host::ServiceHost

use serde::{Deserialize, Serialize};

/// `[fault]` section of a service's settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct FaultSettings {
    /// Serve `/fault` and put the fault layer on the gRPC server. Never in production.
    pub enabled: bool,
}

/// The gRPC code a failing call is answered with.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FaultError {
    Unavailable,
    Internal,
    Unknown,
    DeadlineExceeded,
    ResourceExhausted,
    Aborted,
}

impl FaultError {
    #[cfg(feature = "test-hooks")]
    pub(crate) fn code(self) -> tonic::Code {
        match self {
            FaultError::Unavailable => tonic::Code::Unavailable,
            FaultError::Internal => tonic::Code::Internal,
            FaultError::Unknown => tonic::Code::Unknown,
            FaultError::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            FaultError::ResourceExhausted => tonic::Code::ResourceExhausted,
            FaultError::Aborted => tonic::Code::Aborted,
        }
    }
}

/// What to do to matching calls (the body of `PUT /fault`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// Hold each matching call (its answer, or its error) back this long.
    #[serde(default)]
    pub delay_ms: u64,
    /// Hold each matching call (its answer, or its error) back until this fault is
    /// cleared or replaced, instead of `delay_ms`.
    #[serde(default)]
    pub hold: bool,
    /// Fail matching calls with this code instead of running them.
    #[serde(default)]
    pub error: Option<FaultError>,
    /// Share of matching calls that fail (0..=1).
    #[serde(default = "always")]
    pub error_rate: f64,
    /// Method names or full paths; empty: every call.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Touch only the first this many matching calls; `None`: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
}

fn always() -> f64 {
    1.0
}

/// The longest delay a fault may ask for, and the longest a call is held.
pub(crate) const MAX_DELAY_MS: u64 = 600_000;

impl Fault {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err(("error_rate", format!("must be between 0 and 1, got {}", self.error_rate)));
        }
        if self.delay_ms > MAX_DELAY_MS {
            return Err(("delay_ms", format!("must be at most {MAX_DELAY_MS}")));
        }
        if self.hold && self.delay_ms > 0 {
            return Err(("delay_ms", "must be 0 with hold (a held call waits until released)".into()));
        }
        if self.max_calls == Some(0) {
            return Err(("max_calls", "must be at least 1 (or left out: every call)".into()));
        }
        if self.methods.iter().any(|m| m.trim().is_empty()) {
            return Err(("methods", "must not contain empty names".into()));
        }
        Ok(())
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn matches(&self, path: &str) -> bool {
        let method = path.rsplit('/').next().unwrap_or(path);
        self.methods.is_empty() || self.methods.iter().any(|m| m == path || m.eq_ignore_ascii_case(method))
    }
}

#[cfg(feature = "test-hooks")]
mod inject;
#[cfg(feature = "test-hooks")]
pub use inject::{FaultInjector, FaultLayer, FaultService};
