//! What `PUT /fault` asks for (the cargo feature `test-hooks`).

use serde::{Deserialize, Serialize};

/// The gRPC code a failing call is answered with.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FaultError {
    Unavailable,
    Internal,
    Unknown,
    DeadlineExceeded,
    ResourceExhausted,
    Aborted,
}

impl FaultError {
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
pub(crate) struct Fault {
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
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
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

    pub(crate) fn matches(&self, path: &str) -> bool {
        let method = path.rsplit('/').next().unwrap_or(path);
        self.methods.is_empty() || self.methods.iter().any(|m| m == path || m.eq_ignore_ascii_case(method))
    }
}
