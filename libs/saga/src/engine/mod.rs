//! [`Engine`]: starts, drives and resumes the instances of one saga.
//!
//! A driver reads an instance once (only while this replica holds its
//! lease) and then keeps in memory what each commit wrote. Each turn runs the
//! current step (forward or compensation) and commits, in one statement
//! guarded by the lease ([`Statement`]), the step's result and output, the
//! instance's next state, the next step's attempt, and the host's writes and
//! events of that transition ([`Action::record`](crate::Action::record),
//! [`Saga::on_end`]). A replica that lost its lease therefore writes nothing
//! at all, and whatever point a crash hits, the persisted state names a step
//! whose (idempotent) re-execution is safe.
//!
//! A step that succeeded and leads to a local step (no call, see
//! [`Action::LOCAL`](crate::Action::LOCAL)) commits its result together with
//! that step's: one statement fewer; a crash in between resumes at the
//! earlier step, which the participant answers from its idempotency record.
//!
//! # Durability
//!
//! Only the commit that ends an instance waits for its WAL flush (the
//! outside world is told how it ended; its events go out). The commits in
//! between (an attempt, a step's result) do not (`synchronous_commit = off`
//! for that transaction only): losing one in a database crash leaves the
//! instance where the previous commit left it, which is exactly the state a
//! driver crash right after the participant's answer leaves, and the
//! participants replay what it repeats. The host's statement or transaction
//! that creates an instance ([`Engine::start`]) is the host's to make durable.
//!
//! # Metrics and spans
//!
//! `saga_steps_total{saga,step,result}`, `saga_step_duration_seconds{saga,step}`,
//! `saga_duration_seconds{saga,outcome}`, `sagas_finished_total{saga,outcome}`,
//! `saga_resumed_total{saga}`, `saga_stuck{saga}` and `saga_unfinished{saga,version}`; a `saga.step` span per
//! turn (attributes `saga.step.name`, `saga.step.compensation`,
//! `saga.step.outcome`) inside the instance's `saga` span.
//!
//! # Modules
//!
//! * `transition`: the pure state machine (a step's outcome -> what next,
//!   and what that makes of the instance's row), with table-driven tests;
//! * `start`: [`Engine::start`], [`Engine::start_with`], [`Started`];
//! * `worker`: leasing, the worker loop, the lease's hand-back;
//! * `state`: the instance as its driver knows it, and loading it;
//! * `drive`: the turn loop (run a step, commit its transition);
//! * `commit`: the transition's statement;
//! * `telemetry`: metric names, spans, log lines.

mod commit;
mod drive;
mod start;
mod state;
pub(crate) mod telemetry;
mod transition;
mod versions;
mod worker;

pub(crate) use commit::GUARD;
pub use start::{StartError, Started};
pub(crate) use state::State;
pub(crate) use transition::{Next, transition};
pub use versions::{VersionError, VersionStatus, Versions};
#[cfg(feature = "testing")]
pub use worker::LEASE_SQL;

use crate::SagaSettings;
use crate::definition::Definition;
use crate::faults::Faults;
use crate::step::{Saga, StepError};
use sqlx::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Semaphore;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error("lease on saga {0} lost to another driver")]
    LeaseLost(Uuid),
    #[error("crash injected at {0}")]
    Crashed(String),
    /// A stored instance that this definition cannot drive (unknown step,
    /// data that no longer decodes): left for an operator.
    #[error("saga {0} cannot be driven: {1}")]
    Undrivable(Uuid, String),
    /// The host's writes for a transition could not be built.
    #[error("saga {0}: {1}")]
    Host(Uuid, StepError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// How a call to drive an instance ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driven {
    /// The instance reached COMPLETED or COMPENSATED.
    Finished,
    /// A step is to be retried later; the lease was released.
    Deferred,
    /// This replica is shutting down; the lease was released.
    Stopped,
}

struct Inner<S: Saga> {
    pool: PgPool,
    /// Newest first.
    definitions: Vec<Definition<S>>,
    /// The index in `definitions` of the one new instances start on.
    start: usize,
    settings: SagaSettings,
    owner: String,
    faults: Faults,
    crashed: AtomicBool,
    /// Bounds the instances this replica drives at once.
    permits: Arc<Semaphore>,
}

/// Drives the instances of one saga; clone it freely.
pub struct Engine<S: Saga> {
    inner: Arc<Inner<S>>,
}

impl<S: Saga> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone() }
    }
}

/// Refused settings (a fault naming an unknown step).
#[derive(Debug, thiserror::Error)]
#[error("invalid saga settings: {0}")]
pub struct SettingsError(String);

impl<S: Saga> Engine<S> {
    /// An engine of `versions` (a [`Definition`] alone is version 1, or whichever it
    /// declares). [`Engine::register`] checks them against the database.
    pub fn new(
        pool: PgPool,
        versions: impl Into<Versions<S>>,
        settings: SagaSettings,
    ) -> Result<Self, SettingsError> {
        let mut definitions = versions.into().sorted().map_err(SettingsError)?;
        for (step, attempts) in &settings.step_attempts {
            // Every version that has the step; an error when none has it.
            let results: Vec<_> =
                definitions.iter_mut().map(|d| d.set_max_attempts(step, *attempts)).collect();
            if results.iter().all(Result::is_err) {
                return Err(SettingsError(results.into_iter().find_map(Result::err).unwrap_or_default()));
            }
        }
        let start = match settings.start_version {
            0 => 0,
            v => definitions.iter().position(|d| d.version == v).ok_or_else(|| {
                SettingsError(format!(
                    "saga.start_version: version {v} of saga {:?} is not registered",
                    S::NAME
                ))
            })?,
        };
        telemetry::register(S::NAME);
        let mut names: Vec<&'static str> = definitions.iter().flat_map(|d| d.shape().names()).collect();
        names.sort_unstable();
        names.dedup();
        let faults = Faults::parse(&settings.crash_point, &settings.faults, &names).map_err(SettingsError)?;
        if !faults.is_off() {
            tracing::warn!(saga = S::NAME, crash_point = %settings.crash_point, faults = %settings.faults,
                "saga fault injection is on");
        }
        let owner = format!(
            "{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| S::NAME.into()),
            Uuid::new_v4().simple()
        );
        let permits = Arc::new(Semaphore::new(settings.max_concurrent.max(1)));
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                definitions,
                start,
                settings,
                owner,
                faults,
                crashed: AtomicBool::new(false),
                permits,
            }),
        })
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The definition new instances start on: the newest, unless `saga.start_version`
    /// names another.
    pub fn definition(&self) -> &Definition<S> {
        &self.inner.definitions[self.inner.start]
    }

    /// Every registered definition, newest first.
    pub fn definitions(&self) -> &[Definition<S>] {
        &self.inner.definitions
    }

    /// The definition of `version`, if this binary registers it.
    pub fn definition_of(&self, version: i32) -> Option<&Definition<S>> {
        self.inner.definitions.iter().find(|d| i64::from(d.version) == i64::from(version))
    }

    pub fn settings(&self) -> &SagaSettings {
        &self.inner.settings
    }

    /// This replica's lease owner id.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// True once injected fault stopped this replica (it then drives nothing).
    pub fn has_crashed(&self) -> bool {
        self.inner.crashed.load(Ordering::SeqCst)
    }

    fn crashed_flag(&self) -> &AtomicBool {
        &self.inner.crashed
    }

    fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// Bounds the instances this replica drives at once.
    fn permits(&self) -> &Arc<Semaphore> {
        &self.inner.permits
    }

    pub(crate) fn lease_secs(&self) -> f64 {
        self.inner.settings.lease_ms as f64 / 1000.0
    }
}
