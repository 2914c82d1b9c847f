//! Starting an instance in one call: [`Engine::prepare`] it, commit it with
//! the host's own writes ([`Launch::commit`], or alone in the host's
//! transaction with [`Launch::insert`]), and drive it ([`Started::run`]).
//!
//! ```ignore
//! let launch = engine.prepare(NewInstance { id, key: order_id.to_string(), input, traceparent })?;
//! let mut w = Statement::new("o");                 // the host's insert is the guard:
//! w.unguarded("o", "INSERT INTO orders .. ON CONFLICT DO NOTHING RETURNING id");
//! let Some(started) = launch.commit(w, &mut *conn).await? else { return replayed() };
//! started.run(wait, &shutdown).await;             // on a task of its own
//! ```
//!
//! A launch takes one of the replica's driving permits when one is free:
//! the instance's first attempt is then recorded with its rows and this
//! replica drives it at once; without one, the worker takes it over.

use super::state::State;
use super::{Engine, telemetry};
use crate::definition::Position;
use crate::statement::Statement;
use crate::step::{Saga, StepError};
use crate::store::SagaStatus;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::{AssertSqlSafe, PgExecutor};
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

/// The part of a launch's statement that inserts the instance's row.
const NEW_INSTANCE: &str = "saga_new";

/// An instance to create: see [`Engine::prepare`].
pub struct NewInstance<S: Saga> {
    /// A UUIDv7 (`Uuid::now_v7()`): ids in creation order list instances
    /// newest first ([`crate::admin::list`]).
    pub id: Uuid,
    /// The business key (e.g. the order id): one instance per saga and key.
    pub key: String,
    pub input: S::Input,
    /// The W3C `traceparent` of the call that starts the instance: its
    /// `saga` spans are children of it, also when another replica resumes it.
    pub traceparent: Option<String>,
}

/// An instance ready to be created with the host's writes: see the module docs.
#[must_use = "a launch creates nothing until committed"]
pub struct Launch<S: Saga> {
    engine: Engine<S>,
    instance: NewInstance<S>,
    input: Value,
    permit: Option<OwnedSemaphorePermit>,
}

/// An instance the host's statement created, ready to be driven by [`Started::run`].
pub struct Started<S: Saga> {
    engine: Engine<S>,
    instance: NewInstance<S>,
    created_at: DateTime<Utc>,
    permit: Option<OwnedSemaphorePermit>,
}

impl<S: Saga> Engine<S> {
    /// Prepares `instance` for the host's statement: encodes its input (a
    /// [`StepError::Rejected`] when it does not encode) and takes a permit to
    /// drive it at once if this replica has one free.
    pub fn prepare(&self, instance: NewInstance<S>) -> Result<Launch<S>, StepError> {
        let input = serde_json::to_value(&instance.input)
            .map_err(|e| StepError::Rejected(format!("the input of {} does not encode: {e}", S::NAME)))?;
        let permit = self.permits().clone().try_acquire_owned().ok();
        Ok(Launch { engine: self.clone(), instance, input, permit })
    }
}

impl<S: Saga> Launch<S> {
    pub fn id(&self) -> Uuid {
        self.instance.id
    }

    /// Commits the host's statement `w` with the instance's rows, which are
    /// inserted once per row of `w`'s guard (e.g. only when the host's own
    /// insert did not conflict). `None`: the guard returned no row, and no
    /// instance was created.
    pub async fn commit<'c>(
        mut self,
        mut w: Statement,
        db: impl PgExecutor<'c>,
    ) -> Result<Option<Started<S>>, sqlx::Error> {
        self.add_rows(&mut w);
        let (sql, args) = w.finish(&format!("SELECT created_at FROM {NEW_INSTANCE}"))?;
        let created_at: Option<DateTime<Utc>> =
            sqlx::query_scalar_with(AssertSqlSafe(sql), args).fetch_optional(db).await?;
        Ok(created_at.map(|created_at| self.started(created_at)))
    }

    /// Inserts the instance alone, e.g. in the host's transaction after its
    /// own writes.
    pub async fn insert<'c>(self, db: impl PgExecutor<'c>) -> Result<Started<S>, sqlx::Error> {
        const ALWAYS: &str = "saga_always";
        let mut w = Statement::new(ALWAYS);
        w.unguarded(ALWAYS, "SELECT 1");
        let started = self.commit(w, db).await?;
        // The guard always returns its row.
        started.ok_or(sqlx::Error::RowNotFound)
    }

    fn started(self, created_at: DateTime<Utc>) -> Started<S> {
        Started { engine: self.engine, instance: self.instance, created_at, permit: self.permit }
    }

    /// The instance's rows, leased to this replica; with a permit, the first
    /// step's first attempt too (its deadline starts now).
    /// The encoded input is moved into the statement (it is not needed after).
    fn add_rows(&mut self, w: &mut Statement) {
        let input = std::mem::take(&mut self.input);
        let engine = &self.engine;
        let new = &self.instance;
        // On the newest version.
        let newest = engine.definition();
        let (first, version) = (newest.steps[0].name, newest.version() as i32);
        let (id, saga, key, step) = (w.bind(new.id), w.bind(S::NAME), w.bind(new.key.clone()), w.bind(first));
        let version = w.bind(version);
        let (input, traceparent, owner) =
            (w.bind(input), w.bind(new.traceparent.clone()), w.bind(engine.owner().to_string()));
        let lease = w.bind(engine.lease_secs());
        w.guarded(NEW_INSTANCE, |g| {
            g.insert(
                "saga_instances (id, saga_type, version, key, status, current_step, traceparent, lease_owner, lease_expires_at)",
            )
            .select(format!(
                "{id}, {saga}, {version}, {key}, 'RUNNING', {step}, {traceparent}, {owner}, now() + make_interval(secs => {lease})"
            ))
            .then("RETURNING created_at")
        });
        // The input is written once, beside the row every transition rewrites.
        w.unguarded(
            "saga_input",
            format!(
                "INSERT INTO saga_instance_inputs (saga_id, input) SELECT {id}, {input} FROM {NEW_INSTANCE}"
            ),
        );
        if self.permit.is_some() {
            w.unguarded(
                "saga_first",
                format!(
                    "INSERT INTO saga_instance_steps (saga_id, name, status, attempts)
                     SELECT {id}, {step}, 'RUNNING', 1 FROM {NEW_INSTANCE}"
                ),
            );
        }
    }
}

impl<S: Saga> Started<S> {
    pub fn id(&self) -> Uuid {
        self.instance.id
    }

    /// `created_at` of the instance, as the statement returned it.
    pub fn created_at(&self) -> DateTime<Utc> {
        self.created_at
    }

    pub fn input(&self) -> &S::Input {
        &self.instance.input
    }

    /// Drives the instance on a task of its own; returns when it finished,
    /// must wait for a retry, or `wait` elapsed (it goes on regardless).
    /// Without a permit this replica is at its bound: the instance is handed
    /// to the worker like any other. The task carries the caller's span, so
    /// the instance's spans join the caller's trace.
    pub async fn run(self, wait: Duration, stop: &CancellationToken) {
        let stop = stop.clone();
        let Started { engine, instance, created_at, permit } = self;
        let id = instance.id;
        let task = tokio::spawn(
            async move {
                let Some(_permit) = permit else {
                    let _ = engine.release_lease(id, Duration::ZERO).await;
                    return;
                };
                let state = State {
                    version: engine.definition().version() as i32,
                    status: SagaStatus::Running,
                    at: Position::Forward(0),
                    failure_reason: None,
                    created_at,
                    input: instance.input,
                    outputs: Map::new(),
                    step_started_at: Some(created_at),
                    attempts: Some(1),
                    maybe_sent: false,
                };
                let span = telemetry::saga_span(S::NAME, id);
                let result = engine.drive_from(id, state, true, &stop).instrument(span).await;
                telemetry::log_outcome(id, result);
            }
            .in_current_span(),
        );
        let _ = tokio::time::timeout(wait, task).await;
    }
}
