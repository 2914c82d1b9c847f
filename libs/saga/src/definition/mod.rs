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

mod builder;
mod erased;
mod shape;
mod step;

pub use builder::{AfterPivot, BeforePivot, Builder, DefinitionError, valid_name};
pub use shape::{Shape, StepShape};
pub(crate) use step::StepDef;
pub use step::{StepKind, StepOptions};

use crate::step::Saga;

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
    /// The pivot's index.
    pivot: usize,
}

impl<S: Saga> Definition<S> {
    /// The version an instance started on it records (docs/design.md, "Changing a saga").
    pub fn version(&self) -> u32 {
        self.version
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
        self.pivot
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

#[cfg(test)]
pub(crate) mod tests {
    //! Also the steps of the engine's transition tests.
    use super::*;
    use crate::step::{Action, Compensation, StepContext, StepError};
    use std::time::Duration;

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
