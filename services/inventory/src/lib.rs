//! The inventory service: the product catalogue, prices and stock.
//!
//! It answers the saga's `ReserveStock` / `ReleaseReservation` calls and the
//! gateway's admin calls over gRPC, and turns a reservation into a sale when
//! the order is confirmed. It owns its database; nothing else reads it.
//!
//! * [`config`] — settings.
//! * [`startup`] — [`startup::Application`], built by `main` and by tests.
//! * [`grpc`] — request validation and mapping to the protobuf contract.
//! * [`stock`] — the stock rules, on the database.
//! * [`events`] — turning reservations into sales on `OrderConfirmed`.
//! * [`error`] — errors and their one mapping to gRPC codes.

pub mod config;
pub mod error;
pub mod events;
pub mod grpc;
pub mod startup;
pub mod stock;
