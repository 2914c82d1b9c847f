//! The REST API's JSON shapes, in one place for the gateway that answers
//! them and the clients that read them (the admin CLI):
//!
//! * [`Problem`] — an RFC 9457 `application/problem+json` error answer.
//! * [`dead_letter`] — the dead-letter operations' bodies (`/v1/admin/dlq`).
//! * [`saga`] — an order's saga and the operators' saga views (`/v1/admin/sagas`).
//!
//! Plain serde types. Feature `openapi` derives their utoipa schemas (the
//! gateway's OpenAPI document), feature `axum` answers a [`Problem`] as an
//! axum response; a client needs neither.

pub mod dead_letter;
pub mod problem;
pub mod saga;

pub use problem::{FieldError, PROBLEM_JSON, Problem};
