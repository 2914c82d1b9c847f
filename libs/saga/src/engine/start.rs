//! Starting an instance is one call. Alone, in the caller's transaction
//! (or atomic on its own):
//!
//! ```ignore
//! let saga = engine.start(&mut tx, item_id.to_string(), ClaimInput { item_id, product_id }).await?;
//! tx.commit().await?;
//! saga.run(wait, &shutdown).await;                // drives it on a task of its own
//! ```
//!
//! or with the host's own writes, in one statement whose guard is the
//! host's first write: the instance is created exactly when the guard
//! returns a row (e.g. an insert `ON CONFLICT DO NOTHING` that inserted):
//!
//! ```ignore
//! let started = engine.start_with(&mut conn, order_id.to_string(), input, |saga_id, w| {
//!     let order = w.guard("order", "INSERT INTO orders .. ON CONFLICT DO NOTHING RETURNING id");
//!     w.guarded("items", |g| g.insert("order_items ..").select(..));
//!     w.event(outbox.stage(&OrderCreated { saga_id, .. })?);
//!     Ok::<_, Error>(order)
//! }).await?;
//! let Some(saga) = started else { return replayed() };
//! ```
//!
//! A start takes one of the replica's driving permits when one is free: the
//! instance's first attempt is then recorded with its rows and this replica
//! drives it at once ([`Started::run`]); without one, the worker takes it over.

use super::state::State;
use super::{Engine, telemetry};
use crate::definition::Position;
use crate::statement::{Guard, Statement};
use crate::step::Saga;
use crate::store::SagaStatus;
use chrono::{DateTime, Utc};
use sagaworks_telemetry::propagation;
use serde_json::{Map, Value};
use sqlx::{AssertSqlSafe, PgConnection};
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

/// The part of a start's statement that inserts the instance's row.
const NEW_INSTANCE: &str = "saga_new";

/// Why an instance could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The saga's input does not encode as JSON.
    #[error("the input of saga {saga} does not encode: {error}")]
    Input { saga: &'static str, error: serde_json::Error },
    /// The host's part of the statement (see [`Engine::start_with`]) is malformed, or the
    /// statement failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// An instance that was created, leased to this replica: drive it with [`Started::run`].
///
/// ```no_run
/// # async fn f<S: sagaworks_saga::Saga>(
/// #     engine: sagaworks_saga::Engine<S>, conn: &mut sqlx::PgConnection, input: S::Input,
/// #     stop: tokio_util::sync::CancellationToken,
/// # ) -> Result<(), sagaworks_saga::StartError> {
/// let saga = engine.start(conn, "key", input).await?;
/// saga.run(std::time::Duration::from_secs(1), &stop).await;
/// # Ok(())
/// # }
/// ```
///
/// Dropping it is refused where `unused_must_use` is denied:
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # async fn f<S: sagaworks_saga::Saga>(
/// #     engine: sagaworks_saga::Engine<S>, conn: &mut sqlx::PgConnection, input: S::Input,
/// # ) -> Result<(), sagaworks_saga::StartError> {
/// engine.start(conn, "key", input).await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a Started saga is leased to this replica: dropped, nobody drives it until its lease \
              runs out (saga.lease_ms, 30 s by default); call run()"]
pub struct Started<S: Saga> {
    engine: Engine<S>,
    id: Uuid,
    input: S::Input,
    created_at: DateTime<Utc>,
    /// The span that started it, as stored with it.
    traceparent: Option<String>,
    permit: Option<OwnedSemaphorePermit>,
}

impl<S: Saga> Engine<S> {
    /// Starts an instance of the saga for `key` (the business key, e.g. the
    /// order id: one instance per saga and key) with `input`, on `conn`: in
    /// the caller's transaction, or atomic on its own. Its `saga` spans are
    /// children of the current span, also when another replica resumes it.
    pub async fn start(
        &self,
        conn: &mut PgConnection,
        key: impl Into<String>,
        input: S::Input,
    ) -> Result<Started<S>, StartError> {
        let started = self
            .start_with(conn, key, input, |_, w| Ok::<_, StartError>(w.guard("saga_always", "SELECT 1")))
            .await?;
        // The guard always returns its row.
        started.ok_or(StartError::Db(sqlx::Error::RowNotFound))
    }

    /// Starts an instance like [`Engine::start`], in one statement with the
    /// host's writes: `host` gets the new instance's id and the statement,
    /// declares its guard ([`Statement::guard`]), adds its guarded parts and
    /// events, and returns the guard. The instance's rows are inserted once
    /// per row of the guard; `None`: the guard returned no row, and nothing
    /// guarded was written.
    pub async fn start_with<E: From<StartError>>(
        &self,
        conn: &mut PgConnection,
        key: impl Into<String>,
        input: S::Input,
        host: impl FnOnce(Uuid, &mut Statement) -> Result<Guard, E>,
    ) -> Result<Option<Started<S>>, E> {
        let encoded =
            serde_json::to_value(&input).map_err(|error| StartError::Input { saga: S::NAME, error })?;
        // A UUIDv7: ids in creation order list instances newest first.
        let id = Uuid::now_v7();
        let mut w = Statement::new();
        let guard = host(id, &mut w)?;
        if w.guard_of() != Some(guard) {
            let e = format!("saga {}: the host's guard {guard} is not its statement's guard", S::NAME);
            return Err(StartError::Db(sqlx::Error::Encode(e.into())).into());
        }
        // Taken once the host's part is built: a host error holds no permit.
        let permit = self.permits().clone().try_acquire_owned().ok();
        let traceparent = propagation::current_traceparent();
        self.add_rows(&mut w, id, key.into(), encoded, traceparent.clone(), permit.is_some());
        let (sql, args) =
            w.finish(&format!("SELECT created_at FROM {NEW_INSTANCE}")).map_err(StartError::from)?;
        let created_at: Option<DateTime<Utc>> = sqlx::query_scalar_with(AssertSqlSafe(sql), args)
            .fetch_optional(conn)
            .await
            .map_err(StartError::from)?;
        Ok(created_at.map(|created_at| Started {
            engine: self.clone(),
            id,
            input,
            created_at,
            traceparent,
            permit,
        }))
    }

    /// The instance's rows, leased to this replica, on the version new
    /// instances start on; with a permit, the first step's first attempt too
    /// (its deadline starts now).
    fn add_rows(
        &self,
        w: &mut Statement,
        id: Uuid,
        key: String,
        input: Value,
        traceparent: Option<String>,
        first_attempt: bool,
    ) {
        let definition = self.definition();
        let (first, version) = (definition.steps[0].name, definition.version() as i32);
        let (id, saga, key, step) = (w.bind(id), w.bind(S::NAME), w.bind(key), w.bind(first));
        let version = w.bind(version);
        let (input, traceparent, owner) =
            (w.bind(input), w.bind(traceparent), w.bind(self.owner().to_string()));
        let lease = w.bind(self.lease_secs());
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
        if first_attempt {
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
        self.id
    }

    /// `created_at` of the instance, as the statement returned it.
    pub fn created_at(&self) -> DateTime<Utc> {
        self.created_at
    }

    pub fn input(&self) -> &S::Input {
        &self.input
    }

    /// Drives the instance on a task of its own; returns when it finished,
    /// must wait for a retry, or `wait` elapsed (it goes on regardless).
    /// Without a permit this replica is at its bound: the instance is handed
    /// to the worker like any other. The task carries the caller's span for
    /// its logs; its `saga` span is a child of the span that started the
    /// instance, like a resumed drive's.
    pub async fn run(self, wait: Duration, stop: &CancellationToken) {
        let stop = stop.clone();
        let Started { engine, id, input, created_at, traceparent, permit } = self;
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
                    input,
                    outputs: Map::new(),
                    step_started_at: Some(created_at),
                    attempts: Some(1),
                    maybe_sent: false,
                };
                let span = telemetry::saga_span(S::NAME, id);
                if let Some(traceparent) = &traceparent {
                    propagation::continue_trace(&span, traceparent);
                }
                let result = engine.drive_from(id, state, true, &stop).instrument(span).await;
                telemetry::log_outcome(id, result);
            }
            .in_current_span(),
        );
        let _ = tokio::time::timeout(wait, task).await;
    }
}
