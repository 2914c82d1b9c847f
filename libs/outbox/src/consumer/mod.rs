//! The idempotent consumer: [`Consumer`] (its docs say what it guarantees and how).

mod dlq;
mod envelope;
mod handler;
mod inbox;
mod process;
mod settings;
mod worker;

pub use dlq::DlqReason;
pub use envelope::{EnvelopeError, ReceivedEvent};
pub use handler::{Handler, HandlerError};
pub use settings::{ConsumerSettings, UnsupportedVersionPolicy};
pub use worker::Consumer;
