//! Plumbing every sagaworks service shares, so a service's `startup` module
//! reads as a list of what it runs rather than how.
//!
//! * [`cli`] — the service binaries' command line (serve, or `migrate` and exit).
//! * [`host`] — [`host::ServiceHost`], the servers and background tasks of a gRPC service.
//! * [`db`] — the connection pool and start-up migrations.
//! * [`fault`] — fault injection on the gRPC server, for tests (off by default).
//! * [`health`] — `/health/live`, `/health/ready` (runs [`health::Check`]s) and
//!   `/metrics` as one axum router.
//! * [`metrics`] — the process-wide Prometheus recorder.
//! * [`operator`] — [`operator::Operator`], who acts by hand on a saga or a dead letter.
//! * [`serve`] — HTTP and gRPC servers with graceful shutdown.
//! * [`shutdown`] — a cancellation token fired by SIGTERM or Ctrl-C.
//! * [`idempotency`] — at-most-once execution of mutating calls per key.
//! * [`watchdog`] — logs and counts runtime stalls (a task blocking a worker thread).

pub mod cli;
pub mod db;
pub mod fault;
pub mod health;
pub mod host;
pub mod idempotency;
pub mod metrics;
pub mod operator;
pub mod serve;
pub mod shutdown;
pub mod watchdog;

use sagaworks_config::ListenSettings;
use tokio::net::TcpListener;

/// Binds a listener (port 0 picks a free one; read it back with `local_addr`).
pub async fn bind(settings: &ListenSettings) -> std::io::Result<TcpListener> {
    TcpListener::bind(settings.address()).await
}
