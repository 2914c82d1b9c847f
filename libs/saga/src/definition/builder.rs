//! The typestate builder of a [`Definition`] (see the parent module's docs) and the
//! checks of what its types cannot see.

use super::Definition;
use super::erased::{CompensationDyn, forward, undo};
use super::step::{StepDef, StepKind, StepOptions};
use crate::step::{Action, Compensation, Saga};
use std::marker::PhantomData;
use std::time::Duration;

impl<S: Saga> Definition<S> {
    /// A builder of version 1 ([`Builder::version`] sets another).
    pub fn builder(saga: S) -> Builder<S, BeforePivot> {
        Builder { saga, version: 1, steps: Vec::new(), phase: PhantomData }
    }
}

/// A definition that cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    #[error(
        "saga {saga:?}: step name {name:?} is not lower case letters, digits and '_' (starting with a letter)"
    )]
    InvalidName { saga: &'static str, name: &'static str },
    #[error("saga {saga:?}: the name {name:?} is used twice (step and compensation names must be unique)")]
    DuplicateName { saga: &'static str, name: &'static str },
    #[error("saga {saga:?}: step {step:?} has max_attempts 0 (it could never run)")]
    NoAttempts { saga: &'static str, step: &'static str },
    #[error("saga {saga:?}: step {step:?} has a zero deadline (it could never run)")]
    ZeroDeadline { saga: &'static str, step: &'static str },
    #[error("saga {saga:?}: version {version} is not between 1 and {}", i32::MAX)]
    InvalidVersion { saga: &'static str, version: u32 },
}

/// The builder before the pivot. See the module docs.
pub struct BeforePivot;
/// The builder after the pivot. See the module docs.
pub struct AfterPivot;

/// Builds a [`Definition`]; what it offers depends on `Phase` (see the module docs).
pub struct Builder<S: Saga, Phase> {
    saga: S,
    version: u32,
    steps: Vec<StepDef<S>>,
    phase: PhantomData<Phase>,
}

impl<S: Saga, P> Builder<S, P> {
    fn push<A: Action<S>, Q>(
        mut self,
        kind: StepKind,
        action: A,
        compensation: Option<(&'static str, Box<dyn CompensationDyn<S>>)>,
    ) -> Builder<S, Q> {
        self.steps.push(StepDef {
            name: A::NAME,
            kind,
            local: A::LOCAL,
            forward: forward(action),
            compensation,
            options: StepOptions::default(),
        });
        Builder { saga: self.saga, version: self.version, steps: self.steps, phase: PhantomData }
    }

    /// The definition's version (default 1). A changed shape is a new version, declared
    /// beside the old one as long as instances of that one are unfinished
    /// ([`Versions`](crate::Versions)).
    pub fn version(self, version: u32) -> Self {
        Self { version, ..self }
    }

    /// The deadline and retry policy of the step added last.
    pub fn options(mut self, options: StepOptions) -> Self {
        if let Some(last) = self.steps.last_mut() {
            last.options = options;
        }
        self
    }
}

impl<S: Saga> Builder<S, BeforePivot> {
    /// A step before the pivot, with the compensation that undoes it.
    pub fn compensatable<A: Action<S>, C: Compensation<S>>(self, action: A, compensation: C) -> Self {
        self.push(StepKind::Compensatable, action, undo(compensation))
    }

    /// A step before the pivot that changes nothing: a read or a validation
    /// (is the customer's account open?), so there is nothing to undo. Its
    /// rejection, or its failure once its attempts are spent, compensates the
    /// steps before it. The type cannot see that `action` changes nothing:
    /// declaring a step with an effect here leaves that effect in place when
    /// the saga compensates.
    pub fn check<A: Action<S>>(self, action: A) -> Self {
        self.push(StepKind::Check, action, None)
    }

    /// The pivot, without a compensation: a failure of it that may have had
    /// an effect is retried (it is idempotent) until it succeeds or is
    /// rejected; a rejection compensates the steps before it.
    pub fn pivot<A: Action<S>>(self, action: A) -> Builder<S, AfterPivot> {
        self.push(StepKind::Pivot, action, None)
    }

    /// The pivot, with a compensation that undoes a possible effect of a
    /// failed attempt (e.g. a charge that timed out is refunded).
    pub fn pivot_compensatable<A: Action<S>, C: Compensation<S>>(
        self,
        action: A,
        compensation: C,
    ) -> Builder<S, AfterPivot> {
        self.push(StepKind::Pivot, action, undo(compensation))
    }
}

impl<S: Saga> Builder<S, AfterPivot> {
    /// A step after the pivot: retried until it succeeds, never compensated.
    pub fn retriable<A: Action<S>>(self, action: A) -> Self {
        self.push(StepKind::Retriable, action, None)
    }

    /// Checks what the types cannot: names, duplicates, retry counts.
    pub fn build(self) -> Result<Definition<S>, DefinitionError> {
        let saga = S::NAME;
        if !valid_name(saga) {
            return Err(DefinitionError::InvalidName { saga, name: saga });
        }
        if self.version == 0 || i32::try_from(self.version).is_err() {
            return Err(DefinitionError::InvalidVersion { saga, version: self.version });
        }
        let mut seen = std::collections::HashSet::new();
        for step in &self.steps {
            for name in std::iter::once(step.name).chain(step.compensation.as_ref().map(|(n, _)| *n)) {
                if !valid_name(name) {
                    return Err(DefinitionError::InvalidName { saga, name });
                }
                if !seen.insert(name) {
                    return Err(DefinitionError::DuplicateName { saga, name });
                }
            }
            if step.options.max_attempts == 0 {
                return Err(DefinitionError::NoAttempts { saga, step: step.name });
            }
            if step.options.deadline == Some(Duration::ZERO) {
                return Err(DefinitionError::ZeroDeadline { saga, step: step.name });
            }
        }
        // The typestate guarantees a pivot.
        let pivot = self.steps.iter().position(|s| s.kind == StepKind::Pivot).unwrap_or(self.steps.len());
        Ok(Definition { saga: self.saga, version: self.version, steps: self.steps, pivot })
    }
}

/// A lower-case letter, then lower-case letters, digits and `_`: what step and
/// saga names must be (they end up in SQL text, metric labels and idempotency keys).
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
