//! Graceful shutdown: one [`CancellationToken`] per process, cancelled on
//! SIGTERM (what Kubernetes and `docker stop` send) or Ctrl-C. Servers stop
//! accepting, finish in-flight requests, background loops finish their
//! current unit of work, and telemetry is flushed last.

use tokio_util::sync::CancellationToken;

/// Returns a token that is cancelled when the process receives SIGTERM or SIGINT.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let child = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received");
        child.cancel();
    });
    token
}

async fn wait_for_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
