//! The order-placement saga.
//!
//! ```text
//!  reserve_stock ──ok──> charge_payment ──ok──> confirm_order ──> COMPLETED (order CONFIRMED)
//!       │                     │
//!   rejected: CANCELLED   rejected ──────────────┐
//!   failed ─────────┐     failed ──> refund_payment ──> release_stock ──> COMPENSATED (order CANCELLED)
//!                   └──────────────────────────────────────^
//! ```
//!
//! A step's outcome is one of three ([`StepOutcome`]): it *succeeded*; it was
//! *rejected* by a business rule (or never sent, e.g. the circuit was open),
//! so it had no effect; or it *failed* in a way that may have had an effect
//! (timeout, connection lost after sending). Compensation covers exactly the
//! steps that may have had an effect, in reverse order. Compensations are
//! retried with backoff until they succeed: they are idempotent, and
//! releasing or refunding something that never happened leaves a tombstone
//! at the participant so a late forward call is refused.
//!
//! * [`orchestrator`] — drives one saga, persisting every transition.
//! * [`worker`] — finds sagas whose driver stopped (crash, restart) and resumes them.

pub mod orchestrator;
pub mod worker;

/// One step of the saga (forward or compensation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    ReserveStock,
    ChargePayment,
    ConfirmOrder,
    RefundPayment,
    ReleaseStock,
}

impl Step {
    pub const ALL: [Step; 5] = [
        Step::ReserveStock,
        Step::ChargePayment,
        Step::ConfirmOrder,
        Step::RefundPayment,
        Step::ReleaseStock,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Step::ReserveStock => "reserve_stock",
            Step::ChargePayment => "charge_payment",
            Step::ConfirmOrder => "confirm_order",
            Step::RefundPayment => "refund_payment",
            Step::ReleaseStock => "release_stock",
        }
    }

    pub fn parse(s: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|step| step.as_str() == s)
    }

    pub fn is_compensation(self) -> bool {
        matches!(self, Step::RefundPayment | Step::ReleaseStock)
    }

    /// Runs in the order service alone, without a participant call.
    pub fn is_local(self) -> bool {
        matches!(self, Step::ConfirmOrder)
    }
}

/// What happened when a step ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    Succeeded,
    /// Definitely had no effect (business rule, invalid input, never sent).
    Rejected(String),
    /// May or may not have had an effect.
    Failed(String),
}

/// What the saga does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Run this step next (same direction).
    Next(Step),
    /// Start compensating with this step; the order will be cancelled for `reason`.
    Compensate { first: Step, reason: String },
    /// Nothing took effect: cancel right away.
    Cancel { reason: String },
    /// Try the same step again later.
    Retry,
    /// All forward steps done: the order is confirmed.
    Complete,
    /// All compensations done: the order is cancelled.
    Compensated,
}

/// The saga's rules, as a pure function (unit-tested below).
pub fn transition(step: Step, outcome: &StepOutcome) -> Transition {
    use StepOutcome::*;
    match (step, outcome) {
        (Step::ReserveStock, Succeeded) => Transition::Next(Step::ChargePayment),
        (Step::ReserveStock, Rejected(r)) => Transition::Cancel { reason: r.clone() },
        (Step::ReserveStock, Failed(r)) => {
            Transition::Compensate { first: Step::ReleaseStock, reason: r.clone() }
        }
        (Step::ChargePayment, Succeeded) => Transition::Next(Step::ConfirmOrder),
        (Step::ChargePayment, Rejected(r)) => {
            Transition::Compensate { first: Step::ReleaseStock, reason: r.clone() }
        }
        (Step::ChargePayment, Failed(r)) => {
            Transition::Compensate { first: Step::RefundPayment, reason: r.clone() }
        }
        (Step::ConfirmOrder, Succeeded) => Transition::Complete,
        // Confirming is local; a failure there is a database hiccup.
        (Step::ConfirmOrder, _) => Transition::Retry,
        // A compensation that is refused has nothing (more) to undo.
        (Step::RefundPayment, Succeeded | Rejected(_)) => Transition::Next(Step::ReleaseStock),
        (Step::ReleaseStock, Succeeded | Rejected(_)) => Transition::Compensated,
        (Step::RefundPayment | Step::ReleaseStock, Failed(_)) => Transition::Retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use StepOutcome::*;

    fn failed() -> StepOutcome {
        Failed("timeout".into())
    }
    fn rejected() -> StepOutcome {
        Rejected("no".into())
    }

    #[test]
    fn happy_path_runs_forward_to_completion() {
        assert_eq!(transition(Step::ReserveStock, &Succeeded), Transition::Next(Step::ChargePayment));
        assert_eq!(transition(Step::ChargePayment, &Succeeded), Transition::Next(Step::ConfirmOrder));
        assert_eq!(transition(Step::ConfirmOrder, &Succeeded), Transition::Complete);
    }

    #[test]
    fn compensation_covers_exactly_the_steps_that_may_have_taken_effect() {
        assert_eq!(transition(Step::ReserveStock, &rejected()), Transition::Cancel { reason: "no".into() });
        assert_eq!(
            transition(Step::ReserveStock, &failed()),
            Transition::Compensate { first: Step::ReleaseStock, reason: "timeout".into() }
        );
        assert_eq!(
            transition(Step::ChargePayment, &rejected()),
            Transition::Compensate { first: Step::ReleaseStock, reason: "no".into() }
        );
        assert_eq!(
            transition(Step::ChargePayment, &failed()),
            Transition::Compensate { first: Step::RefundPayment, reason: "timeout".into() }
        );
        assert_eq!(transition(Step::RefundPayment, &Succeeded), Transition::Next(Step::ReleaseStock));
        assert_eq!(transition(Step::ReleaseStock, &Succeeded), Transition::Compensated);
    }

    #[test]
    fn compensations_retry_until_done_and_refusals_move_on() {
        assert_eq!(transition(Step::RefundPayment, &failed()), Transition::Retry);
        assert_eq!(transition(Step::ReleaseStock, &failed()), Transition::Retry);
        assert_eq!(transition(Step::RefundPayment, &rejected()), Transition::Next(Step::ReleaseStock));
        assert_eq!(transition(Step::ConfirmOrder, &failed()), Transition::Retry);
    }

    #[test]
    fn step_names_round_trip() {
        for s in Step::ALL {
            assert_eq!(Step::parse(s.as_str()), Some(s));
        }
        assert_eq!(Step::parse("nope"), None);
    }
}
