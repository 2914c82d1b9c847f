//! The gateway's admin REST API, as the CLI calls it, by concern:
//!
//! * `api` — [`Client`] sends each request with the bearer [`Token`] and
//!   answers a [`Fetched`]: the typed body for human output and the JSON
//!   exactly as the API sent it for `--json`.
//! * `model` — the JSON shapes: the gateway's own saga and dead-letter types
//!   and [`Problem`] (`sagaworks_api`), which ignore fields they do not know,
//!   so a newer gateway does not break an older CLI.
//! * `error` — a non-2xx answer becomes an [`Error`] carrying the [`Problem`]
//!   document (RFC 9457, or one made up from the status when the body is not
//!   one, as a proxy's HTML error page is not) with the JSON as sent
//!   ([`ErrorAnswer`]). [`Error::from_problem`] maps the HTTP status to the
//!   error, and [`Error::exit_code`] the error to the exit code: change the
//!   mapping there and nowhere else.

mod api;
mod error;
mod model;

pub use api::{Client, DeadLetterFilter, REDACTED, SagaFilter, Token};
pub use error::{Error, ErrorAnswer, error_answer, exit};
pub use model::{
    DeadLetter, DeadLetterAction, DeadLetterPage, Discarded, DlqTopic, DlqTopics, Fetched, OriginalPosition,
    Problem, Replayed, SagaActionResult, SagaAttempt, SagaDetail, SagaOperatorAction, SagaPage, SagaStep,
    SagaSummary, SagaVersion, SagaVersions,
};
