//! Driving an instance: one turn per step (run it unless past its deadline,
//! then commit the transition), until it finishes, must wait for a retry, or
//! the replica stops.

use super::state::State;
use super::transition::{Next, transition};
use super::{DriveError, Driven, Engine, telemetry};
use crate::definition::Position;
use crate::faults::When;
use crate::step::{Saga, StepError};
use chrono::{DateTime, Utc};
use sagaworks_runtime::db::NO_FLUSH_WAIT;
use serde_json::Value;
use sqlx::AssertSqlSafe;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

impl<S: Saga> Engine<S> {
    /// Drives instance `id` (leased to this replica) until it finishes, must
    /// wait for a retry, or `stop` is set. Runs in the caller's span.
    pub async fn drive(&self, id: Uuid, stop: &CancellationToken) -> Result<Driven, DriveError> {
        let state = self.load(id).await?;
        self.drive_from(id, state, false, stop).await
    }

    /// `begun`: the current step's attempt is recorded already (by the
    /// insert or the previous commit).
    pub(super) async fn drive_from(
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
            let name = self.def(&state).name_at(state.at);
            self.crash_at(When::Before, name)?;
            let span = telemetry::step_span(name, matches!(state.at, Position::Compensation(_)));
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
                Turn::Committed(Next::Retry { .. }, _) => return Ok(Driven::Deferred),
                Turn::Committed(next @ (Next::Complete | Next::Cancel { .. } | Next::Compensated), at) => {
                    let lived = (at - state.created_at).to_std().unwrap_or_default();
                    telemetry::finished(S::NAME, next == Next::Complete, lived);
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
        let def = self.def(state);
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
                Err(StepError::Unavailable { reason: why, .. }) if forward.is_some() && state.maybe_sent => {
                    Err(StepError::Failed(format!("{why}; an earlier attempt may have taken effect")))
                }
                outcome => outcome,
            }
        };
        if matches!(outcome, Err(StepError::Failed(_))) {
            state.maybe_sent = true;
        }
        telemetry::record_outcome(span, &outcome);
        telemetry::step_done(S::NAME, name, &outcome);
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
        let step = &self.def(state).steps[i];
        if !step.has_deadline() {
            return false;
        }
        let Some(started) = state.step_started_at else { return false };
        if self.faults().is_late(step.name) {
            return true;
        }
        let deadline =
            step.options.deadline.unwrap_or(Duration::from_millis(self.settings().step_deadline_ms));
        (Utc::now() - started).to_std().is_ok_and(|elapsed| elapsed > deadline)
    }

    /// Runs the current step (with the faults injected for it).
    async fn run_step(&self, id: Uuid, state: &State<S>, name: &'static str) -> Result<Value, StepError> {
        let ctx = state.context(id, name);
        let plan = self.faults().plan(id, name);
        if plan.reject {
            return Err(StepError::Rejected(format!("{name}: rejected by fault injection")));
        }
        if plan.unavailable {
            return Err(match state.at {
                Position::Forward(_) => {
                    StepError::unavailable(format!("{name}: not sent by fault injection"))
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
                Position::Forward(i) => self.def(state).steps[i].forward.run(&ctx).await,
                Position::Compensation(i) => match &self.def(state).steps[i].compensation {
                    Some((_, c)) => c.run(&ctx).await.map(|()| Value::Null),
                    None => unreachable!("a compensation position names a step with one"),
                },
            }
        };
        let mut result = run().await;
        if plan.twice {
            result = run().await;
        }
        telemetry::step_duration(S::NAME, name, started.elapsed());
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
            .fetch_optional(self.pool())
            .await?
            .ok_or(DriveError::LeaseLost(id))
    }

    fn crash_at(&self, when: When, step: &str) -> Result<(), DriveError> {
        if self.faults().crashes_at(when, step) {
            self.crashed_flag().store(true, Ordering::SeqCst);
            tracing::warn!(?when, step, "fault injection: this replica stops dead here");
        }
        if self.has_crashed() { Err(DriveError::Crashed(format!("{when:?}:{step}"))) } else { Ok(()) }
    }
}

enum Turn {
    /// The step succeeded; its result commits with the next (local) step's.
    Carry(Value),
    Committed(Next, DateTime<Utc>),
}
