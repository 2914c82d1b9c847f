//! Helpers for tests that talk to real infrastructure.
//!
//! * [`TestDatabase`] — a fresh, uniquely named PostgreSQL database on the
//!   local server (`SW_TEST_PG_URL`, default `postgres://postgres@127.0.0.1:5432/postgres`),
//!   dropped again when the value is dropped. Tests never share a database.
//! * [`Broker`] — Apache Kafka: the test run's shared broker, or a broker or
//!   three-node cluster of the test's own, whose nodes it may kill, stop and
//!   restart on their ports and logs (see the module).
//! * [`Running`] — a service under test on a Tokio runtime of its own, killed
//!   like a process (`kill -9`) or stopped gracefully; services plug in through [`App`].
//! * [`otlp::OtlpReceiver`] — an in-process OTLP receiver; [`jaeger::Tracing`] —
//!   the real Collector and Jaeger as processes, read back over Jaeger's API.
//! * [`certs`] — a development CA per test process: every service under test gets
//!   its certificate for mutual TLS from it.
//! * [`free_port`], [`init_logs`], [`eventually`], [`watch_runtime`].
//!
//! Nothing here skips: when Postgres or the broker binary is missing the
//! helper panics with what to install, so a test can only pass for real.

mod broker;
pub mod certs;
mod database;
pub mod jaeger;
pub mod otlp;
mod service;

pub use broker::Broker;
pub use database::TestDatabase;
pub use service::{App, Running};

use std::future::Future;
use std::time::{Duration, Instant};

/// A TCP port on 127.0.0.1 that was free a moment ago, for a server that binds it
/// later (a process of its own, a node that restarts), from below the ephemeral range
/// as `free_ports` explains.
pub fn free_port() -> u16 {
    free_ports(1)
}

/// The first of `n` consecutive ports on 127.0.0.1 that were all free a moment ago,
/// below Linux's ephemeral range (32768-60999). A port from that range, free now,
/// may become some client connection's local port before the server binds it (or
/// while a node is down), and the server could not listen on it.
pub(crate) fn free_ports(n: u16) -> u16 {
    const LOW: u16 = 20_000;
    const HIGH: u16 = 32_000;
    for _ in 0..200 {
        let span = u128::from(HIGH - LOW - n);
        let base = LOW + (uuid::Uuid::new_v4().as_u128() % span) as u16;
        if (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no {n} consecutive free ports found on 127.0.0.1 between {LOW} and {HIGH}");
}

/// Sends service logs to the test's captured output (`RUST_LOG` filters; default `warn`).
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Warns, in the test's output, whenever the current runtime could not run a
/// task for more than half a second: something blocked its thread (e.g. a
/// synchronous drop of a Kafka client). The warning names the stall; finding the culprit takes a
/// debugger (`gdb -p`, `thread apply all bt`) while it happens.
pub fn watch_runtime() {
    const TICK: Duration = Duration::from_millis(50);
    tokio::spawn(async {
        loop {
            let before = Instant::now();
            tokio::time::sleep(TICK).await;
            let late = before.elapsed().saturating_sub(TICK);
            if late > Duration::from_millis(500) {
                tracing::warn!(?late, "the test's runtime was blocked: a task held its thread");
            }
        }
    });
}

/// Polls `probe` until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
