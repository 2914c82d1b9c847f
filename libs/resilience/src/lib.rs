//! The resilience stack for every cross-service gRPC call.
//!
//! A service gets a resilient client in one line per downstream:
//!
//! ```ignore
//! let inventory = InventoryServiceClient::new(sagaworks_resilience::channel("inventory", &settings.inventory, identity.as_ref())?);
//! ```
//!
//! Build the channel once at startup and clone it (or the client) into every caller:
//! clones share the connection, breaker, bulkhead and retry budget of that downstream.
//!
//! # The stack
//!
//! Outermost first, one concern per module, each a tower `Layer` + `Service`:
//!
//! | layer | module | why here |
//! |---|---|---|
//! | metrics | [`channel`] | sees each logical call once, with its final outcome and total time |
//! | buffer body | `body` | the body must be `Bytes` before anything can send it twice |
//! | bulkhead | `bulkhead` | sheds a flood before any work (no buffering, no retry, no backoff timers); its permit covers all attempts of a call, bounding the load this client puts on the downstream |
//! | retry + budget | `retry` | re-runs everything below for each attempt |
//! | circuit breaker | `breaker` | inside the retry, so every attempt is recorded and an open breaker stops the remaining retries at once (its rejection is not retryable) |
//! | attempt | `sent` | below the breaker, so a rejected attempt is never seen: flags the call "maybe sent" on the first attempt that got past connecting |
//! | timeout | `timeout` | per attempt, inside the breaker, so an expired attempt counts as a failure and a slow one as slow |
//! | tonic `Channel` | | lazily connecting HTTP/2 transport |
//!
//! When the stack refuses or cuts a call the caller gets a `tonic::Status` marked with
//! metadata `x-sagaworks-rejection`; [`rejection`] classifies it: `CircuitOpen` (`UNAVAILABLE`) and
//! `BulkheadFull` (`RESOURCE_EXHAUSTED`) map to 503 + `Retry-After` in the gateway,
//! `Timeout` (`DEADLINE_EXCEEDED`) to 504; the saga treats them as step failures, and
//! one that was never sent (below) as a step that had no effect.
//!
//! # Was it sent?
//!
//! Every error status the channel returns also carries [`SENT_METADATA`]: `no` when no
//! attempt of the call can have reached the downstream (every attempt was rejected by
//! the breaker, the bulkhead shed it, or connecting failed: refused, connect timeout),
//! `maybe` otherwise (a timeout after sending, a reset, any answer of the downstream).
//! A connect failure comes back as `UNAVAILABLE`. [`never_sent`] reads the mark, so a
//! saga knows a failed step had no effect and needs no compensation; an open breaker
//! that cut the retries of an attempt that timed out is still `maybe`.
//!
//! # Settings
//!
//! [`ClientSettings`] is one section of a service's config, e.g. `[inventory]` in the
//! order service; env keys are the key path joined with `__`:
//!
//! | key | default | env (section `inventory`) |
//! |---|---|---|
//! | `url` | `http://127.0.0.1:7081` | `APP_INVENTORY__URL` |
//! | `timeout_ms` (per attempt) | 2000 | `APP_INVENTORY__TIMEOUT_MS` |
//! | `connect_timeout_ms` | 1000 | `APP_INVENTORY__CONNECT_TIMEOUT_MS` |
//! | `routes.<Method or /pkg.Svc/Method>` (ms) | none | `APP_INVENTORY__ROUTES__RESERVESTOCK`¹ |
//! | `retry.max_attempts` (incl. the first) | 3 | `APP_INVENTORY__RETRY__MAX_ATTEMPTS` |
//! | `retry.base_backoff_ms` | 50 | `APP_INVENTORY__RETRY__BASE_BACKOFF_MS` |
//! | `retry.max_backoff_ms` | 1000 | `APP_INVENTORY__RETRY__MAX_BACKOFF_MS` |
//! | `retry.budget_ttl_ms` (1000..=60000) | 10000 | `APP_INVENTORY__RETRY__BUDGET_TTL_MS` |
//! | `retry.budget_min_per_sec` | 10 | `APP_INVENTORY__RETRY__BUDGET_MIN_PER_SEC` |
//! | `retry.budget_ratio` (retries per call) | 0.2 | `APP_INVENTORY__RETRY__BUDGET_RATIO` |
//! | `breaker.sliding_window_size` (calls) | 20 | `APP_INVENTORY__BREAKER__SLIDING_WINDOW_SIZE` |
//! | `breaker.minimum_calls` | 10 | `APP_INVENTORY__BREAKER__MINIMUM_CALLS` |
//! | `breaker.failure_rate_threshold` (%) | 50 | `APP_INVENTORY__BREAKER__FAILURE_RATE_THRESHOLD` |
//! | `breaker.slow_call_duration_ms` | 2000 | `APP_INVENTORY__BREAKER__SLOW_CALL_DURATION_MS` |
//! | `breaker.slow_call_rate_threshold` (%) | 100 | `APP_INVENTORY__BREAKER__SLOW_CALL_RATE_THRESHOLD` |
//! | `breaker.wait_duration_open_ms` | 5000 | `APP_INVENTORY__BREAKER__WAIT_DURATION_OPEN_MS` |
//! | `breaker.permitted_calls_half_open` | 3 | `APP_INVENTORY__BREAKER__PERMITTED_CALLS_HALF_OPEN` |
//! | `bulkhead.max_concurrent_calls` | 64 | `APP_INVENTORY__BULKHEAD__MAX_CONCURRENT_CALLS` |
//!
//! ¹ Env keys arrive lower-cased, so method names in `routes` match ignoring ASCII case;
//! a full-path key only works from the TOML file (`[inventory.routes]`).
//!
//! [`channel`] validates the settings and returns [`ResilienceError`] instead of panicking.
//!
//! # Observability
//!
//! Metrics (via the `metrics` facade, label `downstream` = the channel's name):
//! `resilience_calls_total{downstream,outcome}` (`ok`, a gRPC code such as `unavailable`,
//! `circuit_open`, `bulkhead_full`, `timeout`, `transport_error`),
//! `resilience_call_duration_seconds{downstream}`, `resilience_retries_total{downstream}`,
//! `resilience_retry_budget_exhausted_total{downstream}`,
//! `resilience_rejections_total{downstream,reason}`,
//! `resilience_breaker_transitions_total{downstream,from,to}` and the gauge
//! `resilience_breaker_state{downstream}` (0 closed, 1 open, 2 half-open). Breaker
//! transitions are logged with `warn!`; each rejection is an `info!` event inside the
//! caller's current span (fields `downstream`, `reason`).
//!
//! # What is reused, what is written here, and why
//!
//! tower's `Retry` and `TpsBudget` are used; the timeout, bulkhead, backoff and
//! circuit breaker are written here. docs/design.md ("The resilience stack:
//! reused or written") says why, crate by crate.
//!
//! # Limits
//!
//! * The `sent` mark of a downstream's error sent in the trailers (not trailers-only) is
//!   whatever the downstream put there; unmarked counts as `maybe`.
//! * Unary calls only (the body is buffered whole).
//! * The gRPC code is read from the response headers (trailers-only responses, which is
//!   how tonic and grpc-go answer a failed unary call). A server that sends headers first
//!   and the error status only in the trailers is seen as a success by retry and breaker.

mod backoff;
mod body;
mod breaker;
mod bulkhead;
mod channel;
mod outcome;
mod rejection;
mod replicas;
mod retry;
mod sent;
mod settings;
#[cfg(test)]
mod testing;
mod timeout;

pub use backoff::Backoff;
pub use breaker::CircuitState;
pub use channel::{ResilientChannel, channel};
pub use rejection::{Rejection, rejection};
pub use sent::{SENT_METADATA, never_sent};
pub use settings::{BreakerSettings, BulkheadSettings, ClientSettings, RetrySettings};

/// Error type of [`ResilientChannel`]; tonic's client turns it into a `tonic::Status`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a channel could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ResilienceError {
    #[error("invalid downstream url {url}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("invalid client setting {key}: {reason}")]
    InvalidSetting { key: &'static str, reason: String },
}
