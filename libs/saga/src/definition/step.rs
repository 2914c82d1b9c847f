//! A step's place relative to the pivot, its deadline and retry policy, and the
//! step as the engine holds it.

use super::erased::{CompensationDyn, ForwardDyn};
use crate::step::Saga;
use std::time::Duration;

/// Where a step stands relative to the pivot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Before the pivot: has a compensation.
    Compensatable,
    /// Before the pivot, changes nothing (a read or a validation), so has no
    /// compensation: its rejection or failure undoes the steps before it.
    Check,
    /// The point of no return. May have a compensation, run when the pivot
    /// failed in a way that may have had an effect.
    Pivot,
    /// After the pivot: retried until it succeeds, never compensated.
    Retriable,
}

/// A step's deadline and retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepOptions {
    /// A step (before or at the pivot) still unfinished this long after its
    /// first attempt started, across crashes and restarts, is given up and
    /// compensated. `None`: the engine's `step_deadline_ms`.
    pub deadline: Option<Duration>,
    /// Attempts of a step before or at the pivot before a failure (one that
    /// may have had an effect) is given up and compensated; retried with
    /// backoff in between. Steps after the pivot and compensations are
    /// retried without limit.
    pub max_attempts: u32,
}

impl Default for StepOptions {
    fn default() -> Self {
        Self { deadline: None, max_attempts: 1 }
    }
}

impl StepOptions {
    pub fn deadline(self, deadline: Duration) -> Self {
        Self { deadline: Some(deadline), ..self }
    }

    pub fn max_attempts(self, max_attempts: u32) -> Self {
        Self { max_attempts, ..self }
    }
}

pub(crate) struct StepDef<S: Saga> {
    pub(crate) name: &'static str,
    pub(crate) kind: StepKind,
    pub(crate) local: bool,
    pub(crate) forward: Box<dyn ForwardDyn<S>>,
    pub(crate) compensation: Option<(&'static str, Box<dyn CompensationDyn<S>>)>,
    pub(crate) options: StepOptions,
}

impl<S: Saga> StepDef<S> {
    /// Only a step that can still be undone has a deadline: one before the
    /// pivot, or the pivot when it has a compensation; never a local one.
    pub(crate) fn has_deadline(&self) -> bool {
        !self.local
            && match self.kind {
                StepKind::Compensatable | StepKind::Check => true,
                StepKind::Pivot => self.compensation.is_some(),
                StepKind::Retriable => false,
            }
    }
}
