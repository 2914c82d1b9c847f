//! Operator tools for a running sagaworks system (`scripts/load`,
//! `scripts/chaos`):
//!
//! * [`fixture`]: seed products and customers through the gateway and save
//!   them as JSON.
//! * [`load`]: a closed-loop load generator for `POST /v1/orders` with exact
//!   latency percentiles ([`stats`]).
//! * [`target`]: where `load` sends its orders: the gateway, or the Restate peer of
//!   `scripts/bench-peer` (the same saga orchestrated by Restate), and how each answers.
//! * [`open_loop`]: the open-loop generator: a fixed arrival rate, latencies
//!   from the intended send time (HdrHistogram), and a sweep for the knee.
//! * [`check`]: the invariants a run must keep (orders terminal, stock
//!   conserved, money balanced, every event on Kafka exactly once after dedup).
//! * [`token`]: bearer tokens for the gateway (fixed, or minted with its HS256 secret).
//! * [`cpu`]: the machine's busy CPU time, for the CPU a saga costs.
//! * [`pg`]: connections to the service databases and the server's commit counter.
//!
//! The binary (`sagaworks-tools seed|load|check`) wires them to the flags of [`cli`].

pub mod api;
pub mod check;
pub mod cli;
pub mod cpu;
pub mod error;
pub mod fixture;
pub mod load;
pub mod open_loop;
pub mod pg;
pub mod processes;
pub mod stats;
pub mod target;
pub mod token;

pub use api::{Api, PlaceOutcome};
pub use error::ToolError;
pub use fixture::{Fixture, FixtureCustomer, FixtureProduct, SeedPlan};
pub use target::{Orders, Target};
pub use token::Tokens;
