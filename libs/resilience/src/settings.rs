//! Configuration of one downstream client: where it is and how the stack treats it.
//!
//! Every struct is `#[serde(default)]`, so a service's TOML or `APP_*` env only has to
//! name what it changes. [`ClientSettings::validate`] turns out-of-range values into a
//! typed [`ResilienceError`] instead of a panic deep inside a layer.

use crate::ResilienceError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Settings of one downstream client.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ClientSettings {
    /// `http://host:port` of the downstream gRPC server; several, comma-separated
    /// (`http://a:7081,http://b:7081`), are replicas of it, and calls are
    /// balanced over them (power of two choices over their connections' load).
    pub url: String,
    /// Per-attempt timeout unless `routes` names the method.
    pub timeout_ms: u64,
    /// Timeout of establishing the TCP/HTTP2 connection.
    pub connect_timeout_ms: u64,
    /// Per-method timeouts, keyed by method name (`ReserveStock`) or full path.
    pub routes: BTreeMap<String, u64>,
    /// Retry with exponential backoff, full jitter and a retry budget.
    pub retry: RetrySettings,
    /// Circuit breaker (Resilience4j semantics, count-based window).
    pub breaker: BreakerSettings,
    /// Maximum concurrent calls to this downstream.
    pub bulkhead: BulkheadSettings,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:7081".into(),
            timeout_ms: 2_000,
            connect_timeout_ms: 1_000,
            routes: BTreeMap::new(),
            retry: RetrySettings::default(),
            breaker: BreakerSettings::default(),
            bulkhead: BulkheadSettings::default(),
        }
    }
}

impl ClientSettings {
    /// Default settings pointing at `url`.
    pub fn with_url(url: impl Into<String>) -> Self {
        Self { url: url.into(), ..Default::default() }
    }

    /// The downstream's URLs: `url` split at commas, blanks trimmed, empty
    /// parts dropped.
    pub fn urls(&self) -> Vec<&str> {
        self.url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect()
    }

    /// Per-attempt timeout of the call to `path` (`/package.Service/Method`): a `routes`
    /// entry for the full path wins, then one for the method name (matched ignoring ASCII
    /// case, because env keys arrive lower-cased), then `timeout_ms`.
    pub(crate) fn timeout_for(&self, path: &str) -> Duration {
        let method = path.rsplit('/').next().unwrap_or(path);
        let ms = self
            .routes
            .get(path)
            .or_else(|| self.routes.iter().find(|(k, _)| k.eq_ignore_ascii_case(method)).map(|(_, v)| v))
            .copied()
            .unwrap_or(self.timeout_ms);
        Duration::from_millis(ms)
    }

    /// Checks every value the layers rely on.
    pub fn validate(&self) -> Result<(), ResilienceError> {
        positive("timeout_ms", self.timeout_ms)?;
        positive("connect_timeout_ms", self.connect_timeout_ms)?;
        for (route, ms) in &self.routes {
            if *ms == 0 {
                return Err(invalid("routes", format!("timeout of {route} must be > 0")));
            }
        }
        self.retry.validate()?;
        self.breaker.validate()?;
        positive("bulkhead.max_concurrent_calls", self.bulkhead.max_concurrent_calls as u64)
    }
}

/// Retry of retryable outcomes (transport errors, `UNAVAILABLE`, `DEADLINE_EXCEEDED`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct RetrySettings {
    /// Attempts per call including the first one; `1` disables retries.
    pub max_attempts: u32,
    /// Backoff base: retry `n` (from 0) sleeps `random(0, min(max, base * 2^n))`.
    pub base_backoff_ms: u64,
    /// Backoff cap.
    pub max_backoff_ms: u64,
    /// How long a call counts towards the budget (1 000 ..= 60 000 ms).
    pub budget_ttl_ms: u64,
    /// Retries per second always allowed, even with little traffic.
    pub budget_min_per_sec: u32,
    /// Retries allowed on top, as a fraction of calls (`0.2` = one retry per 5 calls).
    pub budget_ratio: f32,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base_backoff_ms: 50,
            max_backoff_ms: 1_000,
            budget_ttl_ms: 10_000,
            budget_min_per_sec: 10,
            budget_ratio: 0.2,
        }
    }
}

impl RetrySettings {
    fn validate(&self) -> Result<(), ResilienceError> {
        positive("retry.max_attempts", self.max_attempts as u64)?;
        if self.max_backoff_ms < self.base_backoff_ms {
            return Err(invalid("retry.max_backoff_ms", "must be >= retry.base_backoff_ms".into()));
        }
        if !(1_000..=60_000).contains(&self.budget_ttl_ms) {
            return Err(invalid("retry.budget_ttl_ms", "must be within 1000..=60000".into()));
        }
        if self.budget_min_per_sec >= i32::MAX as u32 {
            return Err(invalid("retry.budget_min_per_sec", "too large".into()));
        }
        if !(0.0..=1000.0).contains(&self.budget_ratio) {
            return Err(invalid("retry.budget_ratio", "must be within 0..=1000".into()));
        }
        Ok(())
    }
}

/// Circuit breaker over the last `sliding_window_size` recorded attempts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct BreakerSettings {
    /// Number of most recent attempts the failure and slow-call rates are computed over.
    pub sliding_window_size: usize,
    /// Attempts that must be recorded before the rates are evaluated at all.
    pub minimum_calls: usize,
    /// Open when this percentage (0 < x <= 100) of the window failed.
    pub failure_rate_threshold: f64,
    /// An attempt taking at least this long is slow.
    pub slow_call_duration_ms: u64,
    /// Open when this percentage (0 < x <= 100) of the window was slow.
    pub slow_call_rate_threshold: f64,
    /// Time spent open (rejecting at once) before probing in half-open.
    pub wait_duration_open_ms: u64,
    /// Probes let through in half-open; their failure rate decides closed or open.
    pub permitted_calls_half_open: usize,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            sliding_window_size: 20,
            minimum_calls: 10,
            failure_rate_threshold: 50.0,
            slow_call_duration_ms: 2_000,
            slow_call_rate_threshold: 100.0,
            wait_duration_open_ms: 5_000,
            permitted_calls_half_open: 3,
        }
    }
}

impl BreakerSettings {
    fn validate(&self) -> Result<(), ResilienceError> {
        positive("breaker.sliding_window_size", self.sliding_window_size as u64)?;
        positive("breaker.minimum_calls", self.minimum_calls as u64)?;
        positive("breaker.permitted_calls_half_open", self.permitted_calls_half_open as u64)?;
        percentage("breaker.failure_rate_threshold", self.failure_rate_threshold)?;
        percentage("breaker.slow_call_rate_threshold", self.slow_call_rate_threshold)
    }
}

/// Bulkhead: calls in flight to this downstream beyond the limit are rejected at once.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct BulkheadSettings {
    /// Maximum calls in flight (shared by every clone of the channel).
    pub max_concurrent_calls: usize,
}

impl Default for BulkheadSettings {
    fn default() -> Self {
        Self { max_concurrent_calls: 64 }
    }
}

fn invalid(key: &'static str, reason: String) -> ResilienceError {
    ResilienceError::InvalidSetting { key, reason }
}

fn positive(key: &'static str, value: u64) -> Result<(), ResilienceError> {
    if value == 0 { Err(invalid(key, "must be > 0".into())) } else { Ok(()) }
}

fn percentage(key: &'static str, value: f64) -> Result<(), ResilienceError> {
    if value > 0.0 && value <= 100.0 { Ok(()) } else { Err(invalid(key, "must be within (0, 100]".into())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_by_full_path_wins_over_method_name_and_default() {
        let mut s = ClientSettings::default();
        s.routes.insert("reservestock".into(), 300);
        s.routes.insert("/sagaworks.inventory.v1.InventoryService/GetStock".into(), 100);
        s.routes.insert("GetStock".into(), 900);
        let svc = "/sagaworks.inventory.v1.InventoryService";
        assert_eq!(s.timeout_for(&format!("{svc}/ReserveStock")), Duration::from_millis(300));
        assert_eq!(s.timeout_for(&format!("{svc}/GetStock")), Duration::from_millis(100));
        assert_eq!(s.timeout_for(&format!("{svc}/AddStock")), Duration::from_millis(2_000));
    }

    #[test]
    fn out_of_range_values_are_rejected_with_their_key() {
        let mut s = ClientSettings::default();
        assert!(s.validate().is_ok());
        s.breaker.failure_rate_threshold = 0.0;
        let err = s.validate().unwrap_err();
        assert!(err.to_string().contains("breaker.failure_rate_threshold"), "{err}");
        let mut s = ClientSettings::default();
        s.retry.budget_ttl_ms = 500;
        assert!(s.validate().unwrap_err().to_string().contains("retry.budget_ttl_ms"));
        let mut s = ClientSettings::default();
        s.bulkhead.max_concurrent_calls = 0;
        assert!(s.validate().is_err());
        let mut s = ClientSettings::default();
        s.retry.max_backoff_ms = s.retry.base_backoff_ms - 1;
        assert!(s.validate().unwrap_err().to_string().contains("retry.max_backoff_ms"));
        s.retry.max_backoff_ms = s.retry.base_backoff_ms;
        assert!(s.validate().is_ok(), "a cap equal to the base is a constant ceiling");
    }

    #[test]
    fn partial_toml_keeps_defaults() {
        let s: ClientSettings =
            serde_json::from_str(r#"{"url":"http://x:1","retry":{"max_attempts":5}}"#).unwrap();
        assert_eq!(s.retry.max_attempts, 5);
        assert_eq!(s.retry.base_backoff_ms, 50);
        assert_eq!(s.breaker, BreakerSettings::default());
    }
}
