//! The system tests, one module per area, in one test binary: each test still runs in a
//! process of its own under nextest, but the whole system is linked once instead of once
//! per area. The shared harness (`Stack`, the real processes, faults, tokens) is this
//! package's library, `tests/support/`. The fault matrix (`tests/saga_matrix.rs`) has a
//! harness of its own and stays a binary of its own.

mod api;
mod deploy;
mod events;
mod inspector;
mod metrics;
mod mtls;
mod observability;
mod operations;
mod process;
mod resilience;
mod saga;
mod security;
mod tracing;
