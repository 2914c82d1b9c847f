//! The idempotent consumer: [`Consumer`] (its docs say what it guarantees and how).

mod envelope;
mod handler;
mod inbox;
mod outcome;
mod process;
mod settings;
mod subscription;
mod worker;

pub use envelope::ReceivedEvent;
pub use handler::{Handler, HandlerError};
pub use settings::{ConsumerSettings, UnsupportedVersionPolicy};
pub use worker::Consumer;
