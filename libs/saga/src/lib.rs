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
//! * [`definition`] — building a [`Definition`]: misdeclared sagas do not compile.
//! * [`step`] — the [`Action`] and [`Compensation`] traits, the [`StepContext`]
//!   a step reads the saga's input and earlier outputs from, and [`StepError`].
//! * [`statement`] — [`Statement`], the one SQL statement a transition commits,
//!   to which the host adds its business writes and events.
//! * [`engine`] — [`Engine`]: starts, drives and resumes instances.
//! * [`grpc`] — a participant's gRPC status as a [`StepError`].
//! * [`admin`] — operating instances: listing, stuck detection, and an
//!   operator's retry now, compensate and resolve.
//! * [`faults`] — fault injection for tests (off unless configured).
//! * [`testing`] — the fault matrix generated from a definition's [`Shape`]
//!   (as `libtest-mimic` trials with the `testing` feature).
//!
//! A host service writes a [`Saga`] (its input type and the writes that end
//! an instance), its steps, and one [`Definition`]; it runs the crate's
//! [`migrator`] with its own, inserts instances in its own statements
//! ([`Engine::insert`]), and runs [`Engine::run_worker`]. See the order
//! service's `saga` module for a real one and this crate's `tests/example.rs`
//! for a four-step saga with its generated fault matrix.

pub mod admin;
pub mod definition;
pub mod engine;
pub mod faults;
pub mod grpc;
pub mod statement;
pub mod step;
pub mod testing;

mod settings;
pub mod store;

pub use definition::{Definition, DefinitionError, Shape, StepKind, StepOptions, StepShape};
pub use engine::{DriveError, Driven, Engine, NEW_INSTANCE, NewInstance, SettingsError, Started};
pub use settings::SagaSettings;
pub use statement::Statement;
pub use step::{Action, Compensation, End, Saga, StepContext, StepError};
pub use store::{
    AttemptRecord, INSTANCE_COLUMNS, InstanceRecord, SagaStatus, StepRecord, StepStatus, steps_json,
};

/// Migrations for `saga_instances` and `saga_instance_steps` (they share
/// `_sqlx_migrations` with the host's own; see `sagaworks_runtime::db::migrate`).
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("./migrations")
}
