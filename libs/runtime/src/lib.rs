//! Plumbing every sagaworks service shares, so a service's `startup` module
//! reads as a list of what it runs rather than how.
//!
//! What a service uses:
//!
//! * [`ServiceHost`] — the servers and background tasks ([`Task`]) of a gRPC
//!   service, built from its [`HostSettings`] (the [`host_settings!`] macro
//!   writes the accessor; [`services_toml!`] is the allow-list compiled in),
//!   which refuses what production must not run ([`TestHooks`],
//!   [`NotBuiltIn`]); fails with a [`HostError`]. [`migrate_only`] is the
//!   binary's `migrate` command.
//! * [`ServiceCli`], [`ServiceCommand`] — the service binaries' command line
//!   (serve, or `migrate` and exit).
//! * [`Readiness`] — `/health/live`, `/health/ready` (runs [`Check`]s,
//!   answers with an [`Evaluation`]) and `/metrics` (refreshed by
//!   [`ScrapeHook`]s) as one axum router.
//! * [`FaultSettings`] — fault injection on the gRPC server, for tests (off
//!   by default; the cargo feature `test-hooks` builds it).
//! * [`Operator`] — who acts by hand on a saga or a dead letter.
//! * [`bind`] — a listener for a port of the settings.
//!
//! And by module:
//!
//! * [`db`] — the connection pool and start-up migrations.
//! * [`idempotency`] — at-most-once execution of mutating calls per key.
//! * [`metrics`] — the process-wide Prometheus recorder.
//! * [`shutdown`] — a cancellation token fired by SIGTERM or Ctrl-C.
//! * [`watchdog`] — logs and counts runtime stalls (a task blocking a worker thread).

mod cli;
pub mod db;
mod fault;
mod health;
mod host;
pub mod idempotency;
pub mod metrics;
mod operator;
mod serve;
pub mod shutdown;
pub mod watchdog;

pub use cli::{ServiceCli, ServiceCommand};
pub use fault::FaultSettings;
pub use health::{Check, Evaluation, Readiness, ScrapeHook};
pub use host::{
    HostError, HostSettings, NotBuiltIn, ServiceHost, Task, TaskError, TestHook, TestHooks, migrate_only,
};
pub use operator::Operator;

use sagaworks_config::ListenSettings;
use tokio::net::TcpListener;

/// Binds a listener (port 0 picks a free one; read it back with `local_addr`).
pub async fn bind(settings: &ListenSettings) -> std::io::Result<TcpListener> {
    TcpListener::bind(settings.address()).await
}
