//! What an operator does to an instance ([`OperatorAction`]), as recorded
//! ([`ActionKind`]) and as the host sees it ([`OperatorRecord`]). Imports
//! nothing else of the crate: the engine, the steps and the operators' API
//! ([`crate::admin`]) all read it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use sagaworks_runtime::Operator;

/// What an operator does to an instance; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub enum OperatorAction {
    RetryNow,
    Compensate,
    /// The current step's effect, stated by hand: the output of a forward
    /// step (JSON of its `Output` type; `null` for `()`), ignored for a
    /// compensation.
    Resolve {
        output: Value,
    },
}

/// The kind of an [`OperatorAction`], as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ActionKind {
    Retry,
    Compensate,
    Resolve,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Retry => "RETRY",
            ActionKind::Compensate => "COMPENSATE",
            ActionKind::Resolve => "RESOLVE",
        }
    }

    /// The outcome recorded in the step's history.
    pub(crate) fn outcome(self) -> &'static str {
        match self {
            ActionKind::Retry => "retried",
            ActionKind::Compensate => "abandoned",
            ActionKind::Resolve => "resolved",
        }
    }
}

impl OperatorAction {
    pub fn kind(&self) -> ActionKind {
        match self {
            OperatorAction::RetryNow => ActionKind::Retry,
            OperatorAction::Compensate => ActionKind::Compensate,
            OperatorAction::Resolve { .. } => ActionKind::Resolve,
        }
    }
}

/// An operator's action as the host sees it ([`Saga::on_operator_action`](crate::Saga::on_operator_action)).
#[derive(Debug, Clone, Copy)]
pub struct OperatorRecord<'a> {
    pub action: ActionKind,
    /// The step it acted on.
    pub step: &'a str,
    pub actor: &'a str,
    pub reason: &'a str,
}

/// An operator's action committed with a transition.
pub(crate) struct Audit<'a> {
    pub(crate) action: ActionKind,
    pub(crate) operator: &'a Operator,
}
