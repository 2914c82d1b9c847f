//! How an [`crate::Engine`] drives instances.

use sagaworks_runtime::TestHooks;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SagaSettings {
    /// How long a driver owns an instance without renewing; after that
    /// another replica (or this one after a restart) takes it over.
    pub lease_ms: u64,
    /// How often the worker looks for instances to resume.
    pub poll_interval_ms: u64,
    /// Instances one replica drives at once.
    pub max_concurrent: usize,
    /// The deadline of a step whose definition sets none: a step before or
    /// at the pivot still unfinished this long after its first attempt
    /// started (across crashes and restarts) is given up and compensated.
    pub step_deadline_ms: u64,
    /// First and largest delay between attempts of a step that is retried.
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// The longest a caller that starts an instance waits for it to finish
    /// before answering (the instance goes on regardless).
    pub max_wait_ms: u64,
    /// An unfinished instance without a transition for this long counts as
    /// stuck (the `saga_stuck` gauge, `status=stuck` in listings).
    pub stuck_after_ms: u64,
    /// Attempts of a step before the pivot (or a pivot with a compensation)
    /// whose call failed without a business answer, by step name; overrides
    /// the definition's `max_attempts`. More attempts let a saga wait out a
    /// participant's outage (backing off, within the step's deadline)
    /// instead of compensating at once; a long outage then leaves it stuck
    /// for an operator to see. E.g. `APP_SAGA__STEP_ATTEMPTS__RESERVE_STOCK=5`.
    pub step_attempts: BTreeMap<String, u32>,
    /// Fault injection for tests, off (empty) by default: makes this replica
    /// stop dead at a point of a saga, as if the process had been killed
    /// there. `before:<step>`, `after_call:<step>` (the participant did the
    /// work, nothing was recorded) or `after_commit:<step>`. Production refuses it
    /// ([`TestHooks`]).
    pub crash_point: String,
    /// More fault injection for tests, off (empty) by default; a comma
    /// separated list (see `faults.rs`). Production refuses it ([`TestHooks`]).
    pub faults: String,
    /// Start even when the database holds unfinished instances of a version this
    /// binary does not register (they stay undrivable, left for an operator) or of a
    /// version whose shape changed (they are read through the new shape: a step's
    /// stored output may no longer decode, a position may name another step). Off:
    /// such a start is refused ([`Engine::register`](crate::Engine::register)).
    pub force_start: bool,
    /// The registered version new instances start on; 0 (the default): the newest. The
    /// others only finish the instances that started on them (they drain). Setting it to
    /// an older version stops starting the newest, e.g. to drain it before a rollback.
    pub start_version: u32,
}

impl Default for SagaSettings {
    fn default() -> Self {
        Self {
            lease_ms: 30_000,
            poll_interval_ms: 500,
            max_concurrent: 256,
            step_deadline_ms: 60_000,
            retry_base_ms: 100,
            retry_max_ms: 10_000,
            max_wait_ms: 10_000,
            stuck_after_ms: 300_000,
            step_attempts: BTreeMap::new(),
            crash_point: String::new(),
            faults: String::new(),
            force_start: false,
            start_version: 0,
        }
    }
}

impl TestHooks for SagaSettings {
    fn built_in(&self) -> bool {
        cfg!(feature = "test-hooks")
    }

    fn hooks_on(&self) -> Vec<(&'static str, &'static str)> {
        let mut on = Vec::new();
        if !self.crash_point.trim().is_empty() {
            on.push(("crash_point", "a test-only hook that stops this replica dead in the middle of a saga"));
        }
        if !self.faults.trim().is_empty() {
            on.push(("faults", "test-only fault injection that fails or stalls saga steps on purpose"));
        }
        on
    }
}
