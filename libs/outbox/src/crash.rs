//! Test-only fault hooks: abort the process at the point where a crash is
//! hardest to recover from, so a chaos run (`scripts/chaos`) shows that
//! nothing is lost and nothing takes effect twice. Off by default; a service
//! refuses to start with one in production (`sagaworks_runtime::TestHooks`). The process dies
//! there the first time it gets there (it is gone after that); restarted
//! without the setting, it recovers. The aborts are built only with the cargo
//! feature `test-hooks`; without it a service refuses a crash point in every
//! environment (`TestHooks::built_in`), and release images leave it out.

use serde::{Deserialize, Serialize};

/// Why production refuses a crash point (the settings that hold one implement
/// [`sagaworks_runtime::TestHooks`] with it).
pub(crate) const CRASH_POINT: &str = "a test-only hook that aborts the process on purpose (scripts/chaos)";

/// `[outbox] crash_point` (`APP_OUTBOX__CRASH_POINT`): where the relay aborts
/// the process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RelayCrashPoint {
    #[default]
    Off,
    /// After the broker acked a batch's events, before their rows are
    /// deleted: the next relay publishes them again (the same `ce_id`s twice
    /// on the topic).
    AfterProduce,
}

/// `[consumer] crash_point` (`APP_CONSUMER__CRASH_POINT`): where the
/// consumer aborts the process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsumerCrashPoint {
    #[default]
    Off,
    /// After a transaction with newly handled events (inbox rows and the
    /// handler's writes) committed, before their offsets are committed: the
    /// group gets them again, and the inbox must make them no-ops.
    BeforeOffsetCommit,
}

/// Stops the process dead (no unwinding, no shutdown, no flush but this line
/// on stderr), as `kill -9` would at this point.
#[cfg(feature = "test-hooks")]
pub(crate) fn abort(what: &str) -> ! {
    eprintln!("fault injection (crash_point): {what}; aborting the process");
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_points_are_off_by_default_and_named_in_snake_case() {
        assert_eq!(RelayCrashPoint::default(), RelayCrashPoint::Off);
        assert_eq!(ConsumerCrashPoint::default(), ConsumerCrashPoint::Off);
        let relay: RelayCrashPoint = serde_json::from_str(r#""after_produce""#).unwrap();
        assert_eq!(relay, RelayCrashPoint::AfterProduce);
        let consumer: ConsumerCrashPoint = serde_json::from_str(r#""before_offset_commit""#).unwrap();
        assert_eq!(consumer, ConsumerCrashPoint::BeforeOffsetCommit);
        assert!(serde_json::from_str::<RelayCrashPoint>(r#""before_offset_commit""#).is_err());
        assert_eq!(serde_json::to_string(&RelayCrashPoint::Off).unwrap(), r#""off""#);
    }
}
