//! A saga's definition: its steps in order, the pivot, each step's
//! compensation, deadline and retry policy.
//!
//! The builder only offers what is allowed where it stands, so a misdeclared
//! saga does not compile: before the pivot every step comes with its
//! compensation ([`Builder::compensatable`]) or says it changes nothing
//! ([`Builder::check`]); the pivot may have one
//! ([`Builder::pivot`], [`Builder::pivot_compensatable`]); after it, steps
//! have none ([`Builder::retriable`]) and a definition without a pivot cannot
//! be built. What only a value can show (names, duplicates, retry counts) is
//! checked by [`Builder::build`], which returns a [`DefinitionError`].
//!
//! ```
//! # use sagaworks_saga::{Action, Compensation, Definition, Saga, StepContext, StepError};
//! # struct Trip; impl Saga for Trip { const NAME: &'static str = "trip"; type Input = (); }
//! # struct Book; impl Action<Trip> for Book { const NAME: &'static str = "book"; type Output = ();
//! #   async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> { Ok(()) } }
//! # struct Cancel; impl Compensation<Trip> for Cancel { const NAME: &'static str = "cancel";
//! #   async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> { Ok(()) } }
//! # struct Pay; impl Action<Trip> for Pay { const NAME: &'static str = "pay"; type Output = ();
//! #   async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> { Ok(()) } }
//! # struct Mail; impl Action<Trip> for Mail { const NAME: &'static str = "mail"; type Output = ();
//! #   async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> { Ok(()) } }
//! let trip = Definition::builder(Trip)
//!     .compensatable(Book, Cancel)
//!     .pivot(Pay)
//!     .retriable(Mail)
//!     .build()
//!     .unwrap();
//! assert_eq!(trip.shape().names(), ["book", "pay", "mail", "cancel"]);
//! ```
//!
//! A compensatable step without its compensation does not compile
//! (E0061: the method takes two arguments):
//!
//! ```compile_fail,E0061
//! # use sagaworks_saga::{Action, Compensation, Definition, Saga, StepContext, StepError};
//! # struct Trip; impl Saga for Trip { const NAME: &'static str = "trip"; type Input = (); }
//! # struct Book; impl Action<Trip> for Book { const NAME: &'static str = "book"; type Output = ();
//! #   async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> { Ok(()) } }
//! # struct Pay; impl Action<Trip> for Pay { const NAME: &'static str = "pay"; type Output = ();
//! #   async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> { Ok(()) } }
//! let trip = Definition::builder(Trip).compensatable(Book).pivot(Pay).build();
//! ```
//!
//! Nor does a step after the pivot with a compensation (E0599: no method
//! `compensatable` on a builder past its pivot):
//!
//! ```compile_fail,E0599
//! # use sagaworks_saga::{Action, Compensation, Definition, Saga, StepContext, StepError};
//! # struct Trip; impl Saga for Trip { const NAME: &'static str = "trip"; type Input = (); }
//! # struct Pay; impl Action<Trip> for Pay { const NAME: &'static str = "pay"; type Output = ();
//! #   async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> { Ok(()) } }
//! # struct Mail; impl Action<Trip> for Mail { const NAME: &'static str = "mail"; type Output = ();
//! #   async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> { Ok(()) } }
//! # struct Unmail; impl Compensation<Trip> for Unmail { const NAME: &'static str = "unmail";
//! #   async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> { Ok(()) } }
//! let trip = Definition::builder(Trip).pivot(Pay).compensatable(Mail, Unmail).build();
//! ```
//!
//! Nor a saga without a pivot (E0599: no method `build` before the pivot):
//!
//! ```compile_fail,E0599
//! # use sagaworks_saga::{Action, Compensation, Definition, Saga, StepContext, StepError};
//! # struct Trip; impl Saga for Trip { const NAME: &'static str = "trip"; type Input = (); }
//! # struct Book; impl Action<Trip> for Book { const NAME: &'static str = "book"; type Output = ();
//! #   async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> { Ok(()) } }
//! # struct Cancel; impl Compensation<Trip> for Cancel { const NAME: &'static str = "cancel";
//! #   async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> { Ok(()) } }
//! let trip = Definition::builder(Trip).compensatable(Book, Cancel).build();
//! ```

use crate::statement::Statement;
use crate::step::{Action, Compensation, Saga, StepContext, StepError};
use futures::future::BoxFuture;
use std::marker::PhantomData;
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

pub(crate) trait ForwardDyn<S: Saga>: Send + Sync {
    fn run<'a>(&'a self, ctx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<serde_json::Value, StepError>>;
    fn record(
        &self,
        ctx: &StepContext<'_, S>,
        output: &serde_json::Value,
        w: &mut Statement,
    ) -> Result<(), StepError>;
    /// Fails unless `output` decodes as the step's output.
    fn check(&self, output: &serde_json::Value) -> Result<(), StepError>;
    /// The output type's JSON Schema (for the fingerprint).
    fn output_schema(&self) -> serde_json::Value;
}

struct Forward<A>(A);

impl<S: Saga, A: Action<S>> ForwardDyn<S> for Forward<A> {
    fn run<'a>(&'a self, ctx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<serde_json::Value, StepError>> {
        Box::pin(async move {
            let output = self.0.run(ctx).await?;
            serde_json::to_value(output)
                .map_err(|e| StepError::Failed(format!("output of {} does not encode: {e}", A::NAME)))
        })
    }

    fn record(
        &self,
        ctx: &StepContext<'_, S>,
        output: &serde_json::Value,
        w: &mut Statement,
    ) -> Result<(), StepError> {
        let output: A::Output = serde_json::from_value(output.clone())
            .map_err(|e| StepError::Failed(format!("output of {} does not decode: {e}", A::NAME)))?;
        self.0.record(ctx, &output, w)
    }

    fn check(&self, output: &serde_json::Value) -> Result<(), StepError> {
        serde_json::from_value::<A::Output>(output.clone())
            .map(|_| ())
            .map_err(|e| StepError::Rejected(format!("not an output of {}: {e}", A::NAME)))
    }

    fn output_schema(&self) -> serde_json::Value {
        schemars::schema_for!(A::Output).to_value()
    }
}

pub(crate) trait CompensationDyn<S: Saga>: Send + Sync {
    fn run<'a>(&'a self, ctx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<(), StepError>>;
}

struct Undo<C>(C);

impl<S: Saga, C: Compensation<S>> CompensationDyn<S> for Undo<C> {
    fn run<'a>(&'a self, ctx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<(), StepError>> {
        Box::pin(self.0.run(ctx))
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

/// Where an instance stands: the forward step `i` runs next, or the
/// compensation of forward step `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    Forward(usize),
    Compensation(usize),
}

/// A saga: its version, its steps in order, the pivot, the compensations. Built
/// with [`Definition::builder`].
pub struct Definition<S: Saga> {
    pub(crate) saga: S,
    pub(crate) version: u32,
    pub(crate) steps: Vec<StepDef<S>>,
}

impl<S: Saga> Definition<S> {
    /// A builder of version 1 ([`Builder::version`] sets another).
    pub fn builder(saga: S) -> Builder<S, BeforePivot> {
        Builder { saga, version: 1, steps: Vec::new(), phase: PhantomData }
    }

    /// The version an instance started on it records (docs/design.md, "Changing a saga").
    pub fn version(&self) -> u32 {
        self.version
    }

    /// A digest of what an instance's stored state is read through: each step's name,
    /// kind, locality, compensation and output type's JSON Schema, in order (not the
    /// retry policy or deadlines, which only change how it runs). Hex, 16 characters.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let steps: Vec<serde_json::Value> = self
            .steps
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name,
                    "kind": s.kind,
                    "local": s.local,
                    "compensation": s.compensation.as_ref().map(|(n, _)| *n),
                    "output": s.forward.output_schema(),
                })
            })
            .collect();
        // serde_json's maps are ordered by key: the same definition, the same bytes.
        let canonical = serde_json::json!({ "saga": S::NAME, "steps": steps }).to_string();
        let digest = Sha256::digest(canonical.as_bytes());
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    /// The step names, kinds and compensations: for display, the fault
    /// matrix (`testing`, with the `testing` feature) and crash points.
    pub fn shape(&self) -> Shape {
        Shape {
            saga: S::NAME,
            version: self.version,
            steps: self
                .steps
                .iter()
                .map(|s| StepShape {
                    name: s.name,
                    kind: s.kind,
                    local: s.local,
                    compensation: s.compensation.as_ref().map(|(n, _)| *n),
                    max_attempts: s.options.max_attempts,
                    deadline: s.has_deadline(),
                })
                .collect(),
        }
    }

    /// Sets forward step `name`'s `max_attempts` (from the settings).
    pub(crate) fn set_max_attempts(&mut self, name: &str, max_attempts: u32) -> Result<(), String> {
        let step = self.steps.iter_mut().find(|s| s.name == name).ok_or_else(|| {
            format!("saga.step_attempts: {name:?} is no forward step of saga {:?}", S::NAME)
        })?;
        if max_attempts == 0 {
            return Err(format!("saga.step_attempts: {name:?} must have at least 1 attempt"));
        }
        step.options.max_attempts = max_attempts;
        Ok(())
    }

    /// The pivot's index.
    pub(crate) fn pivot(&self) -> usize {
        self.steps.iter().position(|s| s.kind == StepKind::Pivot).unwrap_or(self.steps.len())
    }

    pub(crate) fn position(&self, name: &str) -> Option<Position> {
        self.steps.iter().enumerate().find_map(|(i, s)| {
            if s.name == name {
                Some(Position::Forward(i))
            } else if s.compensation.as_ref().is_some_and(|(n, _)| *n == name) {
                Some(Position::Compensation(i))
            } else {
                None
            }
        })
    }

    pub(crate) fn name_at(&self, at: Position) -> &'static str {
        match at {
            Position::Forward(i) => self.steps[i].name,
            Position::Compensation(i) => self.steps[i].compensation.as_ref().map(|(n, _)| *n).unwrap_or("?"),
        }
    }

    /// Step `i`'s success commits together with the next step's (a local
    /// one), not on its own.
    pub(crate) fn commits_with_next(&self, i: usize) -> bool {
        !self.steps[i].local && self.steps.get(i + 1).is_some_and(|n| n.local)
    }

    /// The compensation to run first when undoing forward steps `..end`
    /// (the latest that has one), if any.
    pub(crate) fn last_compensation_before(&self, end: usize) -> Option<Position> {
        (0..end).rev().find(|&i| self.steps[i].compensation.is_some()).map(Position::Compensation)
    }
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
            forward: Box::new(Forward(action)),
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

fn undo<S: Saga, C: Compensation<S>>(c: C) -> Option<(&'static str, Box<dyn CompensationDyn<S>>)> {
    Some((C::NAME, Box::new(Undo(c))))
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
        Ok(Definition { saga: self.saga, version: self.version, steps: self.steps })
    }
}

/// A lower-case letter, then lower-case letters, digits and `_`: what step and
/// saga names must be (they end up in SQL text, metric labels and idempotency keys).
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// A definition without its code: what each step is called and where it stands.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    pub saga: &'static str,
    pub version: u32,
    pub steps: Vec<StepShape>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StepShape {
    pub name: &'static str,
    pub kind: StepKind,
    pub local: bool,
    pub compensation: Option<&'static str>,
    pub max_attempts: u32,
    /// Given up and compensated when its deadline passes.
    pub deadline: bool,
}

impl Shape {
    /// The forward steps in order, then the compensations in the order they run.
    pub fn names(&self) -> Vec<&'static str> {
        let forward = self.steps.iter().map(|s| s.name);
        let undo = self.steps.iter().rev().filter_map(|s| s.compensation);
        forward.chain(undo).collect()
    }

    pub fn pivot(&self) -> usize {
        self.steps.iter().position(|s| s.kind == StepKind::Pivot).unwrap_or(self.steps.len())
    }

    /// What the step called `name` is: `compensatable`, `pivot`,
    /// `retriable` (forward steps, by [`StepKind`]) or `compensation`;
    /// `None` for a name the definition does not have.
    pub fn role(&self, name: &str) -> Option<&'static str> {
        self.steps.iter().find_map(|s| {
            if s.name == name {
                Some(match s.kind {
                    StepKind::Compensatable => "compensatable",
                    StepKind::Check => "check",
                    StepKind::Pivot => "pivot",
                    StepKind::Retriable => "retriable",
                })
            } else {
                (s.compensation == Some(name)).then_some("compensation")
            }
        })
    }

    /// Step `i`'s success is committed together with the next step's
    /// (a local one), not on its own.
    pub fn commits_with_next(&self, i: usize) -> bool {
        !self.steps[i].local && self.steps.get(i + 1).is_some_and(|n| n.local)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Also the steps of the engine's transition tests.
    use super::*;

    pub(crate) struct Trip;
    impl Saga for Trip {
        const NAME: &'static str = "trip";
        type Input = ();
    }

    /// A step that does nothing, named by `N`.
    pub(crate) struct Noop<const N: usize>;
    const NAMES: [&str; 4] = ["book", "hotel", "pay", "notify"];
    impl<const N: usize> Action<Trip> for Noop<N> {
        const NAME: &'static str = NAMES[N];
        type Output = ();
        async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> {
            Ok(())
        }
    }
    pub(crate) struct Undo<const N: usize>;
    const UNDO_NAMES: [&str; 2] = ["unbook", "unhotel"];
    impl<const N: usize> Compensation<Trip> for Undo<N> {
        const NAME: &'static str = UNDO_NAMES[N];
        async fn run(&self, _: &StepContext<'_, Trip>) -> Result<(), StepError> {
            Ok(())
        }
    }

    #[test]
    fn the_pivot_is_found_wherever_it_stands() {
        let first = Definition::builder(Trip).pivot(Noop::<2>).retriable(Noop::<3>).build().unwrap();
        assert_eq!(first.pivot(), 0);
        let third = Definition::builder(Trip)
            .compensatable(Noop::<0>, Undo::<0>)
            .compensatable(Noop::<1>, Undo::<1>)
            .pivot(Noop::<2>)
            .build()
            .unwrap();
        assert_eq!(third.pivot(), 2);
    }

    /// `book` again, with another output: a field an instance's stored output must have.
    struct Booked;
    #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
    struct Booking {
        room: String,
    }
    impl Action<Trip> for Booked {
        const NAME: &'static str = "book";
        type Output = Booking;
        async fn run(&self, _: &StepContext<'_, Trip>) -> Result<Booking, StepError> {
            Ok(Booking { room: "1".into() })
        }
    }

    #[test]
    fn the_fingerprint_follows_the_shape_and_the_output_schemas_not_the_retry_policy() {
        let base = || Definition::builder(Trip).compensatable(Noop::<0>, Undo::<0>).pivot(Noop::<2>);
        let fingerprint = base().build().unwrap().fingerprint();
        assert_eq!(fingerprint.len(), 16);
        assert_eq!(base().build().unwrap().fingerprint(), fingerprint, "stable");
        let retried = base().options(StepOptions::default().max_attempts(5).deadline(Duration::from_secs(1)));
        assert_eq!(retried.build().unwrap().fingerprint(), fingerprint, "how it runs is no part of it");
        let other_version = base().version(2).build().unwrap();
        assert_eq!(other_version.fingerprint(), fingerprint, "the version is recorded beside it");
        let changed = [
            base().retriable(Noop::<3>).build().unwrap(),
            Definition::builder(Trip).compensatable(Noop::<1>, Undo::<0>).pivot(Noop::<2>).build().unwrap(),
            Definition::builder(Trip).compensatable(Noop::<0>, Undo::<1>).pivot(Noop::<2>).build().unwrap(),
            Definition::builder(Trip).pivot(Noop::<0>).retriable(Noop::<2>).build().unwrap(),
            Definition::builder(Trip).compensatable(Booked, Undo::<0>).pivot(Noop::<2>).build().unwrap(),
        ];
        for (i, d) in changed.iter().enumerate() {
            assert_ne!(d.fingerprint(), fingerprint, "change {i}");
        }
    }

    #[test]
    fn a_version_is_between_1_and_i32_max() {
        let built =
            |v: u32| Definition::builder(Trip).pivot(Noop::<2>).version(v).build().map(|d| d.version());
        assert_eq!(built(7), Ok(7));
        assert!(matches!(built(0), Err(DefinitionError::InvalidVersion { version: 0, .. })));
        assert!(matches!(built(u32::MAX), Err(DefinitionError::InvalidVersion { .. })));
    }

    #[test]
    fn step_options_keep_each_setting() {
        let d = Duration::from_secs(5);
        let want = StepOptions { deadline: Some(d), max_attempts: 3 };
        assert_eq!(StepOptions::default().deadline(d).max_attempts(3), want);
        assert_eq!(StepOptions::default().max_attempts(3).deadline(d), want);
    }
}
