//! The API gateway: the only public entry to sagaworks.
//!
//! REST + JSON over axum, documented by an OpenAPI document generated with
//! utoipa (`GET /openapi.json`). Every call goes to a service over gRPC through
//! the shared resilience stack; every failure is answered as problem+json.
//!
//! * [`config`] holds the settings (`[auth]`, `[rate_limit]`, ...).
//! * [`auth`] — bearer tokens (JWT), the [`auth::Caller`] of a request, ownership and admin checks.
//! * [`ratelimit`] — a request budget per client.
//! * [`server`] — the HTTP server: connection cap, header-read and request timeouts.
//! * [`startup`] — [`startup::Application`], built by `main` and by tests.
//! * [`api`] — routes, handlers and the OpenAPI document.
//! * [`model`] — the JSON resources.
//! * [`extract`] — strict JSON bodies.
//! * [`error`] — every failure mapped to problem+json in one place.

pub mod api;
pub mod auth;
pub mod config;
pub mod error;
pub mod extract;
pub mod model;
pub mod ratelimit;
pub mod server;
pub mod startup;
