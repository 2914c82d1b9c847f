//! The order service: orders and the order-placement saga.
//!
//! `CreateOrder` records a PENDING order and its saga in one transaction,
//! then the orchestrator reserves stock (inventory), charges the customer
//! (payment) and confirms — or compensates in reverse and cancels. Saga state
//! lives in order's own database, so any replica resumes a saga whose driver
//! died.
//!
//! * [`config`] — settings.
//! * [`startup`] — [`startup::Application`], built by `main` and by tests.
//! * [`grpc`] — the API.
//! * [`dead_letters`] — the API operators use on the system's dead-letter topics.
//! * [`orders`] — orders, items, saga records and the timeline, on the database.
//! * [`saga`] — the order saga's definition and steps (driven by `sagaworks_saga`).
//! * [`timeline`] — the per-order event timeline, fed from Kafka.
//! * [`error`] — errors and their one mapping to gRPC codes.

pub mod config;
pub mod dead_letters;
pub mod error;
pub mod grpc;
pub mod orders;
pub mod saga;
pub mod startup;
pub mod timeline;
