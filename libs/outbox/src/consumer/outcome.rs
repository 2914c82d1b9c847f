//! How a message ended ([`Outcome`]): the value the consumer's steps hand
//! each other and count.

#[cfg(doc)]
use super::Handler;

/// How a message ended.
#[derive(Clone, Copy)]
pub(super) enum Outcome {
    Processed,
    /// The handler does not want this event ([`Handler::wants`]).
    Ignored,
    Duplicate,
    DeadLettered,
}

impl Outcome {
    pub(super) fn label(&self) -> &'static str {
        match self {
            Self::Processed => "processed",
            Self::Ignored => "ignored",
            Self::Duplicate => "duplicate",
            Self::DeadLettered => "dead_lettered",
        }
    }
}
