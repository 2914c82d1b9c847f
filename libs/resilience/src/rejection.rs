//! Statuses the stack produces itself, and how a caller recognises them.
//!
//! When a layer refuses (breaker open, bulkhead full) or cuts (timeout) a call, it fails
//! the call with a boxed [`tonic::Status`]; tonic's client hands that `Status` to the
//! caller unchanged (`Status::from_error` downcasts it). The status carries
//! metadata `x-sagaworks-rejection` so [`rejection`] can tell it from a status the downstream sent.
//! Every rejection is also counted (`resilience_rejections_total{downstream,reason}`) and
//! logged as an event inside the caller's current span.

use crate::BoxError;
use std::time::Duration;
use tonic::metadata::MetadataValue;

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

/// Every [`Rejection::reason`].
pub(crate) const REASONS: [&str; 3] = ["circuit_open", "bulkhead_full", "timeout"];

/// Metadata key that marks a status produced by the stack itself.
pub(crate) const REJECTION_METADATA: &str = "x-sagaworks-rejection";

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

impl Rejection {
    /// Label used in metrics (`reason`) and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::CircuitOpen { .. } => "circuit_open",
            Rejection::BulkheadFull => "bulkhead_full",
            Rejection::Timeout => "timeout",
        }
    }

    /// The marked status a caller receives for this rejection.
    pub fn to_status(&self, downstream: &str) -> tonic::Status {
        let (mut status, mark) = match self {
            Rejection::CircuitOpen { retry_after } => (
                tonic::Status::unavailable(format!("circuit breaker for {downstream} is open")),
                format!("circuit_open:{}", retry_after.as_millis()),
            ),
            Rejection::BulkheadFull => (
                tonic::Status::resource_exhausted(format!("too many calls in flight to {downstream}")),
                "bulkhead_full".to_owned(),
            ),
            Rejection::Timeout => (
                tonic::Status::deadline_exceeded(format!("{downstream} did not answer in time")),
                "timeout".to_owned(),
            ),
        };
        // The marks are plain ASCII, so the conversion cannot fail.
        if let Ok(value) = MetadataValue::try_from(mark) {
            status.metadata_mut().insert(REJECTION_METADATA, value);
        }
        status
    }
}

/// Records a rejection (metric + event in the current span) and returns it as the error
/// the layer fails the call with.
pub(crate) fn reject(downstream: &'static str, rejection: Rejection) -> BoxError {
    let reason = rejection.reason();
    metrics::counter!("resilience_rejections_total", "downstream" => downstream, "reason" => reason)
        .increment(1);
    match rejection {
        Rejection::CircuitOpen { retry_after } => tracing::info!(
            downstream,
            reason,
            retry_after_ms = retry_after.as_millis() as u64,
            "call rejected: circuit breaker open"
        ),
        _ => tracing::info!(downstream, reason, "call rejected"),
    }
    Box::new(rejection.to_status(downstream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_lists_every_rejection_reason() {
        let all = [
            Rejection::CircuitOpen { retry_after: Duration::from_secs(1) },
            Rejection::BulkheadFull,
            Rejection::Timeout,
        ];
        assert_eq!(all.map(|r| r.reason()), REASONS);
    }

    #[test]
    fn every_rejection_round_trips_through_its_status() {
        for r in [
            Rejection::CircuitOpen { retry_after: Duration::from_millis(1234) },
            Rejection::BulkheadFull,
            Rejection::Timeout,
        ] {
            assert_eq!(rejection(&r.to_status("inventory")), Some(r));
        }
        assert_eq!(Rejection::BulkheadFull.to_status("x").code(), tonic::Code::ResourceExhausted);
        assert_eq!(Rejection::Timeout.to_status("x").code(), tonic::Code::DeadlineExceeded);
        let open = Rejection::CircuitOpen { retry_after: Duration::ZERO }.to_status("x");
        assert_eq!(open.code(), tonic::Code::Unavailable);
    }

    #[test]
    fn a_downstream_status_is_no_rejection() {
        assert_eq!(rejection(&tonic::Status::unavailable("down")), None);
    }

    #[test]
    fn an_unknown_mark_is_no_rejection() {
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert(REJECTION_METADATA, tonic::metadata::MetadataValue::from_static("rate_limited"));
        assert_eq!(rejection(&tonic::Status::with_metadata(tonic::Code::Unavailable, "down", md)), None);
    }

    #[test]
    fn the_boxed_error_becomes_the_same_status_in_tonic() {
        let err = reject("inventory", Rejection::BulkheadFull);
        let status = tonic::Status::from_error(err);
        assert_eq!(rejection(&status), Some(Rejection::BulkheadFull));
    }
}
