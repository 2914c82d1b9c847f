//! The fault matrix, generated from a definition's [`Shape`].
//!
//! [`cases`] lists, for every step of a saga, the faults it can meet and
//! what the saga must end with after each:
//!
//! | fault | for | expected end |
//! |---|---|---|
//! | `rejected` | forward steps | before/at the pivot: COMPENSATED, the steps before it undone; after: retried, COMPLETED |
//! | `unavailable_once` | forward steps | its participant cannot be reached on the first attempt: with attempts left (`max_attempts` > 1, or after the pivot) retried, COMPLETED; else as `rejected` |
//! | `failed_after_call` | forward steps | the call ran and its answer was lost, on every attempt: before/at the pivot COMPENSATED with the step itself undone (a pivot without compensation is retried); after: COMPLETED |
//! | `crash_before`, `crash_after_call`, `crash_after_commit` | every step | the replica stops dead there; another one resumes the instance to the same end as without the crash |
//! | `crash_after_call_then_unreachable` | forward steps with a compensation | the replica stops dead after the call; the one that resumes cannot reach the participant on any attempt left: the first call may have taken effect, so COMPENSATED with the step itself undone |
//! | `duplicate` | every step | every call runs twice; the same end, no effect twice |
//! | `compensation_fails_then_succeeds` | compensations | it fails (after running) three times, then succeeds: COMPENSATED |
//! | `deadline_passed` | steps with a deadline | COMPENSATED, the step itself undone |
//!
//! A compensation's cases are reached by the forward fault that makes the
//! saga run it (the next step rejected, or the pivot failing). Each case is
//! expressed as [`SagaSettings`] for the first replica ([`Case::apply`]); a
//! host runs one instance under them (a second replica when [`Case::crashes`],
//! under [`Case::apply_resumed`]) and checks [`Case::expect`] and its own
//! invariants.
//! Adding a step to a definition adds its cases: no test code changes.
//!
//! With the `testing` feature, [`trials`] turns the cases into
//! `libtest-mimic` trials, each listed by name (`<step>::<fault>`).

use crate::definition::{Shape, StepKind};
use crate::{SagaSettings, SagaStatus};

/// The worker's poll, for plan tests: it must read only unfinished instances
/// (an index scan on `saga_instances_runnable`), however many finished ones
/// the table holds.
pub use crate::engine::LEASE_SQL;

/// A fault the matrix injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Rejected,
    UnavailableOnce,
    FailedAfterCall,
    CrashBefore,
    CrashAfterCall,
    CrashAfterCommit,
    CrashAfterCallThenUnreachable,
    Duplicate,
    CompensationFailsThenSucceeds,
    DeadlinePassed,
}

impl Fault {
    pub fn label(self) -> &'static str {
        match self {
            Fault::Rejected => "rejected",
            Fault::UnavailableOnce => "unavailable_once",
            Fault::FailedAfterCall => "failed_after_call",
            Fault::CrashBefore => "crash_before",
            Fault::CrashAfterCall => "crash_after_call",
            Fault::CrashAfterCommit => "crash_after_commit",
            Fault::CrashAfterCallThenUnreachable => "crash_after_call_then_unreachable",
            Fault::Duplicate => "duplicate",
            Fault::CompensationFailsThenSucceeds => "compensation_fails_then_succeeds",
            Fault::DeadlinePassed => "deadline_passed",
        }
    }
}

/// How one case must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub status: SagaStatus,
    /// Forward steps whose effect stands at the end (each exactly once).
    pub effective: Vec<&'static str>,
    /// The compensations that ran, in the order they ran.
    pub compensations: Vec<&'static str>,
}

/// One cell of the matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// The forward step or compensation the fault hits.
    pub step: &'static str,
    pub fault: Fault,
    /// For the first replica (see [`Case::apply`]).
    pub crash_point: String,
    pub faults: String,
    /// For the replica that resumes the instance after a crash.
    pub resumed_faults: String,
    pub expect: Expected,
}

impl Case {
    /// `<step>::<fault>`.
    pub fn name(&self) -> String {
        format!("{}::{}", self.step, self.fault.label())
    }

    /// The first replica stops dead: a second one, without faults, must
    /// resume the instance.
    pub fn crashes(&self) -> bool {
        !self.crash_point.is_empty()
    }

    /// The crash comes after the commit that ends the instance: the first
    /// replica finished it, and the second has nothing left to do.
    pub fn ends_before_crash(&self) -> bool {
        self.fault == Fault::CrashAfterCommit
            && match self.expect.status {
                SagaStatus::Completed => self.expect.effective.last() == Some(&self.step),
                _ => self.expect.compensations.last() == Some(&self.step),
            }
    }

    /// Sets the case's faults on the first replica's settings.
    pub fn apply(&self, settings: &mut SagaSettings) {
        settings.crash_point = self.crash_point.clone();
        settings.faults = self.faults.clone();
    }

    /// Sets the faults of the replica that resumes the instance after a
    /// crash (none for most cases).
    pub fn apply_resumed(&self, settings: &mut SagaSettings) {
        settings.faults = self.resumed_faults.clone();
    }
}

/// Every case of `shape`'s matrix; see the module docs.
pub fn cases(shape: &Shape) -> Vec<Case> {
    let steps = &shape.steps;
    let pivot = shape.pivot();
    let forward: Vec<&'static str> = steps.iter().map(|s| s.name).collect();
    let completed =
        Expected { status: SagaStatus::Completed, effective: forward.clone(), compensations: vec![] };
    // COMPENSATED after undoing the steps `..end` that have a compensation.
    let undone = |end: usize| Expected {
        status: SagaStatus::Compensated,
        effective: vec![],
        compensations: steps[..end].iter().rev().filter_map(|s| s.compensation).collect(),
    };
    let case =
        |step: &'static str, fault: Fault, crash: Option<&str>, faults: String, expect: &Expected| Case {
            step,
            fault,
            crash_point: crash.map(|when| format!("{when}:{step}")).unwrap_or_default(),
            faults,
            resumed_faults: String::new(),
            expect: expect.clone(),
        };
    let crashes = |step: &'static str, commits: bool, faults: &str, expect: &Expected| {
        let mut out = vec![
            case(step, Fault::CrashBefore, Some("before"), faults.into(), expect),
            case(step, Fault::CrashAfterCall, Some("after_call"), faults.into(), expect),
        ];
        if commits {
            out.push(case(step, Fault::CrashAfterCommit, Some("after_commit"), faults.into(), expect));
        }
        out
    };

    let mut out = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let retried = s.kind == StepKind::Retriable;
        let rejected = if retried { completed.clone() } else { undone(i) };
        out.push(case(s.name, Fault::Rejected, None, format!("reject:{}", s.name), &rejected));
        let retried_once = retried || s.max_attempts > 1;
        let back = if retried_once { &completed } else { &rejected };
        out.push(case(s.name, Fault::UnavailableOnce, None, format!("unavailable:{}", s.name), back));
        let unanswered = s.max_attempts.max(1);
        let failed = match s.kind {
            StepKind::Retriable => completed.clone(),
            StepKind::Pivot if s.compensation.is_none() => completed.clone(),
            _ => undone(i + 1),
        };
        out.push(case(
            s.name,
            Fault::FailedAfterCall,
            None,
            format!("fail:{}:{unanswered}", s.name),
            &failed,
        ));
        out.extend(crashes(s.name, !shape.commits_with_next(i), "", &completed));
        out.push(case(s.name, Fault::Duplicate, None, format!("duplicate:{}", s.name), &completed));
        if s.deadline {
            out.push(case(s.name, Fault::DeadlinePassed, None, format!("late:{}", s.name), &undone(i + 1)));
        }
        // The call may have taken effect before the crash; every attempt of
        // the replica that resumes is "not sent", which proves nothing about
        // the first: the step's own compensation must run.
        if s.compensation.is_some() && !s.local {
            let mut c = case(
                s.name,
                Fault::CrashAfterCallThenUnreachable,
                Some("after_call"),
                String::new(),
                &undone(i + 1),
            );
            c.resumed_faults = format!("unavailable:{}:{}", s.name, s.max_attempts.max(1) + 1);
            out.push(c);
        }
    }
    for (i, s) in steps.iter().enumerate() {
        let Some(compensation) = s.compensation else { continue };
        // What makes the saga run this compensation.
        let trigger = if i < pivot {
            format!("reject:{}", steps[i + 1].name)
        } else {
            format!("fail:{}:{}", s.name, s.max_attempts.max(1))
        };
        let expect = undone(i + 1);
        out.extend(crashes(compensation, true, &trigger, &expect));
        out.push(case(
            compensation,
            Fault::Duplicate,
            None,
            format!("{trigger},duplicate:{compensation}"),
            &expect,
        ));
        out.push(case(
            compensation,
            Fault::CompensationFailsThenSucceeds,
            None,
            format!("{trigger},fail:{compensation}:3"),
            &expect,
        ));
    }
    out
}

/// The cases of `shape` as `libtest-mimic` trials named `<prefix><step>::<fault>`;
/// `run` runs one case (on a Tokio runtime of the trial's own) and panics
/// or returns an error when it does not end as expected.
#[cfg(feature = "testing")]
pub fn trials<F, Fut>(prefix: &str, shape: &Shape, run: F) -> Vec<libtest_mimic::Trial>
where
    F: Fn(Case) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
{
    cases(shape)
        .into_iter()
        .map(|case| {
            let run = run.clone();
            libtest_mimic::Trial::test(format!("{prefix}{}", case.name()), move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| format!("a runtime: {e}"))?;
                let result =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(run(case))));
                runtime.shutdown_background();
                match result {
                    Ok(result) => result.map_err(Into::into),
                    Err(panic) => Err(panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panicked".into())
                        .into()),
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::StepShape;

    fn step(
        name: &'static str,
        kind: StepKind,
        compensation: Option<&'static str>,
        local: bool,
    ) -> StepShape {
        let deadline = !local
            && (matches!(kind, StepKind::Compensatable | StepKind::Check)
                || (kind == StepKind::Pivot && compensation.is_some()));
        StepShape { name, kind, local, compensation, max_attempts: 1, deadline }
    }

    fn order_shape() -> Shape {
        Shape {
            saga: "place_order",
            version: 1,
            steps: vec![
                step("reserve_stock", StepKind::Compensatable, Some("release_stock"), false),
                step("charge_payment", StepKind::Pivot, Some("refund_payment"), false),
                step("confirm_order", StepKind::Retriable, None, true),
            ],
        }
    }

    fn find<'a>(cases: &'a [Case], name: &str) -> &'a Case {
        cases.iter().find(|c| c.name() == name).unwrap_or_else(|| panic!("no case {name}"))
    }

    #[test]
    fn every_step_gets_its_cases_with_the_expected_ends() {
        let cases = cases(&order_shape());
        let names: Vec<String> = cases.iter().map(Case::name).collect();
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "names are unique: {names:?}");

        let charge_rejected = find(&cases, "charge_payment::rejected");
        assert_eq!(charge_rejected.faults, "reject:charge_payment");
        assert_eq!(charge_rejected.expect.status, SagaStatus::Compensated);
        assert_eq!(charge_rejected.expect.compensations, ["release_stock"]);
        let charge_failed = find(&cases, "charge_payment::failed_after_call");
        assert_eq!(charge_failed.expect.compensations, ["refund_payment", "release_stock"]);
        assert_eq!(find(&cases, "reserve_stock::rejected").expect.compensations, Vec::<&str>::new());
        assert_eq!(find(&cases, "confirm_order::rejected").expect.status, SagaStatus::Completed);
        // One attempt only: an unreachable participant is given up on at once.
        let reserve_unavailable = find(&cases, "reserve_stock::unavailable_once");
        assert_eq!(reserve_unavailable.faults, "unavailable:reserve_stock");
        assert_eq!(reserve_unavailable.expect, find(&cases, "reserve_stock::rejected").expect);
        let mut patient = order_shape();
        patient.steps[0].max_attempts = 3;
        assert_eq!(
            find(&super::cases(&patient), "reserve_stock::unavailable_once").expect.status,
            SagaStatus::Completed
        );
        // charge_payment's success commits with confirm_order: no point after its own commit.
        assert!(!names.contains(&"charge_payment::crash_after_commit".to_string()));
        assert!(names.contains(&"reserve_stock::crash_after_commit".to_string()));
        assert!(!names.contains(&"confirm_order::deadline_passed".to_string()));
        let refund = find(&cases, "refund_payment::compensation_fails_then_succeeds");
        assert_eq!(refund.faults, "fail:charge_payment:1,fail:refund_payment:3");
        assert!(find(&cases, "release_stock::crash_after_commit").ends_before_crash());
        assert!(find(&cases, "confirm_order::crash_after_commit").ends_before_crash());
        assert!(!find(&cases, "reserve_stock::crash_after_commit").ends_before_crash());
        assert!(!find(&cases, "refund_payment::crash_after_commit").ends_before_crash());
        let release = find(&cases, "release_stock::crash_after_call");
        assert_eq!(
            (release.crash_point.as_str(), release.faults.as_str()),
            ("after_call:release_stock", "reject:charge_payment")
        );
    }

    #[test]
    fn a_new_step_brings_its_own_cases() {
        let before = cases(&order_shape()).len();
        let mut shape = order_shape();
        shape.steps.push(step("ship", StepKind::Retriable, None, false));
        let after = cases(&shape);
        let ship: Vec<String> = after.iter().map(Case::name).filter(|n| n.starts_with("ship::")).collect();
        assert_eq!(
            ship,
            [
                "ship::rejected",
                "ship::unavailable_once",
                "ship::failed_after_call",
                "ship::crash_before",
                "ship::crash_after_call",
                "ship::crash_after_commit",
                "ship::duplicate"
            ]
        );
        assert_eq!(after.len(), before + ship.len());
    }

    #[test]
    fn a_check_undoes_only_the_steps_before_it() {
        let mut shape = order_shape();
        shape.steps.insert(0, step("check_account", StepKind::Check, None, false));
        shape.steps.insert(2, step("check_limit", StepKind::Check, None, false));
        let cases = cases(&shape);
        for fault in ["rejected", "failed_after_call", "deadline_passed"] {
            let first = find(&cases, &format!("check_account::{fault}"));
            assert_eq!(first.expect.status, SagaStatus::Compensated, "{fault}");
            assert_eq!(first.expect.compensations, Vec::<&str>::new(), "{fault}: nothing before it to undo");
            let second = find(&cases, &format!("check_limit::{fault}"));
            assert_eq!(second.expect.compensations, ["release_stock"], "{fault}: only the steps before it");
        }
        // Nothing of its own to undo: no case where its call's effect must be compensated.
        assert!(!cases.iter().any(|c| c.name() == "check_account::crash_after_call_then_unreachable"));
        assert!(cases.iter().any(|c| c.name() == "reserve_stock::crash_after_call_then_unreachable"));
    }
}
