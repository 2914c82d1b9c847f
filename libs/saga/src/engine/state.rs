//! An instance as its driver knows it ([`State`]), read once when a driver
//! takes it over ([`Engine::load`](super::Engine)) and then kept equal to
//! what each commit wrote.

use super::{DriveError, Engine};
use crate::definition::Position;
use crate::step::{Saga, StepContext};
use crate::store::SagaStatus;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use uuid::Uuid;

/// An instance as its driver knows it: read once, then kept equal to what
/// each commit wrote.
pub(crate) struct State<S: Saga> {
    /// The version of the definition it started on (and is read through).
    pub(crate) version: i32,
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

impl<S: Saga> Engine<S> {
    /// The definition `state` is read through (its version's; registered, or
    /// [`Engine::load`] would not have returned it).
    pub(crate) fn def(&self, state: &State<S>) -> &crate::definition::Definition<S> {
        self.definition_of(state.version).unwrap_or_else(|| self.definition())
    }
}

impl<S: Saga> State<S> {
    pub(crate) fn at(&self) -> Position {
        self.at
    }

    /// The current step has been attempted (it may have taken effect).
    pub(crate) fn attempted(&self) -> bool {
        self.attempts.is_some()
    }

    /// What step `step` (the current one, or one committed with it) sees.
    pub(crate) fn context(&self, id: Uuid, step: &'static str) -> StepContext<'_, S> {
        StepContext {
            saga_id: id,
            step,
            compensation: matches!(self.at, Position::Compensation(_)),
            input: &self.input,
            outputs: &self.outputs,
            failure_reason: self.failure_reason.as_deref(),
        }
    }
}

impl<S: Saga> Engine<S> {
    /// Reads instance `id`, which this replica must hold the lease of.
    pub(crate) async fn load(&self, id: Uuid) -> Result<State<S>, DriveError> {
        #[derive(sqlx::FromRow)]
        struct Row {
            version: i32,
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
            "SELECT i.version, i.status, i.current_step, i.failure_reason, i.created_at,
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
        .fetch_optional(self.pool())
        .await?
        .ok_or(DriveError::LeaseLost(id))?;
        let undrivable = |why: String| DriveError::Undrivable(id, why);
        let input: S::Input = serde_json::from_value(row.input.unwrap_or(Value::Null))
            .map_err(|e| undrivable(format!("the stored input does not decode: {e}")))?;
        let Value::Object(outputs) = row.outputs else {
            return Err(undrivable("the stored outputs are not an object".into()));
        };
        let definition = self.definition_of(row.version).ok_or_else(|| {
            undrivable(format!(
                "it started on version {} of the saga, which this binary does not register",
                row.version
            ))
        })?;
        let at = match row.current_step.as_deref() {
            // Finished: the loop returns at once.
            None => Position::Forward(0),
            Some(step) => definition
                .position(step)
                .ok_or_else(|| undrivable(format!("unknown step {step:?} in version {}", row.version)))?,
        };
        Ok(State {
            version: row.version,
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
}
