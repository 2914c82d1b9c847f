//! Fault injection for tests: off unless `SagaSettings::crash_point` or
//! `SagaSettings::faults` is set, never in production.
//!
//! `crash_point` stops this replica dead at one point of every instance, as
//! if the process had been killed there: `before:<step>`, `after_call:<step>`
//! (the participant did the work, nothing was recorded) or
//! `after_commit:<step>`. `faults` is a comma separated list of:
//!
//! | fault | effect |
//! |---|---|
//! | `reject:<step>[:n]` | the first `n` (1) attempts of the step in each instance are rejected without being sent |
//! | `unavailable:<step>[:n]` | the first `n` (1) attempts are not sent, as if the participant could not be reached |
//! | `fail:<step>[:n]` | the first `n` (1) attempts run, then report a failure that may have had an effect (a timeout after sending) |
//! | `duplicate:<step>` | every attempt runs twice (a duplicate delivery); the second answer counts |
//! | `late:<step>` | the step's deadline counts as passed once it has started |
//!
//! `<step>` is a forward step or a compensation of the definition; an
//! unknown name is refused when the engine is built.
//!
//! The faults act only in a build with the cargo feature `test-hooks` (the
//! tests, dev-up); without it (release images) both settings are refused.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    Before,
    AfterCall,
    AfterCommit,
}

#[derive(Debug, Default)]
pub(crate) struct Faults {
    pub(crate) crash: Option<(When, String)>,
    reject: HashMap<String, u32>,
    unavailable: HashMap<String, u32>,
    fail: HashMap<String, u32>,
    duplicate: HashSet<String>,
    late: HashSet<String>,
    /// Attempts seen per instance and step, for the `n` of reject/fail.
    seen: Mutex<HashMap<(Uuid, String), u32>>,
}

/// What to do with one attempt of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Plan {
    pub(crate) reject: bool,
    pub(crate) unavailable: bool,
    pub(crate) fail_after: bool,
    pub(crate) twice: bool,
}

impl Faults {
    /// Parses both settings; every step named must be in `names`.
    /// Without the cargo feature `test-hooks` (release images) every fault is refused.
    pub(crate) fn parse(crash_point: &str, faults: &str, names: &[&str]) -> Result<Self, String> {
        let none = crash_point.trim().is_empty() && faults.trim().is_empty();
        if !cfg!(feature = "test-hooks") && !none {
            return Err("saga.crash_point and saga.faults are test hooks, and this binary is built without \
                 them (the cargo feature `test-hooks`)"
                .into());
        }
        let known = |step: &str| -> Result<String, String> {
            if names.contains(&step) {
                Ok(step.to_string())
            } else {
                Err(format!("unknown saga step {step:?} (known: {})", names.join(", ")))
            }
        };
        let mut f = Faults::default();
        if !crash_point.is_empty() {
            let (when, step) = crash_point
                .split_once(':')
                .ok_or_else(|| format!("invalid saga.crash_point {crash_point:?}"))?;
            let when = match when {
                "before" => When::Before,
                "after_call" => When::AfterCall,
                "after_commit" => When::AfterCommit,
                _ => return Err(format!("invalid saga.crash_point {crash_point:?}")),
            };
            f.crash = Some((when, known(step)?));
        }
        for item in faults.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let mut parts = item.split(':');
            let (kind, step, n) = (parts.next(), parts.next(), parts.next());
            let step = known(step.ok_or_else(|| format!("invalid saga fault {item:?}"))?)?;
            let n = match n {
                None => 1,
                Some(n) => n.parse().map_err(|_| format!("invalid count in saga fault {item:?}"))?,
            };
            match kind {
                Some("reject") => _ = f.reject.insert(step, n),
                Some("unavailable") => _ = f.unavailable.insert(step, n),
                Some("fail") => _ = f.fail.insert(step, n),
                Some("duplicate") => _ = f.duplicate.insert(step),
                Some("late") => _ = f.late.insert(step),
                _ => return Err(format!("invalid saga fault {item:?}")),
            }
        }
        Ok(f)
    }

    pub(crate) fn is_off(&self) -> bool {
        self.crash.is_none()
            && self.reject.is_empty()
            && self.unavailable.is_empty()
            && self.fail.is_empty()
            && self.duplicate.is_empty()
            && self.late.is_empty()
    }

    /// Counts one attempt of `step` of instance `id` and says what to do with it.
    pub(crate) fn plan(&self, id: Uuid, step: &str) -> Plan {
        if !cfg!(feature = "test-hooks")
            || self.reject.is_empty()
                && self.unavailable.is_empty()
                && self.fail.is_empty()
                && self.duplicate.is_empty()
        {
            return Plan::default();
        }
        let attempt = {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let n = seen.entry((id, step.to_string())).or_default();
            *n += 1;
            *n
        };
        Plan {
            reject: self.reject.get(step).is_some_and(|&n| attempt <= n),
            unavailable: self.unavailable.get(step).is_some_and(|&n| attempt <= n),
            fail_after: self.fail.get(step).is_some_and(|&n| attempt <= n),
            twice: self.duplicate.contains(step),
        }
    }

    pub(crate) fn is_late(&self, step: &str) -> bool {
        cfg!(feature = "test-hooks") && self.late.contains(step)
    }

    /// Whether this replica stops dead at `when` of `step`.
    pub(crate) fn crashes_at(&self, when: When, step: &str) -> bool {
        cfg!(feature = "test-hooks") && self.crash.as_ref().is_some_and(|(w, s)| *w == when && s == step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&str; 2] = ["reserve", "release"];

    #[test]
    fn parses_crash_points_and_faults_and_refuses_unknown_steps() {
        let f = Faults::parse("after_call:reserve", "reject:reserve:2, duplicate:release", &NAMES).unwrap();
        assert_eq!(f.crash, Some((When::AfterCall, "reserve".into())));
        let id = Uuid::nil();
        assert!(
            f.plan(id, "reserve").reject && f.plan(id, "reserve").reject && !f.plan(id, "reserve").reject
        );
        assert!(f.plan(id, "release").twice);
        assert!(Faults::parse("sometime:reserve", "", &NAMES).is_err());
        assert!(Faults::parse("before:nap", "", &NAMES).is_err());
        assert!(Faults::parse("", "reject:nap", &NAMES).is_err());
        assert!(Faults::parse("", "explode:reserve", &NAMES).is_err());
        assert!(Faults::parse("", "", &NAMES).unwrap().is_off());
    }
}
