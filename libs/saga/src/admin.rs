//! Operating sagas: finding instances ([`list`], [`InstanceRecord::load`],
//! [`actions`]) and acting on one ([`Engine::act`]).
//!
//! An operator's action is one of three, each idempotent under the
//! operator's idempotency key and recorded in `saga_operator_actions` (who,
//! what, why) in the same statement as its effect:
//!
//! * **retry now** ([`OperatorAction::RetryNow`]): the instance's backoff is
//!   cleared and the worker runs its current step again at once.
//! * **compensate** ([`OperatorAction::Compensate`]): a running instance is
//!   aborted: everything that may have taken effect (the current step too,
//!   once it was attempted) is compensated, and the instance ends COMPENSATED
//!   with the operator's reason. Refused past the pivot.
//! * **resolve** ([`OperatorAction::Resolve`]): the operator states the
//!   current step's effect by hand (e.g. a payment done out of band), with its
//!   output for forward steps (decoded into the step's `Output` type, so a
//!   wrong one is refused); the instance continues from there.
//!
//! An action takes the instance's lease first, so it never races a driver:
//! while a live driver holds it, the action is refused ([`ActionError::Busy`]).
//! An action that is not valid in the instance's state is refused with the
//! reason ([`ActionError::Conflict`]) and changes nothing. After an action the
//! instance is handed back to the worker ([`Engine::run_worker`]), which goes
//! on at its next poll. The host sees each action through
//! [`Saga::on_operator_action`] (e.g. a line
//! in the order's timeline), committed with it.

use crate::definition::Position;
use crate::engine::{DriveError, Engine, GUARD, Next, State, transition};
use crate::operator::{ActionKind, Audit, Operator, OperatorAction};
use crate::statement::Statement;
use crate::step::{Saga, StepError};
use crate::store::{INSTANCE_COLUMNS, InstanceRecord, SagaStatus};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{AssertSqlSafe, PgPool, Postgres, QueryBuilder};
use std::time::Duration;
use uuid::Uuid;

/// What [`Engine::act`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acted {
    /// The step it acted on.
    pub step: String,
    /// The key was used before for the same action: nothing was done again.
    pub replayed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("saga {0} not found")]
    NotFound(Uuid),
    /// Not valid in the instance's state (nothing changed).
    #[error("{0}")]
    Conflict(String),
    /// A live driver holds the instance (nothing changed).
    #[error("a driver holds saga {id} until {until}; try again after that")]
    Busy { id: Uuid, until: DateTime<Utc> },
    /// The request itself is wrong (an empty reason, an output that does not decode).
    #[error("{0}")]
    Invalid(String),
    #[error("the host's writes for the action: {0}")]
    Host(StepError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl From<DriveError> for ActionError {
    fn from(e: DriveError) -> Self {
        match e {
            DriveError::Db(e) => ActionError::Db(e),
            DriveError::Host(_, e) => ActionError::Host(e),
            other => ActionError::Conflict(other.to_string()),
        }
    }
}

/// An operator's action as recorded.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct ActionRecord {
    pub action: String,
    pub step: String,
    pub actor: String,
    pub reason: String,
    pub at: DateTime<Utc>,
}

/// The operators' actions on instance `id`, oldest first.
pub async fn actions(pool: &PgPool, id: Uuid) -> Result<Vec<ActionRecord>, sqlx::Error> {
    sqlx::query_as(
        "SELECT action, step, actor, reason, at FROM saga_operator_actions WHERE saga_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(pool)
    .await
}

impl<S: Saga> Engine<S> {
    /// Applies an operator's action to instance `id`; see the module docs.
    pub async fn act(&self, id: Uuid, action: OperatorAction, op: &Operator) -> Result<Acted, ActionError> {
        for (field, value) in
            [("actor", &op.actor), ("reason", &op.reason), ("idempotency key", &op.idempotency_key)]
        {
            if value.trim().is_empty() {
                return Err(ActionError::Invalid(format!("an operator action needs a {field}")));
            }
        }
        let kind = action.kind();
        if let Some(replayed) = self.replay(id, kind, op).await? {
            return Ok(replayed);
        }
        self.take_lease(id).await?;
        let result = self.apply(id, action, op).await;
        if result.is_err() {
            // Nothing was written: hand the lease back as it was (no backoff change).
            let _ = sqlx::query(
                "UPDATE saga_instances SET lease_owner = NULL, lease_expires_at = NULL
                 WHERE id = $1 AND lease_owner = $2",
            )
            .bind(id)
            .bind(self.owner())
            .execute(self.pool())
            .await;
        }
        match result {
            // The same key committed by a concurrent request meanwhile: its replay.
            Err(ActionError::Db(sqlx::Error::Database(e)))
                if e.constraint() == Some("saga_operator_actions_saga_id_idempotency_key_key") =>
            {
                self.replay(id, kind, op).await?.ok_or(ActionError::Db(sqlx::Error::Database(e)))
            }
            other => other,
        }
    }

    /// The earlier action under `op`'s key, answered again; a conflict when
    /// the key was used for another action; `None` when it is new.
    async fn replay(&self, id: Uuid, kind: ActionKind, op: &Operator) -> Result<Option<Acted>, ActionError> {
        let done: Option<(String, String)> = sqlx::query_as(
            "SELECT action, step FROM saga_operator_actions WHERE saga_id = $1 AND idempotency_key = $2",
        )
        .bind(id)
        .bind(&op.idempotency_key)
        .fetch_optional(self.pool())
        .await?;
        match done {
            None => Ok(None),
            Some((done, _)) if done != kind.as_str() => Err(ActionError::Conflict(format!(
                "idempotency key {:?} was used for a {done} of this saga",
                op.idempotency_key
            ))),
            Some((_, step)) => Ok(Some(Acted { step, replayed: true })),
        }
    }

    /// Leases `id` to this replica for an action, unless it has finished or a live driver holds it.
    async fn take_lease(&self, id: Uuid) -> Result<(), ActionError> {
        let taken = sqlx::query(
            "UPDATE saga_instances SET lease_owner = $3, lease_expires_at = now() + make_interval(secs => $4)
             WHERE id = $1 AND saga_type = $2 AND status IN ('RUNNING', 'COMPENSATING')
               AND (lease_expires_at IS NULL OR lease_expires_at < now())",
        )
        .bind(id)
        .bind(S::NAME)
        .bind(self.owner())
        .bind(self.lease_secs())
        .execute(self.pool())
        .await?
        .rows_affected();
        if taken == 1 {
            return Ok(());
        }
        let row: Option<(SagaStatus, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT status, lease_expires_at FROM saga_instances WHERE id = $1 AND saga_type = $2",
        )
        .bind(id)
        .bind(S::NAME)
        .fetch_optional(self.pool())
        .await?;
        match row {
            None => Err(ActionError::NotFound(id)),
            Some((status, _)) if status.is_finished() => {
                Err(ActionError::Conflict(format!("saga {id} has finished ({status}): nothing to act on")))
            }
            Some((_, until)) => Err(ActionError::Busy { id, until: until.unwrap_or_else(Utc::now) }),
        }
    }

    async fn apply(&self, id: Uuid, action: OperatorAction, op: &Operator) -> Result<Acted, ActionError> {
        let mut state = self.load(id).await?;
        let def = self.def(&state);
        let step = def.name_at(state.at());
        let audit = Audit { action: action.kind(), operator: op };
        match action {
            OperatorAction::RetryNow => self.retry_now(id, &state, &audit).await?,
            OperatorAction::Compensate => {
                let Position::Forward(i) = state.at() else {
                    return Err(ActionError::Conflict(format!("saga {id} is compensating already")));
                };
                let s = &def.steps[i];
                if i > def.pivot() {
                    return Err(ActionError::Conflict(format!(
                        "saga {id} is past its pivot: {step} can only go forward (retry or resolve it)"
                    )));
                }
                // Attempted: it may have taken effect, so it is undone too.
                let attempted = state.attempted();
                if i == def.pivot() && attempted && s.compensation.is_none() {
                    return Err(ActionError::Conflict(format!(
                        "{step} may have taken effect and has no compensation: resolve it instead"
                    )));
                }
                let reason = format!("compensated by {}: {}", op.actor, op.reason);
                let next = match def.last_compensation_before(if attempted { i + 1 } else { i }) {
                    Some(first) => Next::Compensate { first, reason: reason.clone() },
                    None => Next::Cancel { reason: reason.clone() },
                };
                self.commit(id, &mut state, Err(StepError::Failed(reason)), &next, None, Some(&audit))
                    .await?;
            }
            OperatorAction::Resolve { output } => {
                let output = match state.at() {
                    Position::Forward(i) => {
                        def.steps[i]
                            .forward
                            .check(&output)
                            .map_err(|e| ActionError::Invalid(e.message().into()))?;
                        output
                    }
                    Position::Compensation(_) => Value::Null,
                };
                let outcome = Ok(output);
                let next = transition(def, state.at(), &outcome, 1, false);
                self.commit(id, &mut state, outcome, &next, None, Some(&audit)).await?;
            }
        }
        Ok(Acted { step: step.to_string(), replayed: false })
    }

    /// Clears the backoff and hands the instance back to the worker, with the audit row.
    async fn retry_now(&self, id: Uuid, state: &State<S>, audit: &Audit<'_>) -> Result<(), ActionError> {
        let mut w = Statement::new();
        let (pid, owner) = (w.bind(id), w.bind(self.owner().to_string()));
        w.guard(
            GUARD,
            format!(
                "UPDATE saga_instances SET lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = now(),
                        updated_at = now()
                 WHERE id = {pid} AND lease_owner = {owner} RETURNING id"
            ),
        );
        let step = self.def(state).name_at(state.at());
        self.audit(&mut w, id, step, state, audit).map_err(ActionError::Host)?;
        let (sql, args) = w.finish(&format!("SELECT now() FROM {GUARD}"))?;
        let done: Option<DateTime<Utc>> =
            sqlx::query_scalar_with(AssertSqlSafe(sql), args).fetch_optional(self.pool()).await?;
        done.map(|_| ()).ok_or(ActionError::Conflict(format!("saga {id} was taken over meanwhile")))
    }
}

/// Which instances [`list`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    Is(SagaStatus),
    /// Unfinished with no progress for longer than the threshold given to [`list`].
    Stuck,
}

impl std::str::FromStr for StatusFilter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("stuck") {
            return Ok(StatusFilter::Stuck);
        }
        SagaStatus::parse(&s.to_ascii_uppercase()).map(StatusFilter::Is).ok_or_else(|| {
            format!("unknown status {s:?} (RUNNING, COMPENSATING, COMPLETED, COMPENSATED or stuck)")
        })
    }
}

/// Where a page of [`list`] ends: the next page starts after this instance.
/// Shown as the id's 32 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor(pub Uuid);

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.simple())
    }
}

impl std::str::FromStr for Cursor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match Uuid::try_parse(s) {
            Ok(id) if s.len() == 32 => Ok(Cursor(id)),
            _ => Err(format!("invalid cursor {s:?}")),
        }
    }
}

/// What [`list`] filters on; every part optional.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub status: Option<StatusFilter>,
    /// The current step (forward or compensation).
    pub step: Option<String>,
    /// Created longer ago than this.
    pub older_than: Option<Duration>,
    /// Only these business keys (e.g. the orders of one customer, from the host).
    pub keys: Option<Vec<String>>,
    /// Start after this (the previous page's [`Page::next`]).
    pub after: Option<Cursor>,
    /// At most this many (1..=500; 50 when 0).
    pub limit: u32,
}

/// One instance in a list.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Summary {
    #[sqlx(flatten)]
    pub instance: InstanceRecord,
    /// Attempts of the current step so far.
    pub attempts: Option<i32>,
    /// The current step's last error.
    pub last_error: Option<String>,
}

/// A page of instances, newest first.
#[derive(Debug, Clone)]
pub struct Page {
    pub sagas: Vec<Summary>,
    /// Pass as [`ListFilter::after`] for the next page; `None` on the last.
    pub next: Option<Cursor>,
}

pub const MAX_PAGE: u32 = 500;

/// Instances of `saga_type`, newest first, filtered (keyset pagination).
/// `stuck_after`: how long without progress makes an unfinished instance stuck.
pub async fn list(
    pool: &PgPool,
    saga_type: &str,
    stuck_after: Duration,
    filter: &ListFilter,
) -> Result<Page, sqlx::Error> {
    let limit = match filter.limit {
        0 => 50,
        n => n.min(MAX_PAGE),
    };
    let columns = INSTANCE_COLUMNS.split(", ").map(|c| format!("i.{c}")).collect::<Vec<_>>().join(", ");
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new(format!(
        "SELECT {columns}, st.attempts, st.error AS last_error
         FROM saga_instances i
         LEFT JOIN saga_instance_steps st ON st.saga_id = i.id AND st.name = i.current_step
         WHERE i.saga_type = "
    ));
    q.push_bind(saga_type.to_string());
    match filter.status {
        None => {}
        Some(StatusFilter::Is(status)) => {
            q.push(" AND i.status = ").push_bind(status);
        }
        Some(StatusFilter::Stuck) => {
            q.push(" AND i.status IN ('RUNNING', 'COMPENSATING') AND i.progressed_at < now() - make_interval(secs => ")
                .push_bind(stuck_after.as_secs_f64())
                .push(")");
        }
    }
    if let Some(step) = &filter.step {
        q.push(" AND i.current_step = ").push_bind(step.clone());
    }
    if let Some(age) = filter.older_than {
        q.push(" AND i.created_at < now() - make_interval(secs => ").push_bind(age.as_secs_f64()).push(")");
    }
    if let Some(keys) = &filter.keys {
        q.push(" AND i.key = ANY(").push_bind(keys.clone()).push(")");
    }
    if let Some(Cursor(after)) = filter.after {
        q.push(" AND i.id < ").push_bind(after);
    }
    // Newest first: instance ids are UUIDv7, in creation order (see `Engine::start_with`).
    q.push(" ORDER BY i.id DESC LIMIT ").push_bind(i64::from(limit) + 1);
    // Planned on every call, with the table's current statistics: a listing
    // is rare, its filters vary, and a plan cached while the table was small
    // would sort every instance instead of walking the primary key backwards.
    let mut sagas: Vec<Summary> = q.build_query_as().persistent(false).fetch_all(pool).await?;
    let next = if sagas.len() > limit as usize {
        sagas.truncate(limit as usize);
        sagas.last().map(|s| Cursor(s.instance.id))
    } else {
        None
    };
    Ok(Page { sagas, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_and_status_filters_round_trip() {
        let c = Cursor(Uuid::now_v7());
        assert_eq!(c.to_string().parse::<Cursor>(), Ok(c));
        assert!("nope".parse::<Cursor>().is_err());
        assert!(c.0.hyphenated().to_string().parse::<Cursor>().is_err(), "one spelling only");
        assert_eq!("stuck".parse::<StatusFilter>(), Ok(StatusFilter::Stuck));
        assert_eq!("running".parse::<StatusFilter>(), Ok(StatusFilter::Is(SagaStatus::Running)));
        assert!("sleeping".parse::<StatusFilter>().unwrap_err().contains("stuck"));
    }
}
