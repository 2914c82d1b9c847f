//! Orchestrated sagas as definitions.
//!
//! A saga is an ordered list of typed steps. Each step has a forward action;
//! the steps before the **pivot** also have a compensation, the pivot may have
//! one, and the steps after it have none: they are retried until they succeed.
//! The library persists each instance in the host service's own database
//! ([`migrator`]) and drives it from there: one replica at a time holds its
//! lease, a crashed driver's instances are resumed by any replica, forward
//! steps have deadlines, compensations are retried with backoff until they
//! succeed, and every transition commits in one statement together with the
//! host's business writes and outbox events of that transition.
//!
//! ```text
//!   step 0 ──ok──> step 1 ──ok──> pivot ──ok──> step p+1 ──ok──> ... ──> COMPLETED
//!     │              │              │               └─ any error: retried (backoff) until it succeeds
//!     │              │              └─ rejected: compensate 1, 0; failed (may have had an effect): compensate p (if any), 1, 0
//!     │              └─ rejected: compensate 0; failed: compensate 1, 0
//!     └─ rejected: nothing to undo, COMPENSATED at once; failed: compensate 0
//!                                  compensations: retried until they succeed (or are refused: nothing to undo) ──> COMPENSATED
//! ```
//!
//! What a host uses:
//!
//! * [`Definition`] — the steps in order; a misdeclared saga does not compile
//!   (its builder's types: [`definition`]).
//! * [`Saga`], [`Action`], [`Compensation`] — what a host writes; a step reads
//!   the saga's input and earlier outputs from its [`StepContext`] and fails
//!   with a [`StepError`] (a gRPC status maps with [`StepContext::grpc_error`]).
//! * [`Engine`] — starts an instance in one call ([`Engine::start`] in the
//!   host's transaction, or [`Engine::start_with`] in one statement with the
//!   host's writes), gives a [`Started`] to drive ([`Started::run`]), and
//!   resumes instances ([`Engine::worker_task`]).
//! * [`Statement`] — the one SQL statement a transition (or a start)
//!   commits: its [`Guard`](statement::Guard), the host's writes ([`Statement::guarded`]:
//!   written only while the driver holds the instance's lease) and events.
//! * [`admin`] — operating instances: listing, stuck detection, and an
//!   operator's retry now, compensate and resolve.
//! * [`inspect`] — a step's and an attempt's records, a drive's outcome, a
//!   version's status.
//! * [`metrics`] — the names of the engine's metrics.
//! * `testing` (feature `testing`) — the fault matrix generated from a
//!   definition's [`Shape`], as `libtest-mimic` trials.
//!
//! A host service writes a [`Saga`] (its input type and the writes that end
//! an instance), its steps, and one [`Definition`]; it runs the crate's
//! [`migrator`] with its own, starts instances ([`Engine::start`]), and runs
//! the worker ([`Engine::worker_task`]). See
//! the order service's `saga` module for a real one and this crate's
//! `tests/example.rs` for a four-step saga with its generated fault matrix.

pub mod admin;
pub mod definition;
mod engine;
mod faults;
mod grpc;
mod operator;
mod settings;
pub mod statement;
mod step;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use definition::{Definition, Shape, valid_name};
pub use engine::{Engine, SettingsError, StartError, Started, VersionError, Versions};
pub use grpc::is_rejection;
pub use operator::{ActionKind, Operator, OperatorAction, OperatorRecord};
pub use settings::SagaSettings;
pub use statement::Statement;
pub use step::{Action, Compensation, End, Saga, StepContext, StepError};
pub use store::{InstanceRecord, SagaStatus, instance_json};

/// What the engine reports beyond an [`InstanceRecord`]: its steps' and their
/// attempts' records, the outcome of driving an instance
/// ([`Engine::drive`]), and each version's instances ([`Versions`]).
pub mod inspect {
    pub use crate::engine::{DriveError, Driven, VersionStatus};
    pub use crate::store::{AttemptRecord, StepRecord, StepStatus};
}

/// The names of the engine's metrics, each labelled `saga` (see [`Engine`]'s
/// docs for the others).
pub mod metrics {
    pub use crate::engine::telemetry::{
        DURATION_SECONDS, FINISHED_TOTAL, RESUMED_TOTAL, STEP_DURATION_SECONDS, STEPS_TOTAL, STUCK,
        UNFINISHED,
    };
}

/// Migrations for `saga_instances` and `saga_instance_steps` (they share
/// `_sqlx_migrations` with the host's own; see `sagaworks_runtime::db::migrate`).
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("./migrations")
}
