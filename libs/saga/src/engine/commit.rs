//! The one statement a transition commits ([`Statement`]): the lease-guarded
//! update of the instance's row (the guard, `saga_s`), the step rows, an
//! operator's audit row, and the host's writes and events; and what the
//! driver's [`State`] becomes after it.

use super::state::State;
use super::transition::{Next, RowUpdate};
use super::{DriveError, Engine, telemetry};
use crate::definition::{Definition, Position};
use crate::operator::{Audit, OperatorRecord};
use crate::statement::Statement;
use crate::step::{End, Saga, StepError};
use crate::store::StepStatus;
use chrono::{DateTime, Utc};
use sagaworks_runtime::db::NO_FLUSH_WAIT;
use serde_json::{Map, Value};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

/// The guard of a transition's statement: the lease-guarded update of the
/// instance's row, returning its id.
pub(crate) const GUARD: &str = "saga_s";

impl<S: Saga> Engine<S> {
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
        let def = self.def(state);
        let name = def.name_at(state.at);
        let host = |e: StepError| DriveError::Host(id, e);
        let mut w = Statement::new();
        let plan = RowUpdate::new(next, state, carried.is_some(), audit.is_some(), self.settings());
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
        self.update_instance(&mut w, id, def, &plan);
        let error = outcome.as_ref().err().map(|e| e.message().to_string());
        let rows =
            StepRows { name, outcome: &outcome, carried: carried.as_ref().map(|(i, v)| (*i, v)), audit };
        let next_attempt = self.write_steps(&mut w, def, &plan, &rows);
        let (status, current, reason, delay, finished) =
            (plan.status, plan.current, plan.reason, plan.delay, plan.finished);

        // The host's writes: the successful steps' records, then the end's.
        // They read the outputs this commit adds too: merged into `state` now
        // (a failed commit ends the driver, which drops `state`).
        state.outputs.extend(outputs);
        let reason_now = reason.map(str::to_string).or_else(|| state.failure_reason.clone());
        {
            let mut ctx = state.context(id, name);
            ctx.failure_reason = reason_now.as_deref();
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
            self.audit(&mut w, id, name, state, audit).map_err(host)?;
        }

        let returning = if next_attempt.is_some() {
            "(SELECT attempts FROM saga_next), (SELECT started_at FROM saga_next)"
        } else {
            "NULL::int, NULL::timestamptz"
        };
        // Only the end of an instance waits for its WAL flush; see the module docs.
        let no_flush_wait = if finished { String::new() } else { format!(", {NO_FLUSH_WAIT}") };
        let (sql, args) = w.finish(&format!("SELECT now(), {returning} FROM {GUARD}{no_flush_wait}"))?;
        let written: Option<Written> =
            sqlx::query_as_with(AssertSqlSafe(sql), args).fetch_optional(self.pool()).await?;
        let (at, attempts, started_at) = written.ok_or(DriveError::LeaseLost(id))?;
        if matches!(next, Next::Retry { .. }) {
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

    /// `saga_s`: the lease-guarded update of the instance's row, which every
    /// other part of the statement selects from.
    fn update_instance(&self, w: &mut Statement, id: Uuid, def: &Definition<S>, plan: &RowUpdate<'_>) {
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
            set("current_step", &w.bind(def.name_at(p)));
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
        w.guard(GUARD, sql);
    }

    /// The step rows: the current step's result (`saga_done`), the carried
    /// step's (`saga_carried`), and the next step's attempt (`saga_next`),
    /// whose position it returns when there is one.
    fn write_steps(
        &self,
        w: &mut Statement,
        def: &Definition<S>,
        plan: &RowUpdate<'_>,
        rows: &StepRows<'_>,
    ) -> Option<Position> {
        let &StepRows { name, outcome, carried, audit } = rows;
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
            let outcome = w.bind(audit.map_or(telemetry::label(outcome), |a| a.action.outcome()));
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
        w.guarded("saga_done", |g| {
            g.insert(
                "saga_instance_steps (saga_id, name, status, attempts, error, finished_at, history, output)",
            )
            .select(format!(
                "{g}.id, {sname}, {sstatus}, 1, {serror}, {finished_at}, {insert_history}, {soutput}::jsonb"
            ))
            .then(format!(
                "ON CONFLICT (saga_id, name) DO UPDATE
                     SET status = EXCLUDED.status, error = EXCLUDED.error, finished_at = EXCLUDED.finished_at,
                         output = COALESCE(EXCLUDED.output, saga_instance_steps.output){update_history}"
            ))
        });
        if let Some((i, output)) = carried {
            let cname = w.bind(def.steps[i].name);
            let coutput = w.bind(Some(output).filter(|o| !o.is_null()).cloned());
            w.guarded("saga_carried", |g| {
                g.insert("saga_instance_steps (saga_id, name, status, attempts, finished_at, output)")
                    .select(format!("{g}.id, {cname}, 'SUCCEEDED', 1, now(), {coutput}::jsonb"))
                    .then(
                        "ON CONFLICT (saga_id, name) DO UPDATE
                         SET status = 'SUCCEEDED', error = NULL, finished_at = now(), output = EXCLUDED.output",
                    )
            });
        }
        // The next step's attempt starts with this commit (a local one needs
        // none); handed back, the worker records it when it runs the step.
        let next_attempt = plan
            .current
            .filter(|p| !plan.hand_back && !matches!(p, Position::Forward(j) if def.steps[*j].local));
        if let Some(p) = next_attempt {
            let nname = w.bind(def.name_at(p));
            w.guarded("saga_next", |g| {
                g.insert("saga_instance_steps (saga_id, name, status, attempts)")
                    .select(format!("{g}.id, {nname}, 'RUNNING', 1"))
                    .then(
                        "ON CONFLICT (saga_id, name) DO UPDATE
                         SET attempts = saga_instance_steps.attempts + 1, status = 'RUNNING', attempt_started_at = now()
                         RETURNING attempts, started_at",
                    )
            });
        }
        next_attempt
    }

    /// Adds the action's audit row and the host's record of it to `w`.
    pub(crate) fn audit(
        &self,
        w: &mut Statement,
        id: Uuid,
        step: &'static str,
        state: &State<S>,
        audit: &Audit<'_>,
    ) -> Result<(), StepError> {
        let op = audit.operator;
        let (action, sname) = (w.bind(audit.action.as_str()), w.bind(step));
        let (actor, reason, key) =
            (w.bind(op.actor.clone()), w.bind(op.reason.clone()), w.bind(op.idempotency_key.clone()));
        w.guarded("saga_audit", |g| {
            g.insert("saga_operator_actions (saga_id, action, step, actor, reason, idempotency_key)")
                .select(format!("{g}.id, {action}, {sname}, {actor}, {reason}, {key}"))
        });
        let ctx = state.context(id, step);
        let record = OperatorRecord { action: audit.action, step, actor: &op.actor, reason: &op.reason };
        self.def(state).saga.on_operator_action(&ctx, &record, w)
    }
}

/// What a commit's step rows record ([`Engine::write_steps`]): the step that
/// ran and its outcome, the step whose output the commit carries (its
/// position and output), and an operator's action.
struct StepRows<'a> {
    name: &'static str,
    outcome: &'a Result<Value, StepError>,
    carried: Option<(usize, &'a Value)>,
    audit: Option<&'a Audit<'a>>,
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
