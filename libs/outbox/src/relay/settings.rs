//! The relay's settings: the `[outbox]` section of a service's settings.

use crate::crash::{self, RelayCrashPoint};
use crate::kafka::TopicSettings;
use serde::{Deserialize, Serialize};

/// The `[outbox]` section of a service's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RelaySettings {
    /// Run the relay in this process (`APP_OUTBOX__ENABLED`).
    pub enabled: bool,
    /// The `service` label of the relay's metrics, e.g. `order`; set it when
    /// wiring (the default is `unknown`).
    pub service: String,
    /// Fallback polling of a parked relay when no NOTIFY arrives.
    pub poll_interval_ms: u64,
    /// Time from the start of one batch to the start of the next while the
    /// relay is busy (unless the first was full). Under load, the events
    /// committed in that time go out in one batch (one claim, one delete, one
    /// commit, one produce round) instead of a batch per commit; an event
    /// waits at most this long for its batch. `0`: the next batch at once.
    /// The default, 50 ms, trades that wait (for events nobody waits on
    /// synchronously: the saga's calls are gRPC) for fewer, fuller batches,
    /// which cost the broker less CPU per event.
    pub min_batch_interval_ms: u64,
    /// Aggregate heads claimed per batch.
    pub batch_size: i64,
    /// Rows sent per batch at most: each claimed aggregate gets an equal
    /// share (at least its head). The default, 4000 (8 per head of a full
    /// claim), carries a backlog of long aggregates in fewer, fuller batches.
    pub batch_rows: i64,
    /// First retry delay after a failed batch.
    pub backoff_base_ms: u64,
    /// Cap of the retry delay.
    pub backoff_max_ms: u64,
    /// librdkafka `message.timeout.ms`: how long one send may take, retries included.
    pub message_timeout_ms: u64,
    /// librdkafka `linger.ms`.
    pub linger_ms: u64,
    /// How long a stopping relay still waits for the acks of its last batch.
    /// A healthy broker acks within milliseconds, so the acked events are
    /// deleted and nobody sends them again; a broker that does not answer
    /// within the wait leaves them to the next relay (sent twice if this
    /// relay's producer delivers them on close). Keep it well inside the
    /// service's termination grace period.
    pub stop_ack_wait_ms: u64,
    /// Used when the relay creates a missing topic.
    pub topics: TopicSettings,
    /// Test-only fault hook (`APP_OUTBOX__CRASH_POINT=after_produce`; see
    /// [`RelayCrashPoint`](crate::RelayCrashPoint)): abort the process after a batch was acked, before
    /// it is deleted from the outbox. `off` by default; never in production.
    pub crash_point: RelayCrashPoint,
}

impl sagaworks_runtime::TestHooks for RelaySettings {
    fn built_in(&self) -> bool {
        cfg!(feature = "test-hooks")
    }

    fn hooks_on(&self) -> Vec<(&'static str, &'static str)> {
        if self.crash_point == RelayCrashPoint::Off {
            vec![]
        } else {
            vec![("crash_point", crash::CRASH_POINT)]
        }
    }
}

impl Default for RelaySettings {
    fn default() -> Self {
        Self {
            enabled: true,
            service: "unknown".into(),
            poll_interval_ms: 1_000,
            min_batch_interval_ms: 50,
            batch_size: 500,
            batch_rows: 4_000,
            backoff_base_ms: 100,
            backoff_max_ms: 30_000,
            message_timeout_ms: 30_000,
            linger_ms: 5,
            stop_ack_wait_ms: 5_000,
            topics: TopicSettings::default(),
            crash_point: RelayCrashPoint::Off,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_default_and_partial_sections() {
        let s: RelaySettings = serde_json::from_str(r#"{"enabled": false, "batch_size": 50}"#).unwrap();
        assert!(!s.enabled);
        assert_eq!(s.batch_size, 50);
        assert_eq!(s.poll_interval_ms, 1_000, "missing keys keep their defaults");
        assert_eq!(s.min_batch_interval_ms, 50);
        assert!(RelaySettings::default().enabled);
    }
}
