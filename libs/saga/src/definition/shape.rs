//! A definition without its code ([`Shape`]) and its fingerprint: what an
//! instance's stored state is read through.

use super::Definition;
use super::step::StepKind;
use crate::step::Saga;

impl<S: Saga> Definition<S> {
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
