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

#[cfg(feature = "test-hooks")]
mod inject;
#[cfg(feature = "test-hooks")]
mod request;
#[cfg(feature = "test-hooks")]
pub(crate) use inject::FaultInjector;
