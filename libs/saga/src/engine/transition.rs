//! The pure part of the engine: what a step's outcome leads to ([`transition`])
//! and what that makes of the instance's row ([`RowUpdate`]). No I/O: the
//! tables below are the saga's state machine.

use super::state::State;
use crate::SagaSettings;
use crate::definition::{Definition, Position, StepKind};
use crate::step::{Saga, StepError};
use crate::store::SagaStatus;
use sagaworks_resilience::Backoff;
use serde_json::Value;
use std::time::Duration;

/// What an instance does after a step's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Run this step next, in the same direction.
    Step(Position),
    /// Start compensating with this step, for `reason`.
    Compensate { first: Position, reason: String },
    /// Nothing may have taken effect: COMPENSATED at once, for `reason`.
    Cancel { reason: String },
    /// Run the same step again after a backoff, and `at_least` this long
    /// (the earliest its participant's circuit breaker lets a call through).
    Retry { at_least: Option<Duration> },
    /// All forward steps done.
    Complete,
    /// All compensations done.
    Compensated,
}

/// A step's outcome: `Ok` with its output, or how it failed; `give_up`: the
/// step may not be retried (its deadline passed or its attempts ran out).
pub(crate) fn transition<S: Saga>(
    def: &Definition<S>,
    at: Position,
    outcome: &Result<Value, StepError>,
    attempts: u32,
    give_up: bool,
) -> Next {
    match at {
        Position::Forward(i) => {
            let step = &def.steps[i];
            match outcome {
                Ok(_) if i + 1 < def.steps.len() => Next::Step(Position::Forward(i + 1)),
                Ok(_) => Next::Complete,
                // After the pivot there is no way back: retried until it succeeds.
                Err(e) if step.kind == StepKind::Retriable => Next::retry_after(e),
                Err(e @ StepError::Unavailable { .. })
                    if !give_up && attempts < step.options.max_attempts =>
                {
                    Next::retry_after(e)
                }
                Err(StepError::Rejected(reason) | StepError::Unavailable { reason, .. }) => {
                    match def.last_compensation_before(i) {
                        Some(first) => Next::Compensate { first, reason: reason.clone() },
                        None => Next::Cancel { reason: reason.clone() },
                    }
                }
                // A pivot without compensation cannot be undone: retried until it succeeds or is rejected.
                Err(StepError::Failed(_)) if step.kind == StepKind::Pivot && step.compensation.is_none() => {
                    Next::RETRY
                }
                Err(StepError::Failed(_)) if !give_up && attempts < step.options.max_attempts => Next::RETRY,
                // It may have taken effect: its own compensation runs first.
                Err(StepError::Failed(reason)) => match def.last_compensation_before(i + 1) {
                    Some(first) => Next::Compensate { first, reason: reason.clone() },
                    None => Next::Cancel { reason: reason.clone() },
                },
            }
        }
        Position::Compensation(i) => match outcome {
            // A refused compensation has nothing (more) to undo.
            Ok(_) | Err(StepError::Rejected(_)) => match def.last_compensation_before(i) {
                Some(next) => Next::Step(next),
                None => Next::Compensated,
            },
            Err(e @ (StepError::Failed(_) | StepError::Unavailable { .. })) => Next::retry_after(e),
        },
    }
}

impl Next {
    /// A retry after the backoff alone.
    pub(crate) const RETRY: Next = Next::Retry { at_least: None };

    /// A retry of a step that failed with `e`: not before its participant can take a call.
    fn retry_after(e: &StepError) -> Next {
        match e {
            StepError::Unavailable { retry_after, .. } => Next::Retry { at_least: *retry_after },
            _ => Next::RETRY,
        }
    }
}

/// What a transition makes of the instance's row.
pub(super) struct RowUpdate<'a> {
    pub(super) status: Option<SagaStatus>,
    /// The step to run next, when it changes.
    pub(super) current: Option<Position>,
    /// The failure reason, when it is set now.
    pub(super) reason: Option<&'a str>,
    /// Hand the lease back (the instance ends, waits for a retry, or an
    /// operator's action hands it to the worker).
    pub(super) release: bool,
    /// Runnable again after this (a retry's backoff; zero when handed back).
    pub(super) delay: Option<Duration>,
    pub(super) finished: bool,
    /// An operator's action: the worker records the next attempt, not this commit.
    pub(super) hand_back: bool,
    /// A transition to another step or status (a retry is no progress).
    pub(super) progressed: bool,
}

impl<'a> RowUpdate<'a> {
    pub(super) fn new<S: Saga>(
        next: &'a Next,
        state: &State<S>,
        carried: bool,
        operator: bool,
        settings: &SagaSettings,
    ) -> Self {
        let (status, current, reason, release, delay, finished) = match next {
            Next::Step(p) => (None, Some(*p), None, false, None, false),
            Next::Compensate { first, reason } => {
                (Some(SagaStatus::Compensating), Some(*first), Some(reason.as_str()), false, None, false)
            }
            Next::Retry { at_least } => {
                let attempts = state.attempts.unwrap_or(1).max(1) as u32;
                let backoff = Backoff::from_millis(settings.retry_base_ms, settings.retry_max_ms);
                let delay = backoff.delay(attempts).max(at_least.unwrap_or_default());
                (None, None, None, true, Some(delay), false)
            }
            Next::Complete => (Some(SagaStatus::Completed), None, None, true, None, true),
            Next::Cancel { reason } => {
                (Some(SagaStatus::Compensated), None, Some(reason.as_str()), true, None, true)
            }
            Next::Compensated => (Some(SagaStatus::Compensated), None, None, true, None, true),
        };
        let hand_back = operator && !finished;
        let (release, delay) = if hand_back { (true, Some(Duration::ZERO)) } else { (release, delay) };
        // A carried step's result moves the instance to the (local) step
        // that commits it, also when that step is to be retried.
        let current = current.or(if carried && !finished { Some(state.at) } else { None });
        RowUpdate {
            status,
            current,
            reason,
            release,
            delay,
            finished,
            hand_back,
            progressed: !matches!(next, Next::Retry { .. }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::StepOptions;
    use crate::definition::tests::{Noop, Trip, Undo};
    use Position::{Compensation as C, Forward as F};

    /// book (compensatable, 3 attempts), hotel (compensatable), pay (pivot, no compensation), notify (retriable).
    fn trip() -> Definition<Trip> {
        Definition::builder(Trip)
            .compensatable(Noop::<0>, Undo::<0>)
            .options(StepOptions::default().max_attempts(3))
            .compensatable(Noop::<1>, Undo::<1>)
            .pivot(Noop::<2>)
            .retriable(Noop::<3>)
            .build()
            .expect("a valid definition")
    }

    type Outcome = Result<Value, StepError>;

    fn ok() -> Outcome {
        Ok(Value::Null)
    }
    fn rejected() -> Outcome {
        Err(StepError::Rejected("no".into()))
    }
    fn unavailable() -> Outcome {
        Err(StepError::unavailable("down"))
    }
    fn failed() -> Outcome {
        Err(StepError::Failed("lost".into()))
    }
    /// Refused by an open circuit breaker that lets a call through in 500 ms.
    fn breaker_open() -> Outcome {
        Err(StepError::Unavailable { reason: "open".into(), retry_after: Some(HALF_A_SECOND) })
    }
    const HALF_A_SECOND: Duration = Duration::from_millis(500);
    const NOT_BEFORE_THE_BREAKER: Next = Next::Retry { at_least: Some(HALF_A_SECOND) };
    fn compensate(first: Position, reason: &str) -> Next {
        Next::Compensate { first, reason: reason.into() }
    }
    fn cancel(reason: &str) -> Next {
        Next::Cancel { reason: reason.into() }
    }

    #[test]
    fn forward_outcomes() {
        let def = trip();
        // (at, outcome, attempts so far, give up (deadline passed), next)
        let table: Vec<(Position, Outcome, u32, bool, Next)> = vec![
            // Success moves on; the last step's completes the saga.
            (F(0), ok(), 1, false, Next::Step(F(1))),
            (F(2), ok(), 1, false, Next::Step(F(3))),
            (F(3), ok(), 1, false, Next::Complete),
            // Rejected: nothing of its own to undo; the steps before it are.
            (F(0), rejected(), 1, false, cancel("no")),
            (F(1), rejected(), 1, false, compensate(C(0), "no")),
            (F(2), rejected(), 1, false, compensate(C(1), "no")),
            // Unavailable: retried while attempts are left and the deadline allows, then as rejected.
            (F(0), unavailable(), 1, false, Next::RETRY),
            (F(0), unavailable(), 2, false, Next::RETRY),
            // ...and not before an open circuit breaker lets a call through.
            (F(0), breaker_open(), 2, false, NOT_BEFORE_THE_BREAKER),
            (F(0), breaker_open(), 3, false, cancel("open")),
            (F(3), breaker_open(), 99, true, NOT_BEFORE_THE_BREAKER),
            (F(0), unavailable(), 3, false, cancel("down")),
            (F(0), unavailable(), 1, true, cancel("down")),
            (F(1), unavailable(), 1, false, compensate(C(0), "down")),
            // Failed (may have had an effect): its own compensation runs first.
            (F(0), failed(), 1, false, Next::RETRY),
            (F(0), failed(), 3, false, compensate(C(0), "lost")),
            (F(0), failed(), 1, true, compensate(C(0), "lost")),
            (F(1), failed(), 1, false, compensate(C(1), "lost")),
            // A pivot without compensation cannot be undone: retried until it succeeds or is rejected.
            (F(2), failed(), 1, true, Next::RETRY),
            (F(2), failed(), 99, false, Next::RETRY),
            // After the pivot: retried whatever happens.
            (F(3), rejected(), 1, true, Next::RETRY),
            (F(3), failed(), 99, true, Next::RETRY),
            (F(3), unavailable(), 99, true, Next::RETRY),
        ];
        for (at, outcome, attempts, give_up, next) in table {
            assert_eq!(
                transition(&def, at, &outcome, attempts, give_up),
                next,
                "{at:?} {outcome:?} after {attempts} attempt(s), give up {give_up}"
            );
        }
    }

    #[test]
    fn a_check_undoes_the_steps_before_it_and_nothing_of_its_own() {
        // book (check), hotel (compensatable), pay (check), notify (pivot).
        let def = Definition::builder(Trip)
            .check(Noop::<0>)
            .compensatable(Noop::<1>, Undo::<1>)
            .check(Noop::<2>)
            .pivot(Noop::<3>)
            .build()
            .expect("a valid definition");
        let table: Vec<(Position, Outcome, u32, bool, Next)> = vec![
            (F(0), ok(), 1, false, Next::Step(F(1))),
            (F(0), rejected(), 1, false, cancel("no")),
            (F(0), failed(), 1, false, cancel("lost")),
            (F(0), unavailable(), 1, true, cancel("down")),
            (F(2), rejected(), 1, false, compensate(C(1), "no")),
            (F(2), failed(), 1, false, compensate(C(1), "lost")),
            (F(2), failed(), 1, true, compensate(C(1), "lost")),
            (C(1), ok(), 1, false, Next::Compensated),
        ];
        for (at, outcome, attempts, give_up, next) in table {
            assert_eq!(
                transition(&def, at, &outcome, attempts, give_up),
                next,
                "{at:?} {outcome:?} after {attempts} attempt(s), give up {give_up}"
            );
        }
    }

    #[test]
    fn compensation_outcomes() {
        let def = trip();
        let table: Vec<(Position, Outcome, Next)> = vec![
            // Done (or refused: nothing more to undo): the next compensation back, or the end.
            (C(1), ok(), Next::Step(C(0))),
            (C(1), rejected(), Next::Step(C(0))),
            (C(0), ok(), Next::Compensated),
            (C(0), rejected(), Next::Compensated),
            // Compensations are retried until they succeed.
            (C(1), failed(), Next::RETRY),
            (C(0), unavailable(), Next::RETRY),
            (C(0), breaker_open(), NOT_BEFORE_THE_BREAKER),
        ];
        for (at, outcome, next) in table {
            for give_up in [false, true] {
                assert_eq!(transition(&def, at, &outcome, 50, give_up), next, "{at:?} {outcome:?}");
            }
        }
    }

    fn state(at: Position, attempts: Option<i32>) -> State<Trip> {
        State {
            version: 1,
            status: SagaStatus::Running,
            at,
            failure_reason: None,
            created_at: chrono::Utc::now(),
            input: (),
            outputs: serde_json::Map::new(),
            step_started_at: None,
            attempts,
            maybe_sent: false,
        }
    }

    #[test]
    fn row_updates() {
        let settings = SagaSettings { retry_base_ms: 100, retry_max_ms: 10_000, ..SagaSettings::default() };
        let s = state(F(1), Some(2));
        type Row = (Option<SagaStatus>, Option<Position>, Option<&'static str>, bool, bool, bool, bool);
        // (next, carried, operator) -> (status, current, reason, release, finished, hand back, progressed)
        let table: Vec<(Next, bool, bool, Row)> = vec![
            (Next::Step(F(2)), false, false, (None, Some(F(2)), None, false, false, false, true)),
            (
                compensate(C(0), "no"),
                false,
                false,
                (Some(SagaStatus::Compensating), Some(C(0)), Some("no"), false, false, false, true),
            ),
            (Next::RETRY, false, false, (None, None, None, true, false, false, false)),
            // A carried step's result moves the instance to the step that commits it, even on a retry.
            (Next::RETRY, true, false, (None, Some(F(1)), None, true, false, false, false)),
            (
                Next::Complete,
                false,
                false,
                (Some(SagaStatus::Completed), None, None, true, true, false, true),
            ),
            (
                cancel("no"),
                false,
                false,
                (Some(SagaStatus::Compensated), None, Some("no"), true, true, false, true),
            ),
            (
                Next::Compensated,
                false,
                false,
                (Some(SagaStatus::Compensated), None, None, true, true, false, true),
            ),
            // An operator's action hands the instance back to the worker, due at once...
            (Next::Step(F(2)), false, true, (None, Some(F(2)), None, true, false, true, true)),
            // ...unless it ended it.
            (Next::Complete, false, true, (Some(SagaStatus::Completed), None, None, true, true, false, true)),
        ];
        for (next, carried, operator, want) in table {
            let u = RowUpdate::new(&next, &s, carried, operator, &settings);
            let got = (u.status, u.current, u.reason, u.release, u.finished, u.hand_back, u.progressed);
            assert_eq!(got, want, "{next:?} carried {carried} operator {operator}");
        }
        // The retry's backoff (full jitter below the attempt's ceiling); an
        // operator's hand-back is due at once.
        let backoff = Backoff::from_millis(settings.retry_base_ms, settings.retry_max_ms);
        for attempts in [1, 4, 30] {
            let delay =
                RowUpdate::new(&Next::RETRY, &state(F(1), Some(attempts)), false, false, &settings).delay;
            assert!(delay.is_some_and(|d| d <= backoff.ceiling(attempts as u32)), "{delay:?}");
        }
        // A retry refused by an open breaker waits at least until the breaker lets a call
        // through, also where the backoff alone would be shorter.
        assert!(backoff.ceiling(1) < HALF_A_SECOND);
        for attempts in [1, 2, 30] {
            let at = state(F(1), Some(attempts));
            let delay = RowUpdate::new(&NOT_BEFORE_THE_BREAKER, &at, false, false, &settings).delay;
            assert!(delay.is_some_and(|d| d >= HALF_A_SECOND), "{delay:?}");
        }
        assert_eq!(RowUpdate::new(&Next::RETRY, &s, false, true, &settings).delay, Some(Duration::ZERO));
        assert_eq!(RowUpdate::new(&Next::Complete, &s, false, false, &settings).delay, None);
    }
}
