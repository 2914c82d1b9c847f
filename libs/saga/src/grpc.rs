//! A participant's gRPC answer as a [`StepError`].
//!
//! A forward call the resilience stack never sent (breaker open, bulkhead
//! full, or no attempt could connect) had no effect: `Unavailable`, retried
//! while the step has attempts left, then nothing to compensate for it. Anything that may have reached the participant (a
//! timeout, an open breaker that cut the retries of an attempt that timed
//! out, a broken connection) is `Failed`. A compensation that was not sent
//! has undone nothing yet, so it is `Failed` (retried), never `Rejected`.
//! Business refusals (`FAILED_PRECONDITION`, `NOT_FOUND`, ...) are `Rejected`.
//!
//! A step maps its call's error with [`StepContext::grpc_error`], which knows
//! the step and its direction:
//!
//! ```ignore
//! client.charge(request).await.map_err(|s| ctx.grpc_error(&s))?;
//! ```

use crate::step::{Saga, StepContext, StepError};
use sagaworks_resilience::Rejection;
use tonic::Code;

impl<S: Saga> StepContext<'_, S> {
    /// The running step's gRPC call answered `status`: how the step failed.
    pub fn grpc_error(&self, status: &tonic::Status) -> StepError {
        let direction = if self.is_compensation() { Direction::Compensation } else { Direction::Forward };
        step_error(self.step(), direction, status)
    }
}

/// Which way the call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Forward,
    Compensation,
}

/// Classifies `status`, the answer to step `step`'s call.
fn step_error(step: &str, direction: Direction, status: &tonic::Status) -> StepError {
    let what = format!("{step}: {}", status.message());
    let rejection = sagaworks_resilience::rejection(status);
    let why = match rejection {
        Some(Rejection::BulkheadFull) => Some("too many calls in flight"),
        Some(Rejection::CircuitOpen { .. }) => Some("circuit open"),
        Some(Rejection::Timeout) => Some("timed out"),
        None => None,
    };
    let what = match why {
        Some(why) => format!("{what} ({why})"),
        None => what,
    };
    if sagaworks_resilience::never_sent(status) {
        return match direction {
            Direction::Compensation => StepError::Failed(format!("{what}; not sent")),
            Direction::Forward => StepError::Unavailable {
                reason: format!("{what}; not sent"),
                retry_after: match rejection {
                    Some(Rejection::CircuitOpen { retry_after }) => Some(retry_after),
                    _ => None,
                },
            },
        };
    }
    if why.is_some() {
        return StepError::Failed(what);
    }
    if is_rejection(status.code()) { StepError::Rejected(what) } else { StepError::Failed(what) }
}

/// Whether a participant's answer `code` is a business refusal: the codes the participants
/// refuse a request with (a saga step's [`StepError::Rejected`]), as opposed to a transport
/// or server problem, after which the call may or may not have taken effect. The one table
/// of the participants' contract, for any orchestrator that reads their answers.
pub fn is_rejection(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::Aborted
            | Code::AlreadyExists
            | Code::OutOfRange
            | Code::PermissionDenied
            | Code::Unauthenticated
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use Direction::*;
    use std::time::Duration;

    fn rejected(e: &StepError, part: &str) -> bool {
        matches!(e, StepError::Rejected(m) if m.contains(part))
    }
    fn failed(e: &StepError, part: &str) -> bool {
        matches!(e, StepError::Failed(m) if m.contains(part))
    }

    #[test]
    fn business_codes_are_rejections_and_transport_trouble_is_a_failure() {
        let s = tonic::Status::failed_precondition("insufficient stock");
        assert!(rejected(&step_error("reserve_stock", Forward, &s), "insufficient stock"));
        assert!(failed(&step_error("charge", Forward, &tonic::Status::unavailable("x")), "x"));
        assert!(failed(&step_error("charge", Forward, &tonic::Status::deadline_exceeded("x")), "x"));
    }

    /// A status as the resilience stack returns it, marked `x-sagaworks-sent`.
    fn from_stack(mut status: tonic::Status, sent: &'static str) -> tonic::Status {
        let value = tonic::metadata::MetadataValue::from_static(sent);
        status.metadata_mut().insert(sagaworks_resilience::SENT_METADATA, value);
        status
    }

    fn open() -> tonic::Status {
        Rejection::CircuitOpen { retry_after: Duration::from_secs(1) }.to_status("payment")
    }

    fn unavailable(e: &StepError, part: &str) -> bool {
        matches!(e, StepError::Unavailable { reason, .. } if reason.contains(part))
    }

    #[test]
    fn a_forward_call_that_was_never_sent_had_no_effect_and_may_be_tried_again() {
        let refused = from_stack(tonic::Status::unavailable("connection refused"), "no");
        assert!(unavailable(&step_error("charge", Forward, &refused), "not sent"));
        assert!(unavailable(&step_error("charge", Forward, &from_stack(open(), "no")), "circuit open"));
        let full = from_stack(Rejection::BulkheadFull.to_status("inventory"), "no");
        assert!(unavailable(&step_error("reserve", Forward, &full), "too many calls"));
    }

    #[test]
    fn an_open_breaker_says_when_the_step_may_be_tried_again() {
        let retry_after = |status: &tonic::Status| match step_error("charge", Forward, status) {
            StepError::Unavailable { retry_after, .. } => retry_after,
            other => panic!("{other:?}"),
        };
        assert_eq!(retry_after(&from_stack(open(), "no")), Some(Duration::from_secs(1)));
        let full = from_stack(Rejection::BulkheadFull.to_status("inventory"), "no");
        assert_eq!(retry_after(&full), None);
    }

    #[test]
    fn a_call_that_may_have_been_sent_may_have_had_an_effect() {
        // The breaker opened after an attempt that timed out: that one may have arrived.
        assert!(failed(&step_error("charge", Forward, &from_stack(open(), "maybe")), "circuit open"));
        let timeout = from_stack(Rejection::Timeout.to_status("inventory"), "maybe");
        assert!(failed(&step_error("reserve", Forward, &timeout), "timed out"));
        let answered = from_stack(tonic::Status::unavailable("shutting down"), "maybe");
        assert!(failed(&step_error("charge", Forward, &answered), "shutting down"));
        // Unmarked (not from the stack): the safe side.
        assert!(failed(&step_error("charge", Forward, &open()), "circuit open"));
    }

    #[test]
    fn a_compensation_that_was_never_sent_is_retried_not_skipped() {
        for status in [
            from_stack(tonic::Status::unavailable("connection refused"), "no"),
            from_stack(open(), "no"),
            from_stack(Rejection::BulkheadFull.to_status("payment"), "no"),
        ] {
            assert!(failed(&step_error("refund", Compensation, &status), "not sent"), "{status:?}");
        }
    }
}
