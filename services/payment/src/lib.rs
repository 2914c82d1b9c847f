//! The payment service: customer accounts and their balances.
//!
//! It answers the saga's `Charge` / `Refund` calls and the gateway's admin
//! calls over gRPC. It owns its database; nothing else reads it.
//!
//! * [`config`] — settings.
//! * [`startup`] — [`startup::Application`], built by `main` and by tests.
//! * [`grpc`] — request validation and mapping to the protobuf contract.
//! * [`ledger`] — the money rules, on the database.
//! * [`error`] — errors and their one mapping to gRPC codes.

pub mod config;
pub mod error;
pub mod grpc;
pub mod ledger;
pub mod startup;
