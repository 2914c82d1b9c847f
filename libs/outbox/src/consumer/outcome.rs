//! How a message ended ([`Outcome`]), and why one was dead-lettered
//! ([`DlqReason`]): plain values the consumer's steps hand each other.

#[cfg(doc)]
use super::{ConsumerSettings, Handler, HandlerError};

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

/// Why a message was dead-lettered: the `dlq_reason` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DlqReason {
    /// Not a CloudEvent (a header missing or invalid).
    InvalidEnvelope,
    /// The handler said it will never succeed ([`HandlerError::Permanent`]).
    Rejected,
    /// Retryable errors until `max_attempts` ran out.
    RetriesExhausted,
    /// A schema version newer than the handler reads.
    UnsupportedSchemaVersion,
    /// Its `ce_source` is not the topic's publisher ([`ConsumerSettings::sources`]).
    UntrustedSource,
    /// Its `ce_type` is not one the topic carries ([`ConsumerSettings::types`]).
    UnexpectedType,
}

impl DlqReason {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::InvalidEnvelope => "invalid_envelope",
            Self::Rejected => "rejected",
            Self::RetriesExhausted => "retries_exhausted",
            Self::UnsupportedSchemaVersion => "unsupported_schema_version",
            Self::UntrustedSource => "untrusted_source",
            Self::UnexpectedType => "unexpected_type",
        }
    }
}
