//! The gateway's HTTP server. It is the public edge, so it bounds what one client can
//! hold (`[server]`, [`crate::config::ServerSettings`]):
//!
//! * **connections**: at most `max_connections` are served at once; the accept loop
//!   takes the next connection only when one has closed, so the rest wait in the
//!   kernel's listen backlog instead of each costing a task and buffers;
//! * **header-read timeout**: an HTTP/1 connection that does not send a request's
//!   headers within `header_read_timeout_ms` is closed (a slowloris client holds a
//!   connection by sending its headers a byte at a time);
//! * **request timeout**: a request not answered within `request_timeout_ms` gets a 504
//!   problem+json ([`crate::error::ApiError::RequestTimeout`]) and its handler is dropped;
//! * **lingering close**: a connection the server closes is drained of what the client
//!   still sends, within `linger_timeout_ms` and `linger_max_bytes` ([`linger`]), so an
//!   early answer (413 for a body over the limit) reaches a client that writes its whole
//!   body before reading, instead of a reset.
//!
//! axum's own `serve` has neither the cap nor the header timeout, so this is its loop
//! (hyper-util's auto builder, HTTP/1 and HTTP/2) with both, and a graceful drain on
//! shutdown.

pub mod linger;

use crate::config::ServerSettings;
use crate::error::ApiError;
use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::response::IntoResponse;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder};

/// `router` with the request timeout of `settings`.
pub fn with_request_timeout(router: Router, settings: &ServerSettings) -> Router {
    let after = Duration::from_millis(settings.request_timeout_ms);
    router.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(move |_: tower::BoxError| async move {
                ApiError::RequestTimeout(after).into_response()
            }))
            .layer(tower::timeout::TimeoutLayer::new(after)),
    )
}

/// Serves `router` on `listener` until `shutdown`, then stops accepting and waits for
/// the open connections' requests to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: &ServerSettings,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut make_service = router.into_make_service_with_connect_info::<SocketAddr>();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(settings.header_read_timeout_ms));
    let linger = linger::LingerLimits {
        timeout: Duration::from_millis(settings.linger_timeout_ms),
        max_bytes: settings.linger_max_bytes,
    };
    let permits = Arc::new(Semaphore::new(settings.max_connections));
    let graceful = GracefulShutdown::new();
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => permit.expect("the semaphore is never closed"),
            () = shutdown.cancelled() => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
        }
        let Ok(service) = make_service.call(peer).await;
        let connection = builder.serve_connection_with_upgrades(
            TokioIo::new(linger::Lingering::new(tcp, linger)),
            TowerToHyperService::new(service),
        );
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
