//! What a host writes: the [`Saga`] (its input and the writes that end an
//! instance) and its steps ([`Action`], [`Compensation`]).
//!
//! A step reads the saga's typed input and the typed outputs of the steps
//! before it from its [`StepContext`]; its own output is persisted with the
//! instance when it succeeds, so a step after a crash reads what the step
//! before returned on another replica.

use crate::operator::OperatorRecord;
use crate::statement::Statement;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::time::Duration;
use uuid::Uuid;

/// A kind of saga: its name, its input, and the host's writes when an
/// instance ends (committed with the instance's last transition).
pub trait Saga: Send + Sync + 'static {
    /// Stored with each instance (`saga_instances.saga_type`); also the
    /// `saga` label of the metrics. Lower case, digits and `_`.
    const NAME: &'static str;
    /// What starts an instance; persisted with it.
    type Input: Serialize + DeserializeOwned + Send + Sync + 'static;

    /// The writes (and outbox events) committed with the transition that ends
    /// the instance, e.g. "the order is CONFIRMED, OrderConfirmed". Default: none.
    fn on_end(
        &self,
        _ctx: &StepContext<'_, Self>,
        _end: &End<'_>,
        _w: &mut Statement,
    ) -> Result<(), StepError>
    where
        Self: Sized,
    {
        Ok(())
    }

    /// The host's record of an operator's action (e.g. a line in the
    /// order's timeline), committed with the action. Default: none.
    fn on_operator_action(
        &self,
        _ctx: &StepContext<'_, Self>,
        _action: &OperatorRecord<'_>,
        _w: &mut Statement,
    ) -> Result<(), StepError>
    where
        Self: Sized,
    {
        Ok(())
    }
}

/// How an instance ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End<'a> {
    /// Every forward step succeeded.
    Completed,
    /// A step before the pivot (or the pivot) failed or was rejected, and
    /// everything that may have had an effect was compensated.
    Compensated { reason: &'a str },
}

/// A forward step.
pub trait Action<S: Saga>: Send + Sync + 'static {
    /// The step's name: stored, shown, used in idempotency keys, metrics and
    /// spans. Lower case, digits and `_`; unique within the saga.
    const NAME: &'static str;
    /// What the step returns; later steps read it ([`StepContext::output`]). Its JSON
    /// Schema is part of the definition's fingerprint ([`Definition::fingerprint`](crate::Definition::fingerprint)):
    /// an instance stores it, and a later version must still read it.
    type Output: Serialize + DeserializeOwned + schemars::JsonSchema + Send + Sync + 'static;
    /// A local step makes no call: its effect is its [`Action::record`]
    /// writes, committed with its transition. It has no deadline, and the
    /// step before it commits its result together with it (one statement
    /// fewer).
    const LOCAL: bool = false;

    /// Runs the step. Must be idempotent under [`StepContext::idempotency_key`]:
    /// after a crash or a lost answer it runs again with the same key.
    fn run(&self, ctx: &StepContext<'_, S>) -> impl Future<Output = Result<Self::Output, StepError>> + Send;

    /// Writes in the host's database that belong to the step's success (e.g.
    /// the prices a reservation returned), committed in the same statement as
    /// the step's result. Default: none.
    fn record(
        &self,
        _ctx: &StepContext<'_, S>,
        _output: &Self::Output,
        _w: &mut Statement,
    ) -> Result<(), StepError> {
        Ok(())
    }
}

/// The compensation of a forward step: undoes whatever the step may have done.
pub trait Compensation<S: Saga>: Send + Sync + 'static {
    /// Lower case, digits and `_`; unique within the saga.
    const NAME: &'static str;

    /// Undoes the step. Runs until it succeeds (retried with backoff), also
    /// when the forward step never took effect or never arrived: the
    /// participant must accept that (and refuse the late forward call).
    /// A [`StepError::Rejected`] means "nothing (more) to undo".
    fn run(&self, ctx: &StepContext<'_, S>) -> impl Future<Output = Result<(), StepError>> + Send;
}

/// How a step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// Definitely had no effect: a business rule refused it, or the input
    /// was invalid. Not retried.
    #[error("rejected: {0}")]
    Rejected(String),
    /// Definitely had no effect, but got no answer either: the call was
    /// never sent (participant unreachable, circuit open, bulkhead full).
    /// Retried while the step has attempts left and its deadline allows;
    /// then handled like a rejection (nothing of its own to compensate).
    /// `retry_after`: the earliest a call can go through (an open circuit
    /// breaker says when it lets one through); the next attempt is not sooner.
    #[error("unavailable: {reason}")]
    Unavailable { reason: String, retry_after: Option<Duration> },
    /// May or may not have had an effect (a timeout, a connection lost after
    /// sending, a participant error).
    #[error("failed: {0}")]
    Failed(String),
}

impl StepError {
    /// Not sent, with no hint of when a call could go through.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        StepError::Unavailable { reason: reason.into(), retry_after: None }
    }

    pub fn message(&self) -> &str {
        match self {
            StepError::Rejected(m) | StepError::Unavailable { reason: m, .. } | StepError::Failed(m) => m,
        }
    }
}

/// What a step sees of its instance.
pub struct StepContext<'a, S: Saga> {
    pub(crate) saga_id: Uuid,
    pub(crate) step: &'static str,
    pub(crate) compensation: bool,
    pub(crate) input: &'a S::Input,
    pub(crate) outputs: &'a serde_json::Map<String, serde_json::Value>,
    pub(crate) failure_reason: Option<&'a str>,
}

impl<'a, S: Saga> StepContext<'a, S> {
    pub fn saga_id(&self) -> Uuid {
        self.saga_id
    }

    /// The running step's (or compensation's) name.
    pub fn step(&self) -> &'static str {
        self.step
    }

    /// A compensation runs (not a forward step).
    pub fn is_compensation(&self) -> bool {
        self.compensation
    }

    /// `<saga id>:<step name>`: the same on every attempt of this step of
    /// this instance, different for every other step. Participants store it
    /// and answer a repeated call with the first call's result.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.saga_id, self.step)
    }

    pub fn input(&self) -> &'a S::Input {
        self.input
    }

    /// The output of step `A`, which ran before this one and succeeded.
    /// An error (a step that reads a later step's output, or a stored output
    /// that no longer decodes) fails the step.
    pub fn output<A: Action<S>>(&self) -> Result<A::Output, StepError> {
        self.try_output::<A>()?
            .ok_or_else(|| StepError::Failed(format!("{} has no output of {}", self.step, A::NAME)))
    }

    /// The output of step `A`, if it succeeded (a compensation runs also for
    /// a step that may have had an effect without answering).
    /// A step whose output is null (`()`) stores none: `None` for it too.
    pub fn try_output<A: Action<S>>(&self) -> Result<Option<A::Output>, StepError> {
        match self.outputs.get(A::NAME) {
            None => Ok(None),
            Some(v) => A::Output::deserialize(v)
                .map(Some)
                .map_err(|e| StepError::Failed(format!("output of {} does not decode: {e}", A::NAME))),
        }
    }

    /// Why the saga is compensating (empty while it runs forward).
    pub fn failure_reason(&self) -> &'a str {
        self.failure_reason.unwrap_or_default()
    }
}
