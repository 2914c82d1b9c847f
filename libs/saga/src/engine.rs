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
//! participants replay what it repeats. The host's statement that creates an
//! instance ([`Engine::insert`]) is the host's to make durable.
//!
//! # Metrics and spans
//!
//! `saga_steps_total{saga,step,result}`, `saga_step_duration_seconds{saga,step}`,
//! `saga_duration_seconds{saga,outcome}`, `sagas_finished_total{saga,outcome}`
//! and `saga_resumed_total{saga}`; a `saga.step` span per turn (attributes
//! `saga.step.name`, `saga.step.compensation`, `saga.step.outcome`) inside the
//! instance's `saga` span.

use crate::SagaSettings;
use crate::admin::Audit;
use crate::definition::{Definition, Position, StepKind};
use crate::faults::{Faults, When};
use crate::statement::Statement;
use crate::step::{End, Saga, StepContext, StepError};
use crate::store::{SagaStatus, StepStatus};
use chrono::{DateTime, Utc};
use sagaworks_resilience::Backoff;
use sagaworks_runtime::db::NO_FLUSH_WAIT;
use sagaworks_telemetry::propagation;
use serde_json::{Map, Value};
use sqlx::{AssertSqlSafe, PgPool};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

/// How often a worker counts stuck instances (the `saga_stuck` gauge).
const STUCK_COUNT_INTERVAL: Duration = Duration::from_secs(5);

/// The CTE of [`Engine::insert`] that returns the new instance's
/// `created_at`: a host's statement ends with `SELECT created_at FROM` it.
pub const NEW_INSTANCE: &str = "saga_new";

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

/// An instance to create: see [`Engine::insert`].
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

/// An instance the host's statement created (see [`Engine::insert`]), ready
/// to be driven by [`Engine::start`].
pub struct Started<S: Saga> {
    pub instance: NewInstance<S>,
    /// `created_at` of the instance, as the statement returned it.
    pub created_at: DateTime<Utc>,
    /// From [`Engine::try_permit`] before the statement: with one, the
    /// statement recorded the first step's first attempt, and this replica
    /// drives the instance at once.
    pub permit: Option<OwnedSemaphorePermit>,
}

/// An instance as its driver knows it: read once, then kept equal to what
/// each commit wrote.
pub(crate) struct State<S: Saga> {
    pub(crate) status: SagaStatus,
    pub(crate) at: Position,
    pub(crate) failure_reason: Option<String>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) input: S::Input,
    pub(crate) outputs: Map<String, Value>,
    /// The current step's first attempt and attempts so far, once recorded.
    pub(crate) step_started_at: Option<DateTime<Utc>>,
    pub(crate) attempts: Option<i32>,
    /// An earlier attempt of the current step may have reached its
    /// participant: it failed after sending, or it was in flight when its
    /// driver died (started, no outcome recorded). Then a later attempt that
    /// was "not sent" proves nothing: the step may have taken effect.
    pub(crate) maybe_sent: bool,
}

impl<S: Saga> State<S> {
    pub(crate) fn at(&self) -> Position {
        self.at
    }

    /// The current step has been attempted (it may have taken effect).
    pub(crate) fn attempted(&self) -> bool {
        self.attempts.is_some()
    }
}

/// What an instance does after a step's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Run this step next, in the same direction.
    Step(Position),
    /// Start compensating with this step, for `reason`.
    Compensate { first: Position, reason: String },
    /// Nothing may have taken effect: COMPENSATED at once, for `reason`.
    Cancel { reason: String },
    /// Run the same step again after a backoff.
    Retry,
    /// All forward steps done.
    Complete,
    /// All compensations done.
    Compensated,
}

/// A step's outcome: `Ok` with its output, or how it failed; `give_up`: the
/// step may not be retried (its deadline passed or its attempts ran out).
pub(crate) fn transition<S: Saga>(
    def: &Definition<S>,
    at: Position,
    outcome: &Result<Value, StepError>,
    attempts: u32,
    give_up: bool,
) -> Next {
    match at {
        Position::Forward(i) => {
            let step = &def.steps[i];
            match outcome {
                Ok(_) if i + 1 < def.steps.len() => Next::Step(Position::Forward(i + 1)),
                Ok(_) => Next::Complete,
                // After the pivot there is no way back: retried until it succeeds.
                Err(_) if step.kind == StepKind::Retriable => Next::Retry,
                Err(StepError::Unavailable(_)) if !give_up && attempts < step.options.max_attempts => {
                    Next::Retry
                }
                Err(StepError::Rejected(reason) | StepError::Unavailable(reason)) => {
                    match def.last_compensation_before(i) {
                        Some(first) => Next::Compensate { first, reason: reason.clone() },
                        None => Next::Cancel { reason: reason.clone() },
                    }
                }
                // A pivot without compensation cannot be undone: retried until it succeeds or is rejected.
                Err(StepError::Failed(_)) if step.kind == StepKind::Pivot && step.compensation.is_none() => {
                    Next::Retry
                }
                Err(StepError::Failed(_)) if !give_up && attempts < step.options.max_attempts => Next::Retry,
                // It may have taken effect: its own compensation runs first.
                Err(StepError::Failed(reason)) => match def.last_compensation_before(i + 1) {
                    Some(first) => Next::Compensate { first, reason: reason.clone() },
                    None => Next::Cancel { reason: reason.clone() },
                },
            }
        }
        Position::Compensation(i) => match outcome {
            // A refused compensation has nothing (more) to undo.
            Ok(_) | Err(StepError::Rejected(_)) => match def.last_compensation_before(i) {
                Some(next) => Next::Step(next),
                None => Next::Compensated,
            },
            Err(StepError::Failed(_) | StepError::Unavailable(_)) => Next::Retry,
        },
    }
}

/// The worker's poll: leases up to `$3` runnable instances of type `$4` to
/// owner `$1` for `$2` seconds. Public for plan tests: it must read only
/// unfinished instances (`saga_instances_runnable`), however many finished
/// ones the table holds.
pub const LEASE_SQL: &str =
    "UPDATE saga_instances SET lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2),
        updated_at = now()
 WHERE id IN (
     SELECT id FROM saga_instances
     WHERE status IN ('RUNNING', 'COMPENSATING') AND next_attempt_at <= now() AND saga_type = $4
       AND (lease_expires_at IS NULL OR lease_expires_at < now())
     ORDER BY next_attempt_at
     LIMIT $3
     FOR UPDATE SKIP LOCKED)
 RETURNING id, traceparent";

struct Inner<S: Saga> {
    pool: PgPool,
    definition: Definition<S>,
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
    pub fn new(
        pool: PgPool,
        mut definition: Definition<S>,
        settings: SagaSettings,
    ) -> Result<Self, SettingsError> {
        for (step, attempts) in &settings.step_attempts {
            definition.set_max_attempts(step, *attempts).map_err(SettingsError)?;
        }
        metrics::counter!("saga_resumed_total", "saga" => S::NAME).absolute(0);
        let names = definition.shape().names();
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
                definition,
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

    pub fn definition(&self) -> &Definition<S> {
        &self.inner.definition
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

    /// A permit to drive one more instance now, if this replica has one free.
    /// Take it before [`Engine::insert`]: with it, the insert records the
    /// first step's first attempt (one statement fewer).
    pub fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.inner.permits.clone().try_acquire_owned().ok()
    }

    /// Adds the instance's rows to the host's statement `w`, inserted once
    /// per row of `w`'s guard (e.g. only when the host's own insert did not
    /// conflict), leased to this replica. With `first_attempt` (the caller
    /// holds a permit), the first step's first attempt is recorded too and
    /// its deadline starts now. The statement must end with
    /// `SELECT created_at FROM` [`NEW_INSTANCE`].
    pub fn insert(
        &self,
        w: &mut Statement,
        new: &NewInstance<S>,
        first_attempt: bool,
    ) -> Result<(), StepError> {
        let input = serde_json::to_value(&new.input)
            .map_err(|e| StepError::Rejected(format!("the input of {} does not encode: {e}", S::NAME)))?;
        let first = self.inner.definition.steps[0].name;
        let guard = w.guard().to_string();
        let (id, saga, key, step) = (w.bind(new.id), w.bind(S::NAME), w.bind(new.key.clone()), w.bind(first));
        let (input, traceparent, owner) =
            (w.bind(input), w.bind(new.traceparent.clone()), w.bind(self.owner().to_string()));
        let lease = w.bind(self.lease_secs());
        w.with(
            NEW_INSTANCE,
            format!(
                "INSERT INTO saga_instances (id, saga_type, key, status, current_step, traceparent,
                                             lease_owner, lease_expires_at)
                 SELECT {id}, {saga}, {key}, 'RUNNING', {step}, {traceparent}, {owner},
                        now() + make_interval(secs => {lease}) FROM {guard}
                 RETURNING created_at"
            ),
        );
        // The input is written once, beside the row every transition rewrites.
        w.with(
            "saga_input",
            format!(
                "INSERT INTO saga_instance_inputs (saga_id, input) SELECT {id}, {input} FROM {NEW_INSTANCE}"
            ),
        );
        if first_attempt {
            w.with(
                "saga_first",
                format!(
                    "INSERT INTO saga_instance_steps (saga_id, name, status, attempts)
                     SELECT {id}, {step}, 'RUNNING', 1 FROM {NEW_INSTANCE}"
                ),
            );
        }
        Ok(())
    }

    /// Drives an instance the host just created ([`Engine::insert`]) on a
    /// task of its own; returns when it finished, must wait for a retry, or
    /// `wait` elapsed (it goes on regardless). Without a permit this replica
    /// is at its bound: the instance is handed to the worker like any other.
    /// The task carries the caller's span, so the instance's spans join the
    /// caller's trace.
    pub async fn start(&self, started: Started<S>, wait: Duration, stop: &CancellationToken) {
        let (engine, stop) = (self.clone(), stop.clone());
        let id = started.instance.id;
        let task = tokio::spawn(
            async move {
                let Some(_permit) = started.permit else {
                    let _ = engine.release_lease(id, Duration::ZERO).await;
                    return;
                };
                let state = State {
                    status: SagaStatus::Running,
                    at: Position::Forward(0),
                    failure_reason: None,
                    created_at: started.created_at,
                    input: started.instance.input,
                    outputs: Map::new(),
                    step_started_at: Some(started.created_at),
                    attempts: Some(1),
                    maybe_sent: false,
                };
                let span = engine.saga_span(id);
                let result = engine.drive_from(id, state, true, &stop).instrument(span).await;
                log_outcome(id, result);
            }
            .in_current_span(),
        );
        let _ = tokio::time::timeout(wait, task).await;
    }

    /// Drives instance `id` (leased to this replica) until it finishes, must
    /// wait for a retry, or `stop` is set. Runs in the caller's span.
    pub async fn drive(&self, id: Uuid, stop: &CancellationToken) -> Result<Driven, DriveError> {
        let state = self.load(id).await?;
        self.drive_from(id, state, false, stop).await
    }

    fn saga_span(&self, id: Uuid) -> tracing::Span {
        tracing::info_span!("saga", saga.id = %id, saga.r#type = S::NAME)
    }

    /// Resumes instances nobody drives until `shutdown`: every
    /// `poll_interval_ms` it leases due instances of this saga that are
    /// unleased or whose lease expired (their driver crashed), with
    /// `FOR UPDATE SKIP LOCKED` so replicas never take the same one, and
    /// drives each on a task of its own. On shutdown it stops leasing and
    /// waits for the instances in hand, which hand their leases back at the
    /// next step boundary. A resumed instance continues the trace of the
    /// call that started it.
    pub async fn run_worker(self, shutdown: CancellationToken) {
        let poll = Duration::from_millis(self.inner.settings.poll_interval_ms.max(10));
        let stuck_after = Duration::from_millis(self.inner.settings.stuck_after_ms);
        let mut stuck_counted: Option<Instant> = None;
        let mut running = JoinSet::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(poll) => {}
            }
            while running.try_join_next().is_some() {}
            if stuck_counted.is_none_or(|at| at.elapsed() >= STUCK_COUNT_INTERVAL) {
                stuck_counted = Some(Instant::now());
                match crate::admin::count_stuck(&self.inner.pool, S::NAME, stuck_after).await {
                    Ok(n) => metrics::gauge!("saga_stuck", "saga" => S::NAME).set(n as f64),
                    Err(e) => tracing::warn!(saga = S::NAME, error = %e, "cannot count stuck saga instances"),
                }
            }
            if self.has_crashed() {
                continue;
            }
            let free = self.inner.permits.available_permits() as i64;
            if free == 0 {
                continue;
            }
            let leased = match self.lease(free).await {
                Ok(leased) => leased,
                Err(e) => {
                    tracing::warn!(saga = S::NAME, error = %e, "cannot lease saga instances");
                    continue;
                }
            };
            for (id, traceparent) in leased {
                let Ok(permit) = self.inner.permits.clone().acquire_owned().await else { break };
                metrics::counter!("saga_resumed_total", "saga" => S::NAME).increment(1);
                let (engine, stop) = (self.clone(), shutdown.clone());
                let span = self.saga_span(id);
                if let Some(traceparent) = traceparent {
                    propagation::continue_trace(&span, &traceparent);
                }
                running.spawn(
                    async move {
                        let _permit = permit;
                        log_outcome(id, engine.drive(id, &stop).await);
                    }
                    .instrument(span),
                );
            }
        }
        while running.join_next().await.is_some() {}
    }

    /// Leases up to `limit` runnable instances to this replica; returns
    /// their ids and `traceparent`s.
    async fn lease(&self, limit: i64) -> Result<Vec<(Uuid, Option<String>)>, sqlx::Error> {
        sqlx::query_as(LEASE_SQL)
            .bind(self.owner())
            .bind(self.lease_secs())
            .bind(limit)
            .bind(S::NAME)
            .fetch_all(&self.inner.pool)
            .await
    }

    fn lease_secs(&self) -> f64 {
        self.inner.settings.lease_ms as f64 / 1000.0
    }

    fn crash_at(&self, when: When, step: &str) -> Result<(), DriveError> {
        if self.inner.faults.crash.as_ref().is_some_and(|(w, s)| *w == when && s == step) {
            self.inner.crashed.store(true, Ordering::SeqCst);
            tracing::warn!(?when, step, "fault injection: this replica stops dead here");
        }
        if self.has_crashed() { Err(DriveError::Crashed(format!("{when:?}:{step}"))) } else { Ok(()) }
    }

    pub(crate) async fn load(&self, id: Uuid) -> Result<State<S>, DriveError> {
        #[derive(sqlx::FromRow)]
        struct Row {
            status: SagaStatus,
            current_step: Option<String>,
            failure_reason: Option<String>,
            created_at: DateTime<Utc>,
            input: Option<Value>,
            outputs: Value,
            step_started_at: Option<DateTime<Utc>>,
            attempts: Option<i32>,
            maybe_sent: bool,
        }
        let row = sqlx::query_as::<_, Row>(
            // The input and outputs where this version writes them, or in
            // `data` for an instance written before it (see the migrations).
            "SELECT i.status, i.current_step, i.failure_reason, i.created_at,
                    COALESCE(n.input, i.data -> 'input') AS input,
                    COALESCE(i.data -> 'outputs', '{}')
                        || COALESCE((SELECT jsonb_object_agg(o.name, o.output) FROM saga_instance_steps o
                                     WHERE o.saga_id = i.id AND o.output IS NOT NULL), '{}') AS outputs,
                    st.started_at AS step_started_at, st.attempts,
                    -- Every attempt started, less those known not to have been sent.
                    COALESCE(st.attempts, 0) > (SELECT count(*) FROM jsonb_array_elements(COALESCE(st.history, '[]')) h
                                                WHERE h ->> 'outcome' = 'unavailable') AS maybe_sent
             FROM saga_instances i
             LEFT JOIN saga_instance_inputs n ON n.saga_id = i.id
             LEFT JOIN saga_instance_steps st ON st.saga_id = i.id AND st.name = i.current_step
             WHERE i.id = $1 AND i.lease_owner = $2",
        )
        .bind(id)
        .bind(self.owner())
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or(DriveError::LeaseLost(id))?;
        let undrivable = |why: String| DriveError::Undrivable(id, why);
        let input: S::Input = serde_json::from_value(row.input.unwrap_or(Value::Null))
            .map_err(|e| undrivable(format!("the stored input does not decode: {e}")))?;
        let Value::Object(outputs) = row.outputs else {
            return Err(undrivable("the stored outputs are not an object".into()));
        };
        let at = match row.current_step.as_deref() {
            // Finished: the loop returns at once.
            None => Position::Forward(0),
            Some(step) => self
                .inner
                .definition
                .position(step)
                .ok_or_else(|| undrivable(format!("unknown step {step:?}")))?,
        };
        Ok(State {
            status: row.status,
            at,
            failure_reason: row.failure_reason,
            created_at: row.created_at,
            input,
            outputs,
            step_started_at: row.step_started_at,
            attempts: row.attempts,
            maybe_sent: row.maybe_sent,
        })
    }

    /// `begun`: the current step's attempt is recorded already (by the
    /// insert or the previous commit).
    async fn drive_from(
        &self,
        id: Uuid,
        mut state: State<S>,
        mut begun: bool,
        stop: &CancellationToken,
    ) -> Result<Driven, DriveError> {
        // A step that succeeded, whose result commits with the next (local) step's.
        let mut carried: Option<(usize, Value)> = None;
        loop {
            if self.has_crashed() {
                return Err(DriveError::Crashed("earlier".into()));
            }
            if state.status.is_finished() {
                return Ok(Driven::Finished);
            }
            if stop.is_cancelled() {
                self.release_lease(id, Duration::ZERO).await?;
                return Ok(Driven::Stopped);
            }
            let name = self.inner.definition.name_at(state.at);
            self.crash_at(When::Before, name)?;
            let span = step_span(name, matches!(state.at, Position::Compensation(_)));
            let turn =
                self.turn(id, &mut state, begun, carried.take(), &span).instrument(span.clone()).await?;
            match turn {
                Turn::Carry(output) => {
                    let Position::Forward(i) = state.at else { unreachable!("only forward steps carry") };
                    carried = Some((i, output));
                    state.at = Position::Forward(i + 1);
                    (state.attempts, state.step_started_at, state.maybe_sent) = (None, None, false);
                    begun = false;
                }
                Turn::Committed(Next::Retry, _) => return Ok(Driven::Deferred),
                Turn::Committed(next @ (Next::Complete | Next::Cancel { .. } | Next::Compensated), at) => {
                    let outcome = if next == Next::Complete { "completed" } else { "compensated" };
                    let elapsed = (at - state.created_at).to_std().unwrap_or_default();
                    metrics::histogram!("saga_duration_seconds", "saga" => S::NAME, "outcome" => outcome)
                        .record(elapsed.as_secs_f64());
                    metrics::counter!("sagas_finished_total", "saga" => S::NAME, "outcome" => outcome)
                        .increment(1);
                    return Ok(Driven::Finished);
                }
                Turn::Committed(Next::Step(_) | Next::Compensate { .. }, _) => begun = true,
            }
        }
    }

    /// One step: run it (unless past its deadline), record its outcome on
    /// `span`, and commit the transition (with `carried`'s result); `state`
    /// becomes what was committed.
    async fn turn(
        &self,
        id: Uuid,
        state: &mut State<S>,
        begun: bool,
        carried: Option<(usize, Value)>,
        span: &tracing::Span,
    ) -> Result<Turn, DriveError> {
        let def = &self.inner.definition;
        let name = def.name_at(state.at);
        let forward = match state.at {
            Position::Forward(i) => Some(&def.steps[i]),
            Position::Compensation(_) => None,
        };
        let local = forward.is_some_and(|s| s.local);
        let late = self.past_deadline(state);
        let outcome = if late {
            Err(StepError::Failed(format!("{name} missed its deadline")))
        } else {
            // A local step needs no attempt record: no deadline, no call to repeat.
            if !begun && !local {
                let (attempts, started_at) = self.begin_step(id, name).await?;
                (state.attempts, state.step_started_at) = (Some(attempts), Some(started_at));
            }
            let outcome = self.run_step(id, state, name).await;
            self.crash_at(When::AfterCall, name)?;
            match outcome {
                // This attempt was not sent, but an earlier one may have had its effect.
                Err(StepError::Unavailable(why)) if forward.is_some() && state.maybe_sent => {
                    Err(StepError::Failed(format!("{why}; an earlier attempt may have taken effect")))
                }
                outcome => outcome,
            }
        };
        if matches!(outcome, Err(StepError::Failed(_))) {
            state.maybe_sent = true;
        }
        record_outcome(span, &outcome);
        metrics::counter!("saga_steps_total", "saga" => S::NAME, "step" => name, "result" => label(&outcome))
            .increment(1);
        let attempts = state.attempts.unwrap_or(1).max(1) as u32;
        let next = transition(def, state.at, &outcome, attempts, late);
        if let (Next::Step(Position::Forward(i)), Ok(output)) = (&next, &outcome)
            && carried.is_none()
            && def.commits_with_next(i - 1)
        {
            return Ok(Turn::Carry(output.clone()));
        }
        let at = self.commit(id, state, outcome, &next, carried, None).await?;
        self.crash_at(When::AfterCommit, name)?;
        Ok(Turn::Committed(next, at))
    }

    fn past_deadline(&self, state: &State<S>) -> bool {
        let Position::Forward(i) = state.at else { return false };
        let step = &self.inner.definition.steps[i];
        if !step.has_deadline() {
            return false;
        }
        let Some(started) = state.step_started_at else { return false };
        if self.inner.faults.is_late(step.name) {
            return true;
        }
        let deadline =
            step.options.deadline.unwrap_or(Duration::from_millis(self.inner.settings.step_deadline_ms));
        (Utc::now() - started).to_std().is_ok_and(|elapsed| elapsed > deadline)
    }

    /// Runs the current step (with the faults injected for it).
    async fn run_step(&self, id: Uuid, state: &State<S>, name: &'static str) -> Result<Value, StepError> {
        let ctx = StepContext::<S> {
            saga_id: id,
            step: name,
            input: &state.input,
            outputs: &state.outputs,
            failure_reason: state.failure_reason.as_deref(),
        };
        let plan = self.inner.faults.plan(id, name);
        if plan.reject {
            return Err(StepError::Rejected(format!("{name}: rejected by fault injection")));
        }
        if plan.unavailable {
            return Err(match state.at {
                Position::Forward(_) => {
                    StepError::Unavailable(format!("{name}: not sent by fault injection"))
                }
                // A compensation that was not sent has undone nothing yet.
                Position::Compensation(_) => {
                    StepError::Failed(format!("{name}: not sent by fault injection"))
                }
            });
        }
        let started = Instant::now();
        let run = || async {
            match state.at {
                Position::Forward(i) => self.inner.definition.steps[i].forward.run(&ctx).await,
                Position::Compensation(i) => match &self.inner.definition.steps[i].compensation {
                    Some((_, c)) => c.run(&ctx).await.map(|()| Value::Null),
                    None => unreachable!("a compensation position names a step with one"),
                },
            }
        };
        let mut result = run().await;
        if plan.twice {
            result = run().await;
        }
        metrics::histogram!("saga_step_duration_seconds", "saga" => S::NAME, "step" => name)
            .record(started.elapsed().as_secs_f64());
        if plan.fail_after {
            return Err(StepError::Failed(format!("{name}: failed after the call by fault injection")));
        }
        result
    }

    /// Records the attempt (so a step's start survives a crash, for its
    /// deadline) and renews the lease, in one statement (not waiting for its
    /// WAL flush); returns the step's attempts so far and when its first
    /// attempt started.
    async fn begin_step(&self, id: Uuid, name: &str) -> Result<(i32, DateTime<Utc>), DriveError> {
        let sql = format!(
            "WITH s AS (
                 UPDATE saga_instances SET lease_expires_at = now() + make_interval(secs => $3), updated_at = now()
                 WHERE id = $1 AND lease_owner = $2
                 RETURNING id)
             INSERT INTO saga_instance_steps (saga_id, name, status, attempts)
             SELECT id, $4, 'RUNNING', 1 FROM s, {NO_FLUSH_WAIT}
             ON CONFLICT (saga_id, name) DO UPDATE
                 SET attempts = saga_instance_steps.attempts + 1, status = 'RUNNING', attempt_started_at = now()
             RETURNING attempts, started_at"
        );
        sqlx::query_as(AssertSqlSafe(sql))
            .bind(id)
            .bind(self.owner())
            .bind(self.lease_secs())
            .bind(name)
            .fetch_optional(&self.inner.pool)
            .await?
            .ok_or(DriveError::LeaseLost(id))
    }

    /// Gives instance `id` back to the worker pool, runnable after `delay`.
    pub async fn release_lease(&self, id: Uuid, delay: Duration) -> Result<(), DriveError> {
        sqlx::query(
            "UPDATE saga_instances SET lease_owner = NULL, lease_expires_at = NULL,
                    next_attempt_at = now() + make_interval(secs => $3)
             WHERE id = $1 AND lease_owner = $2",
        )
        .bind(id)
        .bind(self.owner())
        .bind(delay.as_secs_f64())
        .execute(&self.inner.pool)
        .await?;
        Ok(())
    }

    /// Commits a step's outcome and the transition `next` in one statement
    /// guarded by the lease, with the host's writes; updates `state` to match
    /// and returns the commit time. With `audit` (an operator's action) the
    /// action is recorded too and the instance is handed back to the worker,
    /// due at once.
    pub(crate) async fn commit(
        &self,
        id: Uuid,
        state: &mut State<S>,
        outcome: Result<Value, StepError>,
        next: &Next,
        carried: Option<(usize, Value)>,
        audit: Option<&Audit<'_>>,
    ) -> Result<DateTime<Utc>, DriveError> {
        let def = &self.inner.definition;
        let name = def.name_at(state.at);
        let host = |e: StepError| DriveError::Host(id, e);
        let mut w = Statement::new("saga_s");
        let plan = Plan::new(next, state, carried.is_some(), audit.is_some(), &self.inner.settings);
        // The outputs this commit adds: the step's (forward, succeeded) and the
        // carried one's; a null output (a step that returns `()`) is not stored.
        let mut outputs = Map::new();
        if let Some((i, output)) = &carried
            && !output.is_null()
        {
            outputs.insert(def.steps[*i].name.to_string(), output.clone());
        }
        if let (Position::Forward(_), Ok(output)) = (state.at, &outcome)
            && !output.is_null()
        {
            outputs.insert(name.to_string(), output.clone());
        }
        self.update_instance(&mut w, id, &plan);
        let error = outcome.as_ref().err().map(|e| e.message().to_string());
        let next_attempt =
            self.write_steps(&mut w, name, &outcome, &plan, carried.as_ref().map(|(i, v)| (*i, v)), audit);
        let (status, current, reason, delay, finished) =
            (plan.status, plan.current, plan.reason, plan.delay, plan.finished);

        // The host's writes: the successful steps' records, then the end's.
        // They read the outputs this commit adds too: merged into `state` now
        // (a failed commit ends the driver, which drops `state`).
        state.outputs.extend(outputs);
        let reason_now = reason.map(str::to_string).or_else(|| state.failure_reason.clone());
        {
            let ctx = StepContext::<S> {
                saga_id: id,
                step: name,
                input: &state.input,
                outputs: &state.outputs,
                failure_reason: reason_now.as_deref(),
            };
            if let Some((i, output)) = &carried {
                def.steps[*i].forward.record(&ctx, output, &mut w).map_err(host)?;
            }
            if let (Position::Forward(i), Ok(output)) = (state.at, &outcome) {
                def.steps[i].forward.record(&ctx, output, &mut w).map_err(host)?;
            }
            let end = match next {
                Next::Complete => Some(End::Completed),
                Next::Cancel { reason } => Some(End::Compensated { reason }),
                Next::Compensated => {
                    Some(End::Compensated { reason: reason_now.as_deref().unwrap_or("compensated") })
                }
                _ => None,
            };
            if let Some(end) = end {
                def.saga.on_end(&ctx, &end, &mut w).map_err(host)?;
            }
        }
        if let Some(audit) = audit {
            self.audit(&mut w, id, name, state, audit).map_err(|e| match e {
                crate::admin::ActionError::Host(e) => host(e),
                other => host(StepError::Failed(other.to_string())),
            })?;
        }

        let returning = if next_attempt.is_some() {
            "(SELECT attempts FROM saga_next), (SELECT started_at FROM saga_next)"
        } else {
            "NULL::int, NULL::timestamptz"
        };
        // Only the end of an instance waits for its WAL flush; see the module docs.
        let no_flush_wait = if finished { String::new() } else { format!(", {NO_FLUSH_WAIT}") };
        let (sql, args) = w.finish(&format!("SELECT now(), {returning} FROM saga_s{no_flush_wait}"))?;
        let written: Option<Written> =
            sqlx::query_as_with(AssertSqlSafe(sql), args).fetch_optional(&self.inner.pool).await?;
        let (at, attempts, started_at) = written.ok_or(DriveError::LeaseLost(id))?;
        if *next == Next::Retry {
            tracing::warn!(saga = S::NAME, step = name, ?delay, error = ?error, "saga step will be retried");
        }

        // `state` after the commit.
        if let Some(status) = status {
            state.status = status;
        }
        if let Some(reason) = reason {
            state.failure_reason = Some(reason.to_string());
        }
        if let Some(p) = current {
            state.at = p;
            (state.attempts, state.step_started_at, state.maybe_sent) = (attempts, started_at, false);
        }
        Ok(at)
    }
}

/// What a transition makes of the instance's row.
struct Plan<'a> {
    status: Option<SagaStatus>,
    /// The step to run next, when it changes.
    current: Option<Position>,
    /// The failure reason, when it is set now.
    reason: Option<&'a str>,
    /// Hand the lease back (the instance ends, waits for a retry, or an
    /// operator's action hands it to the worker).
    release: bool,
    /// Runnable again after this (a retry's backoff; zero when handed back).
    delay: Option<Duration>,
    finished: bool,
    /// An operator's action: the worker records the next attempt, not this commit.
    hand_back: bool,
    /// A transition to another step or status (a retry is no progress).
    progressed: bool,
}

impl<'a> Plan<'a> {
    fn new<S: Saga>(
        next: &'a Next,
        state: &State<S>,
        carried: bool,
        operator: bool,
        settings: &SagaSettings,
    ) -> Self {
        let (status, current, reason, release, delay, finished) = match next {
            Next::Step(p) => (None, Some(*p), None, false, None, false),
            Next::Compensate { first, reason } => {
                (Some(SagaStatus::Compensating), Some(*first), Some(reason.as_str()), false, None, false)
            }
            Next::Retry => {
                let attempts = state.attempts.unwrap_or(1).max(1) as u32;
                let backoff = Backoff::from_millis(settings.retry_base_ms, settings.retry_max_ms);
                (None, None, None, true, Some(backoff.delay(attempts)), false)
            }
            Next::Complete => (Some(SagaStatus::Completed), None, None, true, None, true),
            Next::Cancel { reason } => {
                (Some(SagaStatus::Compensated), None, Some(reason.as_str()), true, None, true)
            }
            Next::Compensated => (Some(SagaStatus::Compensated), None, None, true, None, true),
        };
        let hand_back = operator && !finished;
        let (release, delay) = if hand_back { (true, Some(Duration::ZERO)) } else { (release, delay) };
        // A carried step's result moves the instance to the (local) step
        // that commits it, also when that step is to be retried.
        let current = current.or(if carried && !finished { Some(state.at) } else { None });
        Plan {
            status,
            current,
            reason,
            release,
            delay,
            finished,
            hand_back,
            progressed: *next != Next::Retry,
        }
    }
}

impl<S: Saga> Engine<S> {
    /// `saga_s`: the lease-guarded update of the instance's row, which every
    /// other part of the statement selects from.
    fn update_instance(&self, w: &mut Statement, id: Uuid, plan: &Plan<'_>) {
        let (pid, powner) = (w.bind(id), w.bind(self.owner().to_string()));
        let mut sql = String::with_capacity(320);
        sql.push_str("UPDATE saga_instances SET updated_at = now()");
        let mut set = |column: &str, value: &str| {
            sql.push_str(", ");
            sql.push_str(column);
            sql.push_str(" = ");
            sql.push_str(value);
        };
        if plan.progressed {
            set("progressed_at", "now()");
        }
        if let Some(status) = plan.status {
            set("status", &w.bind(status));
        }
        if let Some(p) = plan.current {
            set("current_step", &w.bind(self.inner.definition.name_at(p)));
        } else if plan.finished {
            set("current_step", "NULL");
        }
        if let Some(reason) = plan.reason {
            set("failure_reason", &w.bind(reason.to_string()));
        }
        if plan.release {
            set("lease_owner", "NULL");
            set("lease_expires_at", "NULL");
        } else {
            let secs = w.bind(self.lease_secs());
            set("lease_expires_at", &format!("now() + make_interval(secs => {secs})"));
        }
        if let Some(delay) = plan.delay {
            let secs = w.bind(delay.as_secs_f64());
            set("next_attempt_at", &format!("now() + make_interval(secs => {secs})"));
        }
        if plan.finished {
            set("finished_at", "now()");
        }
        sql.push_str(" WHERE id = ");
        sql.push_str(&pid);
        sql.push_str(" AND lease_owner = ");
        sql.push_str(&powner);
        sql.push_str(" RETURNING id");
        w.with("saga_s", sql);
    }

    /// The step rows: the current step's result (`saga_done`), the carried
    /// step's (`saga_carried`), and the next step's attempt (`saga_next`),
    /// whose position it returns when there is one.
    fn write_steps(
        &self,
        w: &mut Statement,
        name: &'static str,
        outcome: &Result<Value, StepError>,
        plan: &Plan<'_>,
        carried: Option<(usize, &Value)>,
        audit: Option<&Audit<'_>>,
    ) -> Option<Position> {
        let def = &self.inner.definition;
        let (step_status, error) = match outcome {
            Ok(_) => (StepStatus::Succeeded, None),
            Err(e) if !plan.progressed => (StepStatus::Running, Some(e.message().to_string())),
            Err(e) => (StepStatus::Failed, Some(e.message().to_string())),
        };
        let (sname, sstatus, serror) = (w.bind(name), w.bind(step_status), w.bind(error));
        // A succeeded forward step's output, stored in its row (null: none).
        let forward = def.steps.iter().any(|s| s.name == name);
        let soutput = w.bind(outcome.as_ref().ok().filter(|o| forward && !o.is_null()).cloned());
        let finished_at = if step_status == StepStatus::Running { "NULL" } else { "now()" };
        // `history` keeps the attempts that did not simply succeed (failures,
        // rejections, operators' actions); a success is the row itself (see
        // `steps_json`), so the happy path writes no JSON.
        let (insert_history, update_history) = if outcome.is_err() || audit.is_some() {
            let outcome = w.bind(audit.map_or(label(outcome), |a| a.action.outcome()));
            let existing = ("saga_instance_steps.attempts", "saga_instance_steps.attempt_started_at");
            (
                history_entry("1", "now()", &outcome, &serror),
                format!(
                    ", history = saga_instance_steps.history || {}",
                    history_entry(existing.0, existing.1, &outcome, &serror)
                ),
            )
        } else {
            ("'[]'::jsonb".to_string(), String::new())
        };
        w.with(
            "saga_done",
            format!(
                "INSERT INTO saga_instance_steps (saga_id, name, status, attempts, error, finished_at, history, output)
                 SELECT id, {sname}, {sstatus}, 1, {serror}, {finished_at}, {insert_history}, {soutput}::jsonb FROM saga_s
                 ON CONFLICT (saga_id, name) DO UPDATE
                     SET status = EXCLUDED.status, error = EXCLUDED.error, finished_at = EXCLUDED.finished_at,
                         output = COALESCE(EXCLUDED.output, saga_instance_steps.output){update_history}"
            ),
        );
        if let Some((i, output)) = carried {
            let cname = w.bind(def.steps[i].name);
            let coutput = w.bind(Some(output).filter(|o| !o.is_null()).cloned());
            w.with(
                "saga_carried",
                format!(
                    "INSERT INTO saga_instance_steps (saga_id, name, status, attempts, finished_at, output)
                     SELECT id, {cname}, 'SUCCEEDED', 1, now(), {coutput}::jsonb FROM saga_s
                     ON CONFLICT (saga_id, name) DO UPDATE
                         SET status = 'SUCCEEDED', error = NULL, finished_at = now(), output = EXCLUDED.output"
                ),
            );
        }
        // The next step's attempt starts with this commit (a local one needs
        // none); handed back, the worker records it when it runs the step.
        let next_attempt = plan
            .current
            .filter(|p| !plan.hand_back && !matches!(p, Position::Forward(j) if def.steps[*j].local));
        if let Some(p) = next_attempt {
            let nname = w.bind(def.name_at(p));
            w.with(
                "saga_next",
                format!(
                    "INSERT INTO saga_instance_steps (saga_id, name, status, attempts)
                     SELECT id, {nname}, 'RUNNING', 1 FROM saga_s
                     ON CONFLICT (saga_id, name) DO UPDATE
                         SET attempts = saga_instance_steps.attempts + 1, status = 'RUNNING', attempt_started_at = now()
                     RETURNING attempts, started_at"
                ),
            );
        }
        next_attempt
    }
}

/// One element of a step's `history` (SQL expressions for its values).
fn history_entry(attempt: &str, started_at: &str, outcome: &str, error: &str) -> String {
    format!(
        "jsonb_build_array(jsonb_build_object('attempt', {attempt}, 'started_at', {started_at}, \
         'ended_at', now(), 'outcome', {outcome}::text, 'error', {error}::text))"
    )
}

/// A commit's time, and the next step's attempts and first start when one starts.
type Written = (DateTime<Utc>, Option<i32>, Option<DateTime<Utc>>);

enum Turn {
    /// The step succeeded; its result commits with the next (local) step's.
    Carry(Value),
    Committed(Next, DateTime<Utc>),
}

fn log_outcome(id: Uuid, result: Result<Driven, DriveError>) {
    match result {
        Ok(_) | Err(DriveError::Crashed(_)) => {}
        Err(DriveError::LeaseLost(_)) => tracing::info!(saga.id = %id, "saga taken over by another replica"),
        Err(e @ DriveError::Undrivable(..)) => {
            tracing::error!(saga.id = %id, error = %e, "saga left for an operator")
        }
        // The lease runs out and the worker (here or elsewhere) resumes it.
        Err(e) => tracing::warn!(saga.id = %id, error = %e, "saga driver stopped; it will be resumed"),
    }
}

/// The span of one step (`saga.step`, inside the `saga` span); its outcome is
/// recorded by [`record_outcome`].
fn step_span(name: &str, compensation: bool) -> tracing::Span {
    tracing::info_span!(
        "saga.step",
        saga.step.name = name,
        saga.step.compensation = compensation,
        saga.step.outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
}

/// `saga.step.outcome`; a rejected or failed step is an error span.
fn record_outcome(span: &tracing::Span, outcome: &Result<Value, StepError>) {
    span.record("saga.step.outcome", label(outcome));
    if let Err(e) = outcome {
        span.record("otel.status_code", "ERROR");
        span.record("otel.status_description", e.message());
    }
}

/// A step outcome's label for metrics and spans.
fn label(outcome: &Result<Value, StepError>) -> &'static str {
    match outcome {
        Ok(_) => "succeeded",
        Err(StepError::Rejected(_)) => "rejected",
        Err(StepError::Unavailable(_)) => "unavailable",
        Err(StepError::Failed(_)) => "failed",
    }
}
