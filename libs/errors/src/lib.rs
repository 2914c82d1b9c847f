//! Error shapes shared by every sagaworks service.
//!
//! * REST answers errors as [`Problem`] (RFC 9457 `application/problem+json`;
//!   its home is `sagaworks-api`, shared with the API's clients).
//! * gRPC answers errors as a [`tonic::Status`] whose code carries the meaning
//!   callers act on; [`status`] has the constructors the services use so the
//!   same failure gets the same code everywhere, and [`db_status`] maps
//!   database failures without leaking SQL to callers.
//!
//! Each service keeps its own `thiserror` enum and maps it in exactly one
//! `From<Error> for Status` (or `IntoResponse`) impl built from these pieces.

pub mod status;
pub mod validate;

pub use sagaworks_api::problem::{FieldError, PROBLEM_JSON, Problem};
pub use status::db_status;
pub use validate::InvalidField;
