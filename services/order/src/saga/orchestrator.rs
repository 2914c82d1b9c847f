//! Drives one saga from its persisted state to the end.
//!
//! [`Orchestrator::drive`] reads the saga once (only while this replica holds
//! its lease) and records the attempt of its current step. Each turn then runs
//! the step and commits, in one statement guarded by the lease, the step's
//! result, the saga's next state, the start of the next step's attempt and
//! the order's change (with its outbox event, when there is one, in the same
//! statement), so a replica that lost its lease can never overwrite the one
//! that took over. The driver keeps the state it committed, so a saga costs
//! one database round trip per step plus the participants' calls, and one
//! fewer on the happy path: a step that succeeded and leads to a local step
//! (`confirm_order`) commits its result with that step's. Whatever
//! point a crash hits, the persisted state names a step whose (idempotent)
//! re-execution is safe.
//!
//! # Durability
//!
//! Only the commits the outside world relies on wait for their WAL flush:
//! `CreateOrder`'s (the client is told the order exists) and the one that
//! ends the saga (the client is told how it ended; the event goes out).
//! The commits in between (a step's attempt, a step's result) are
//! asynchronous (`synchronous_commit = off` for that transaction only).
//! Losing one in a database crash leaves the saga where the previous durable
//! commit left it, which is exactly the state a driver crash right after the
//! participant's answer leaves (the `after_call` crash points): the saga is
//! resumed there and the participants replay the calls it repeats (a lost
//! attempt record also restarts that step's deadline). Any later
//! synchronous commit flushes the earlier ones with it. This saves two or
//! three of the order database's WAL flushes per saga, and their latency on
//! the saga's path.

use super::{Step, StepOutcome, Transition, transition};
use crate::config::SagaSettings;
use crate::orders;
use chrono::{DateTime, Utc};
use rand::Rng;
use sagaworks_outbox::{NewEvent, OutboxWriter, PendingEvent};
use sagaworks_proto::inventory::v1 as inv;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_proto::payment::v1 as pay;
use sagaworks_proto::payment::v1::payment_service_client::PaymentServiceClient;
use sagaworks_resilience::{Rejection, ResilientChannel};
use sagaworks_runtime::db::NO_FLUSH_WAIT;
use sagaworks_telemetry::grpc::{ClientTrace, ClientTraceLayer};
use tower::Layer;
use tracing::Instrument;

/// A participant channel: the resilience stack, each call traced.
type Channel = ClientTrace<ResilientChannel>;
use sqlx::{FromRow, PgPool};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tonic::Code;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error("lease on saga {0} lost to another driver")]
    LeaseLost(Uuid),
    #[error("crash injected at {0}")]
    Crashed(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Outbox(#[from] sagaworks_outbox::OutboxError),
}

/// How a call to [`Orchestrator::drive`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driven {
    /// The saga reached COMPLETED or COMPENSATED.
    Finished,
    /// A step is to be retried later; the lease was released.
    Deferred,
    /// This replica is shutting down; the lease was released.
    Stopped,
}

/// Where fault injection stops this replica dead (see `SagaSettings::crash_point`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum CrashPoint {
    Before(Step),
    AfterCall(Step),
    AfterCommit(Step),
}

impl CrashPoint {
    fn parse(s: &str) -> Option<Self> {
        let (when, step) = s.split_once(':')?;
        let step = Step::parse(step)?;
        match when {
            "before" => Some(Self::Before(step)),
            "after_call" => Some(Self::AfterCall(step)),
            "after_commit" => Some(Self::AfterCommit(step)),
            _ => None,
        }
    }
}

/// A saga `CreateOrder` just committed: what its driver would otherwise read back.
#[derive(Debug)]
pub struct NewSaga {
    pub saga_id: Uuid,
    pub order_id: Uuid,
    pub customer_id: Uuid,
    pub created_at: DateTime<Utc>,
    /// Product id -> quantity.
    pub items: std::collections::BTreeMap<Uuid, i64>,
    /// `CreateOrder` recorded the first step's first attempt (at `created_at`).
    pub first_attempt: bool,
}

/// A saga as its driver knows it: read once, then kept equal to what each
/// commit wrote.
#[derive(Debug, FromRow)]
struct State {
    status: String,
    current_step: String,
    failure_reason: Option<String>,
    created_at: DateTime<Utc>,
    order_id: Uuid,
    customer_id: Uuid,
    total_cents: i64,
    step_started_at: Option<DateTime<Utc>>,
    attempts: Option<i32>,
    /// The order's items, when known without reading them (a new saga).
    #[sqlx(skip)]
    items: Option<Vec<(Uuid, i64)>>,
}

struct Inner {
    pool: PgPool,
    inventory: InventoryServiceClient<Channel>,
    payment: PaymentServiceClient<Channel>,
    outbox: OutboxWriter,
    settings: SagaSettings,
    owner: String,
    crash_point: Option<CrashPoint>,
    crashed: AtomicBool,
    /// Bounds the sagas this replica drives at once.
    permits: Arc<Semaphore>,
}

#[derive(Clone)]
pub struct Orchestrator {
    inner: Arc<Inner>,
}

impl Orchestrator {
    pub fn new(
        pool: PgPool,
        inventory: ResilientChannel,
        payment: ResilientChannel,
        settings: SagaSettings,
    ) -> Result<Self, String> {
        let crash_point = match settings.crash_point.as_str() {
            "" => None,
            s => Some(CrashPoint::parse(s).ok_or_else(|| format!("invalid saga.crash_point {s:?}"))?),
        };
        let owner = format!("{}-{}", hostname(), Uuid::new_v4().simple());
        let permits = Arc::new(Semaphore::new(settings.max_concurrent.max(1)));
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                inventory: InventoryServiceClient::new(ClientTraceLayer::default().layer(inventory)),
                payment: PaymentServiceClient::new(ClientTraceLayer::default().layer(payment)),
                outbox: OutboxWriter::new("order"),
                settings,
                owner,
                crash_point,
                crashed: AtomicBool::new(false),
                permits,
            }),
        })
    }

    /// This replica's lease owner id.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    pub fn settings(&self) -> &SagaSettings {
        &self.inner.settings
    }

    pub fn permits(&self) -> Arc<Semaphore> {
        self.inner.permits.clone()
    }

    /// True once injected fault stopped this replica (it then drives nothing).
    pub fn has_crashed(&self) -> bool {
        self.inner.crashed.load(Ordering::SeqCst)
    }

    fn crash_at(&self, point: CrashPoint) -> Result<(), DriveError> {
        if self.inner.crash_point.as_ref() == Some(&point) {
            self.inner.crashed.store(true, Ordering::SeqCst);
            tracing::warn!(?point, "fault injection: this replica stops dead here");
        }
        if self.has_crashed() { Err(DriveError::Crashed(format!("{point:?}"))) } else { Ok(()) }
    }

    /// Drives saga `id` (leased to this replica) until it finishes, must wait
    /// for a retry, or `stop` is set. Runs in the caller's span (the worker's
    /// `saga` span, parented on the order's trace).
    pub async fn drive(
        &self,
        id: Uuid,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<Driven, DriveError> {
        let state = self.load(id).await?;
        self.drive_from(id, state, false, stop).await
    }

    /// Drives a saga `CreateOrder` just committed (leased to this replica),
    /// without reading back what it knows.
    #[tracing::instrument(name = "saga", skip_all, fields(saga.id = %saga.saga_id))]
    pub async fn drive_new(
        &self,
        saga: NewSaga,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<Driven, DriveError> {
        let state = State {
            status: "RUNNING".into(),
            current_step: Step::ReserveStock.as_str().into(),
            failure_reason: None,
            created_at: saga.created_at,
            order_id: saga.order_id,
            customer_id: saga.customer_id,
            total_cents: 0,
            step_started_at: saga.first_attempt.then_some(saga.created_at),
            attempts: saga.first_attempt.then_some(1),
            items: Some(saga.items.into_iter().collect()),
        };
        self.drive_from(saga.saga_id, state, saga.first_attempt, stop).await
    }

    /// `begun`: the current step's attempt is recorded already (by
    /// `CreateOrder`); after the first turn, every commit records the next
    /// step's attempt with it.
    async fn drive_from(
        &self,
        id: Uuid,
        mut state: State,
        mut begun: bool,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<Driven, DriveError> {
        // A step that succeeded and whose result commits with the next (local) step's.
        let mut carried: Option<Step> = None;
        loop {
            if self.has_crashed() {
                return Err(DriveError::Crashed("earlier".into()));
            }
            let Some(step) = Step::parse(&state.current_step) else {
                tracing::error!(step = %state.current_step, "unknown saga step; leaving it for an operator");
                return Ok(Driven::Deferred);
            };
            if matches!(state.status.as_str(), "COMPLETED" | "COMPENSATED") {
                return Ok(Driven::Finished);
            }
            if stop.is_cancelled() {
                self.release_lease(id, Duration::ZERO).await?;
                return Ok(Driven::Stopped);
            }
            self.crash_at(CrashPoint::Before(step))?;
            let span = step_span(step);
            let (next, committed) = self
                .turn(id, step, &mut state, begun, carried.take(), &span)
                .instrument(span.clone())
                .await?;
            let Some(finished) = committed else {
                // Not committed: it goes with the next step's commit.
                carried = Some(step);
                begun = false;
                continue;
            };
            match next {
                Transition::Retry => return Ok(Driven::Deferred),
                Transition::Complete | Transition::Cancel { .. } | Transition::Compensated => {
                    let outcome =
                        if matches!(next, Transition::Complete) { "confirmed" } else { "cancelled" };
                    let elapsed = (finished - state.created_at).to_std().unwrap_or_default();
                    metrics::histogram!("saga_duration_seconds", "outcome" => outcome)
                        .record(elapsed.as_secs_f64());
                    metrics::counter!("sagas_finished_total", "outcome" => outcome).increment(1);
                    return Ok(Driven::Finished);
                }
                Transition::Next(_) | Transition::Compensate { .. } => begun = true,
            }
        }
    }

    /// One step: run it (unless past its deadline), record its outcome on
    /// `span` (the step's span), and commit the transition (with the result
    /// of `carried`, the step before, when it was deferred); `state` becomes
    /// what was committed. Returns the commit time, or `None` when the commit
    /// is deferred: a step that succeeded and leads to a local step (one
    /// without a call, [`Step::is_local`]) commits its result with that
    /// step's, one statement instead of two. A crash in between resumes the
    /// saga at the deferred step, whose call is idempotent.
    async fn turn(
        &self,
        id: Uuid,
        step: Step,
        state: &mut State,
        begun: bool,
        carried: Option<Step>,
        span: &tracing::Span,
    ) -> Result<(Transition, Option<DateTime<Utc>>), DriveError> {
        let (outcome, reservation) = if self.past_deadline(step, state) {
            (StepOutcome::Failed(format!("{} missed its deadline", step.as_str())), None)
        } else {
            // A local step needs no attempt record: it has no deadline and no call to repeat.
            if !begun && !step.is_local() {
                let (attempts, started_at) = self.begin_step(id, step).await?;
                state.attempts = Some(attempts);
                state.step_started_at = Some(started_at);
            }
            let result = self.run_step(id, step, state).await;
            self.crash_at(CrashPoint::AfterCall(step))?;
            result
        };
        record_outcome(span, &outcome);
        metrics::counter!("saga_steps_total", "step" => step.as_str(), "result" => label(&outcome))
            .increment(1);
        let next = transition(step, &outcome);
        if let Transition::Next(following) = next
            && following.is_local()
            && reservation.is_none()
            && carried.is_none()
        {
            state.current_step = following.as_str().into();
            state.attempts = None;
            state.step_started_at = None;
            return Ok((next, None));
        }
        let commit = Commit::new(&self.inner.settings, step, state, &outcome, &next, reservation.as_ref())
            .carrying(carried);
        let finished = self.apply(id, state, commit, &next).await?;
        self.crash_at(CrashPoint::AfterCommit(step))?;
        Ok((next, Some(finished)))
    }

    fn past_deadline(&self, step: Step, state: &State) -> bool {
        let deadline = chrono::Duration::milliseconds(self.inner.settings.step_deadline_ms as i64);
        !step.is_compensation()
            && step != Step::ConfirmOrder
            && state.step_started_at.is_some_and(|started| Utc::now() - started > deadline)
    }

    async fn load(&self, id: Uuid) -> Result<State, DriveError> {
        sqlx::query_as::<_, State>(
            "SELECT s.status, s.current_step, s.failure_reason, s.created_at,
                    o.id AS order_id, o.customer_id, o.total_cents,
                    st.started_at AS step_started_at, st.attempts
             FROM sagas s JOIN orders o ON o.id = s.order_id
             LEFT JOIN saga_steps st ON st.saga_id = s.id AND st.name = s.current_step
             WHERE s.id = $1 AND s.lease_owner = $2",
        )
        .bind(id)
        .bind(&self.inner.owner)
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or(DriveError::LeaseLost(id))
    }

    fn lease_secs(&self) -> f64 {
        self.inner.settings.lease_ms as f64 / 1000.0
    }

    /// Records the attempt (so a step's start survives a crash, for its
    /// deadline) and renews the lease, in one statement (not waiting for its
    /// WAL flush: see the module docs); returns the step's attempts so far and
    /// when its first attempt started.
    async fn begin_step(&self, id: Uuid, step: Step) -> Result<(i32, DateTime<Utc>), DriveError> {
        let sql = format!(
            "WITH s AS (
                 UPDATE sagas SET lease_expires_at = now() + make_interval(secs => $3), updated_at = now()
                 WHERE id = $1 AND lease_owner = $2
                 RETURNING id)
             INSERT INTO saga_steps (saga_id, name, status, attempts)
             SELECT id, $4, 'RUNNING', 1 FROM s, {NO_FLUSH_WAIT}
             ON CONFLICT (saga_id, name) DO UPDATE SET attempts = saga_steps.attempts + 1, status = 'RUNNING'
             RETURNING attempts, started_at"
        );
        sqlx::query_as(&sql)
            .bind(id)
            .bind(&self.inner.owner)
            .bind(self.lease_secs())
            .bind(step.as_str())
            .fetch_optional(&self.inner.pool)
            .await?
            .ok_or(DriveError::LeaseLost(id))
    }

    /// Gives the saga back to the worker pool, runnable after `delay`.
    pub async fn release_lease(&self, id: Uuid, delay: Duration) -> Result<(), DriveError> {
        sqlx::query(
            "UPDATE sagas SET lease_owner = NULL, lease_expires_at = NULL,
                    next_attempt_at = now() + make_interval(secs => $3)
             WHERE id = $1 AND lease_owner = $2",
        )
        .bind(id)
        .bind(&self.inner.owner)
        .bind(delay.as_secs_f64())
        .execute(&self.inner.pool)
        .await?;
        Ok(())
    }

    /// Runs `step`; a successful reservation comes back with its prices,
    /// which [`Self::apply`] records with the step's result.
    async fn run_step(&self, id: Uuid, step: Step, state: &State) -> (StepOutcome, Option<inv::Reservation>) {
        let key = format!("{id}:{}", step.as_str());
        let order_id = state.order_id.to_string();
        let reason = state.failure_reason.clone().unwrap_or_default();
        let started = Instant::now();
        let result = match step {
            Step::ReserveStock => {
                let items = match &state.items {
                    Some(items) => Ok(items.clone()),
                    None => match self.inner.pool.acquire().await {
                        Ok(mut conn) => orders::items(&mut conn, state.order_id)
                            .await
                            .map(|items| items.into_iter().map(|i| (i.product_id, i.quantity)).collect())
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    },
                };
                // Nothing was sent yet: a database hiccup here has no effect.
                let items = match items {
                    Ok(items) => items,
                    Err(e) => return (StepOutcome::Rejected(format!("loading items: {e}")), None),
                };
                let request = inv::ReserveStockRequest {
                    idempotency_key: key,
                    reservation_id: id.to_string(),
                    order_id,
                    items: items
                        .iter()
                        .map(|(product, quantity)| inv::ReserveItem {
                            product_id: product.to_string(),
                            quantity: *quantity,
                        })
                        .collect(),
                };
                self.inner.inventory.clone().reserve_stock(request).await.map(|r| Some(r.into_inner()))
            }
            Step::ChargePayment => {
                let request = pay::ChargeRequest {
                    idempotency_key: key,
                    payment_id: id.to_string(),
                    customer_id: state.customer_id.to_string(),
                    order_id,
                    amount_cents: state.total_cents,
                };
                self.inner.payment.clone().charge(request).await.map(|_| None)
            }
            Step::ConfirmOrder => Ok(None),
            Step::RefundPayment => {
                let request =
                    pay::RefundRequest { idempotency_key: key, payment_id: id.to_string(), order_id, reason };
                self.inner.payment.clone().refund(request).await.map(|_| None)
            }
            Step::ReleaseStock => {
                let request = inv::ReleaseReservationRequest {
                    idempotency_key: key,
                    reservation_id: id.to_string(),
                    order_id,
                    reason,
                };
                self.inner.inventory.clone().release_reservation(request).await.map(|_| None)
            }
        };
        metrics::histogram!("saga_step_duration_seconds", "step" => step.as_str())
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(reservation) => (StepOutcome::Succeeded, reservation),
            Err(status) => (classify(step, &status), None),
        }
    }

    /// Runs `commit` (the step's result and the saga's next state) — one
    /// statement, guarded by the lease, with the outbox event when the saga
    /// ends — and updates `state` to match. Returns the commit time.
    async fn apply(
        &self,
        id: Uuid,
        state: &mut State,
        commit: Commit<'_>,
        next: &Transition,
    ) -> Result<DateTime<Utc>, DriveError> {
        let event = match next {
            Transition::Complete => Some(("OrderConfirmed", serde_json::json!({}))),
            Transition::Cancel { reason } => {
                Some(("OrderCancelled", serde_json::json!({ "reason": reason })))
            }
            Transition::Compensated => {
                Some(("OrderCancelled", serde_json::json!({ "reason": commit.order_reason })))
            }
            _ => None,
        };
        let event = match event {
            None => None,
            Some((event_type, extra)) => {
                let mut payload = serde_json::json!({
                    "order_id": state.order_id, "customer_id": state.customer_id, "saga_id": id,
                    "reservation_id": id, "payment_id": id, "total_cents": commit.total_cents.unwrap_or(state.total_cents),
                });
                if let (Some(p), serde_json::Value::Object(extra)) = (payload.as_object_mut(), extra) {
                    p.extend(extra);
                }
                Some(self.inner.outbox.pending(NewEvent::new(
                    "order",
                    state.order_id,
                    event_type,
                    payload,
                )?)?)
            }
        };
        // One statement, with the event when there is one: atomic without a transaction.
        let mut conn = self.inner.pool.acquire().await?;
        let written = commit.execute(&mut conn, id, &self.inner.owner, self.lease_secs(), event).await?;
        let (at, attempts, started_at) = written.ok_or(DriveError::LeaseLost(id))?;
        if let Transition::Retry = next {
            tracing::warn!(step = commit.step, delay_s = commit.retry_delay_secs, error = ?commit.step_error,
                "saga step will be retried");
        }
        commit.update(state, attempts, started_at);
        Ok(at)
    }
}

/// What [`Orchestrator::apply`] writes for one step's outcome.
struct Commit<'a> {
    /// `sagas.status`, when it changes.
    saga_status: Option<&'static str>,
    /// `sagas.current_step`, when it changes (and the step whose attempt starts now).
    next_step: Option<&'static str>,
    /// `sagas.failure_reason`, when it is set now.
    saga_reason: Option<&'a str>,
    /// Hand the lease back (the saga ends, or waits for a retry).
    release: bool,
    retry_delay_secs: Option<f64>,
    finished: bool,
    step: &'static str,
    /// The step before, which succeeded and whose result commits now too.
    carried: Option<&'static str>,
    step_status: &'static str,
    step_error: Option<&'a str>,
    order_id: Uuid,
    /// The reservation's prices (a reserve that succeeded): product ids and unit prices.
    price_products: Vec<Uuid>,
    price_cents: Vec<i64>,
    total_cents: Option<i64>,
    order_status: Option<&'static str>,
    order_reason: Option<String>,
}

impl<'a> Commit<'a> {
    fn new(
        settings: &SagaSettings,
        step: Step,
        state: &State,
        outcome: &'a StepOutcome,
        next: &'a Transition,
        reservation: Option<&inv::Reservation>,
    ) -> Self {
        let (step_status, step_error) = match outcome {
            StepOutcome::Succeeded => ("SUCCEEDED", None),
            StepOutcome::Rejected(e) => ("FAILED", Some(e.as_str())),
            StepOutcome::Failed(e) if matches!(next, Transition::Retry) => ("RUNNING", Some(e.as_str())),
            StepOutcome::Failed(e) => ("FAILED", Some(e.as_str())),
        };
        let mut c = Commit {
            saga_status: None,
            next_step: None,
            saga_reason: None,
            release: false,
            retry_delay_secs: None,
            finished: false,
            step: step.as_str(),
            carried: None,
            step_status,
            step_error,
            order_id: state.order_id,
            price_products: Vec::new(),
            price_cents: Vec::new(),
            total_cents: None,
            order_status: None,
            order_reason: None,
        };
        // Inventory owns prices: the reservation tells what the order costs.
        if let (StepOutcome::Succeeded, Some(r)) = (outcome, reservation) {
            for line in &r.lines {
                if let Ok(product) = line.product_id.parse() {
                    c.price_products.push(product);
                    c.price_cents.push(line.unit_price_cents);
                }
            }
            c.total_cents = Some(r.total_cents);
        }
        match next {
            Transition::Next(step) => c.next_step = Some(step.as_str()),
            Transition::Compensate { first, reason } => {
                c.saga_status = Some("COMPENSATING");
                c.next_step = Some(first.as_str());
                c.saga_reason = Some(reason);
            }
            Transition::Retry => {
                let attempts = state.attempts.unwrap_or(1).max(1) as u32;
                c.release = true;
                c.retry_delay_secs = Some(backoff(settings, attempts).as_secs_f64());
            }
            Transition::Complete => {
                (c.saga_status, c.release, c.finished) = (Some("COMPLETED"), true, true);
                c.order_status = Some("CONFIRMED");
            }
            Transition::Cancel { reason } => {
                (c.saga_status, c.release, c.finished) = (Some("COMPENSATED"), true, true);
                c.saga_reason = Some(reason);
                c.order_status = Some("CANCELLED");
                c.order_reason = Some(reason.clone());
            }
            Transition::Compensated => {
                (c.saga_status, c.release, c.finished) = (Some("COMPENSATED"), true, true);
                c.order_status = Some("CANCELLED");
                c.order_reason = Some(state.failure_reason.clone().unwrap_or_else(|| "compensated".into()));
            }
        }
        c
    }

    /// Also records `carried`, the step before (which succeeded), in the same statement.
    fn carrying(self, carried: Option<Step>) -> Self {
        Self { carried: carried.map(Step::as_str), ..self }
    }

    /// Runs the statement; `None` when this replica no longer holds the lease
    /// (nothing was written). Otherwise: the commit time, and the attempts and
    /// start of the next step, when one starts.
    async fn execute(
        &self,
        conn: &mut sqlx::PgConnection,
        id: Uuid,
        owner: &str,
        lease_secs: f64,
        event: Option<PendingEvent>,
    ) -> Result<Option<(DateTime<Utc>, Option<i32>, Option<DateTime<Utc>>)>, sqlx::Error> {
        // Every part selects from `s`, the lease-guarded saga update: when
        // the lease is gone, none of them writes anything (the event neither).
        // Only the parts this outcome needs are in the statement: PostgreSQL
        // sets up every part of a statement on each execution, used or not.
        // Each shape is a prepared statement of its own.
        let mut parts = vec![
            "done AS (
                 INSERT INTO saga_steps (saga_id, name, status, attempts, error, finished_at)
                 SELECT id, $10, $11, 1, $12, CASE WHEN $11 = 'RUNNING' THEN NULL ELSE now() END FROM s
                 ON CONFLICT (saga_id, name) DO UPDATE
                     SET status = EXCLUDED.status, error = EXCLUDED.error, finished_at = EXCLUDED.finished_at)"
                .to_string(),
        ];
        if let Some(carried) = self.carried {
            // A step name: one of `Step`'s constants, never input.
            parts.push(format!(
                "carried AS (
                 INSERT INTO saga_steps (saga_id, name, status, attempts, finished_at)
                 SELECT id, '{carried}', 'SUCCEEDED', 1, now() FROM s
                 ON CONFLICT (saga_id, name) DO UPDATE SET status = 'SUCCEEDED', error = NULL, finished_at = now())"
            ));
        }
        if self.next_step.is_some() {
            parts.push(
                "next AS (
                 INSERT INTO saga_steps (saga_id, name, status, attempts)
                 SELECT id, $4, 'RUNNING', 1 FROM s
                 ON CONFLICT (saga_id, name) DO UPDATE SET attempts = saga_steps.attempts + 1, status = 'RUNNING'
                 RETURNING attempts, started_at)"
                    .into(),
            );
        }
        if !self.price_products.is_empty() {
            parts.push(
                "prices AS (
                 UPDATE order_items SET unit_price_cents = p.price
                 FROM s, UNNEST($14::uuid[], $15::bigint[]) AS p (product_id, price)
                 WHERE order_items.order_id = $13 AND order_items.product_id = p.product_id)"
                    .into(),
            );
        }
        if self.total_cents.is_some() || self.order_status.is_some() {
            parts.push(
                "ord AS (
                 UPDATE orders SET
                     total_cents = COALESCE($16, total_cents),
                     status = COALESCE($17, status),
                     failure_reason = CASE WHEN $17::text IS NULL THEN failure_reason ELSE $18 END,
                     updated_at = now()
                 FROM s WHERE orders.id = $13)"
                    .into(),
            );
        }
        if event.is_some() {
            parts.push(PendingEvent::cte("event", 19, Some("s")));
        }
        let next = if self.next_step.is_some() {
            "(SELECT attempts FROM next), (SELECT started_at FROM next)"
        } else {
            "NULL::int, NULL::timestamptz"
        };
        // Only the end of a saga waits for its WAL flush; see the module docs.
        let no_flush_wait = if self.finished { String::new() } else { format!(", {NO_FLUSH_WAIT}") };
        let sql = format!(
            "WITH s AS (
                 UPDATE sagas SET
                     status = COALESCE($3, status),
                     current_step = COALESCE($4, current_step),
                     failure_reason = COALESCE($5, failure_reason),
                     lease_owner = CASE WHEN $6 THEN NULL ELSE lease_owner END,
                     lease_expires_at = CASE WHEN $6 THEN NULL ELSE now() + make_interval(secs => $7) END,
                     next_attempt_at = CASE WHEN $8::float8 IS NULL THEN next_attempt_at
                                            ELSE now() + make_interval(secs => $8::float8) END,
                     finished_at = CASE WHEN $9 THEN now() ELSE finished_at END,
                     updated_at = now()
                 WHERE id = $1 AND lease_owner = $2
                 RETURNING id),
             {}
             SELECT now(), {next} FROM s{no_flush_wait}",
            parts.join(",\n             "),
        );
        let query = sqlx::query_as(&sql)
            .bind(id)
            .bind(owner)
            .bind(self.saga_status)
            .bind(self.next_step)
            .bind(self.saga_reason)
            .bind(self.release)
            .bind(lease_secs)
            .bind(self.retry_delay_secs)
            .bind(self.finished)
            .bind(self.step)
            .bind(self.step_status)
            .bind(self.step_error)
            .bind(self.order_id)
            .bind(&self.price_products)
            .bind(&self.price_cents)
            .bind(self.total_cents)
            .bind(self.order_status)
            .bind(self.order_reason.as_deref());
        match event {
            Some(event) => event.bind(query).fetch_optional(conn).await,
            None => query.fetch_optional(conn).await,
        }
    }

    /// `state` after the commit.
    fn update(&self, state: &mut State, attempts: Option<i32>, started_at: Option<DateTime<Utc>>) {
        if let Some(status) = self.saga_status {
            state.status = status.into();
        }
        if let Some(step) = self.next_step {
            state.current_step = step.into();
            state.attempts = attempts;
            state.step_started_at = started_at;
        }
        if let Some(reason) = self.saga_reason {
            state.failure_reason = Some(reason.into());
        }
        if let Some(total) = self.total_cents {
            state.total_cents = total;
        }
    }
}

/// Maps a participant's answer to a step outcome.
///
/// A forward call the resilience stack never sent (breaker open, bulkhead
/// full, or no attempt could connect) had no effect: `Rejected`, nothing to
/// compensate for it. Anything that may have reached the participant (a
/// timeout, an open breaker that cut the retries of an attempt that timed
/// out, a broken connection) is `Failed`. A compensation that was not sent
/// has undone nothing yet, so it is `Failed` (retried), never `Rejected`.
fn classify(step: Step, status: &tonic::Status) -> StepOutcome {
    let what = format!("{}: {}", step.as_str(), status.message());
    let why = match sagaworks_resilience::rejection(status) {
        Some(Rejection::BulkheadFull) => Some("too many calls in flight"),
        Some(Rejection::CircuitOpen { .. }) => Some("circuit open"),
        Some(Rejection::Timeout) => Some("timed out"),
        None => None,
    };
    let what = match why {
        Some(why) => format!("{what} ({why})"),
        None => what,
    };
    if sagaworks_resilience::never_sent(status) {
        return if step.is_compensation() {
            StepOutcome::Failed(format!("{what}; not sent"))
        } else {
            StepOutcome::Rejected(format!("{what}; not sent"))
        };
    }
    if why.is_some() {
        return StepOutcome::Failed(what);
    }
    match status.code() {
        Code::InvalidArgument
        | Code::NotFound
        | Code::FailedPrecondition
        | Code::Aborted
        | Code::AlreadyExists
        | Code::OutOfRange
        | Code::PermissionDenied
        | Code::Unauthenticated => StepOutcome::Rejected(what),
        _ => StepOutcome::Failed(what),
    }
}

/// Exponential backoff with full jitter for compensation retries.
fn backoff(settings: &SagaSettings, attempts: u32) -> Duration {
    let cap = settings.retry_base_ms.saturating_mul(1u64 << attempts.min(20)).min(settings.retry_max_ms);
    Duration::from_millis(rand::rng().random_range(0..=cap.max(1)))
}

/// The span of one step (`saga.step`, inside the `saga` span); its outcome is
/// recorded by [`record_outcome`].
fn step_span(step: Step) -> tracing::Span {
    tracing::info_span!(
        "saga.step",
        saga.step.name = step.as_str(),
        saga.step.compensation = step.is_compensation(),
        saga.step.outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
}

/// `saga.step.outcome`; a rejected or failed step is an error span.
fn record_outcome(span: &tracing::Span, outcome: &StepOutcome) {
    span.record("saga.step.outcome", label(outcome));
    if let StepOutcome::Rejected(e) | StepOutcome::Failed(e) = outcome {
        span.record("otel.status_code", "ERROR");
        span.record("otel.status_description", e.as_str());
    }
}

/// Step outcome label for metrics and spans.
fn label(o: &StepOutcome) -> &'static str {
    match o {
        StepOutcome::Succeeded => "succeeded",
        StepOutcome::Rejected(_) => "rejected",
        StepOutcome::Failed(_) => "failed",
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME").unwrap_or_else(|_| "order".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_points_parse() {
        assert_eq!(
            CrashPoint::parse("after_call:charge_payment"),
            Some(CrashPoint::AfterCall(Step::ChargePayment))
        );
        assert_eq!(CrashPoint::parse("before:reserve_stock"), Some(CrashPoint::Before(Step::ReserveStock)));
        assert_eq!(CrashPoint::parse("sometime:reserve_stock"), None);
        assert_eq!(CrashPoint::parse("before:nap"), None);
    }

    #[test]
    fn business_codes_are_rejections_and_transport_trouble_is_a_failure() {
        let s = tonic::Status::failed_precondition("insufficient stock");
        assert!(
            matches!(classify(Step::ReserveStock, &s), StepOutcome::Rejected(m) if m.contains("insufficient stock"))
        );
        assert!(matches!(
            classify(Step::ChargePayment, &tonic::Status::unavailable("x")),
            StepOutcome::Failed(_)
        ));
        assert!(matches!(
            classify(Step::ChargePayment, &tonic::Status::deadline_exceeded("x")),
            StepOutcome::Failed(_)
        ));
    }

    /// A status as the resilience stack returns it, marked `x-sagaworks-sent`.
    fn from_stack(mut status: tonic::Status, sent: &'static str) -> tonic::Status {
        let value = tonic::metadata::MetadataValue::from_static(sent);
        status.metadata_mut().insert(sagaworks_resilience::SENT_METADATA, value);
        status
    }

    fn open() -> tonic::Status {
        Rejection::CircuitOpen { retry_after: Duration::from_secs(1) }.to_status("payment")
    }

    #[test]
    fn a_forward_call_that_was_never_sent_had_no_effect() {
        let refused = from_stack(tonic::Status::unavailable("connection refused"), "no");
        assert!(
            matches!(classify(Step::ChargePayment, &refused), StepOutcome::Rejected(m) if m.contains("not sent"))
        );
        let open_no = from_stack(open(), "no");
        assert!(
            matches!(classify(Step::ChargePayment, &open_no), StepOutcome::Rejected(m) if m.contains("circuit open"))
        );
        let full = from_stack(Rejection::BulkheadFull.to_status("inventory"), "no");
        assert!(matches!(classify(Step::ReserveStock, &full), StepOutcome::Rejected(_)));
    }

    #[test]
    fn a_call_that_may_have_been_sent_may_have_had_an_effect() {
        // The breaker opened after an attempt that timed out: that one may have arrived.
        let open_maybe = from_stack(open(), "maybe");
        assert!(
            matches!(classify(Step::ChargePayment, &open_maybe), StepOutcome::Failed(m) if m.contains("circuit open"))
        );
        let timeout = from_stack(Rejection::Timeout.to_status("inventory"), "maybe");
        assert!(
            matches!(classify(Step::ReserveStock, &timeout), StepOutcome::Failed(m) if m.contains("timed out"))
        );
        let answered = from_stack(tonic::Status::unavailable("shutting down"), "maybe");
        assert!(matches!(classify(Step::ChargePayment, &answered), StepOutcome::Failed(_)));
        // Unmarked (not from the stack): the safe side.
        assert!(matches!(classify(Step::ChargePayment, &open()), StepOutcome::Failed(_)));
    }

    #[test]
    fn a_compensation_that_was_never_sent_is_retried_not_skipped() {
        for status in [
            from_stack(tonic::Status::unavailable("connection refused"), "no"),
            from_stack(open(), "no"),
            from_stack(Rejection::BulkheadFull.to_status("payment"), "no"),
        ] {
            assert!(matches!(classify(Step::RefundPayment, &status), StepOutcome::Failed(_)), "{status:?}");
            assert!(matches!(classify(Step::ReleaseStock, &status), StepOutcome::Failed(_)), "{status:?}");
        }
    }

    #[test]
    fn backoff_stays_within_the_cap() {
        let s = SagaSettings { retry_base_ms: 100, retry_max_ms: 1000, ..Default::default() };
        for attempt in 0..30 {
            assert!(backoff(&s, attempt) <= Duration::from_millis(1000));
        }
    }
}
