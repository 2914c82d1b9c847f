//! The gateway's HTTP server. It is the public edge, so it bounds what one client can
//! hold (`[server]`, [`crate::config::ServerSettings`]):
//!
//! * **connections**: at most `max_connections` are served at once; the accept loop
//!   takes the next connection only when one has closed, so the rest wait in the
//!   kernel's listen backlog instead of each costing a task and buffers;
//! * **connections per peer**: at most `max_connections_per_peer` of them from one
//!   client address (an IPv6 client by its /64); one more is closed as soon as it is
//!   accepted, so one host cannot take every slot ([`peers`]);
//! * **header-read timeout**: a connection must deliver a complete request head within
//!   `header_read_timeout_ms` of opening or of its last request's end. On HTTP/1 hyper
//!   closes it (a slowloris client holds a connection by sending its headers a byte at a
//!   time). On HTTP/2 a connection with no request in flight for that long, one that
//!   sent only the preface or a header block it never finishes, gets a GOAWAY and is
//!   closed at most `http2_keep_alive_timeout_ms` later ([`activity`]). A header block
//!   left unfinished while other requests are in flight stops the connection (HTTP/2
//!   lets no other frame between its parts), so it lasts at most their
//!   `request_timeout_ms` and then this timeout;
//! * **HTTP/2 keep-alive**: a PING every `http2_keep_alive_interval_ms`; a peer that does
//!   not answer one within `http2_keep_alive_timeout_ms` is gone, and its connection is
//!   closed;
//! * **connection age**: a connection open for `max_connection_age_ms` is shut down
//!   gracefully (GOAWAY on HTTP/2, `Connection: close` on HTTP/1) and closed at most
//!   `request_timeout_ms` later, so no client holds one forever by keeping it busy;
//! * **request timeout**: a request not answered within `request_timeout_ms` gets a 504
//!   problem+json ([`crate::error::ApiError::RequestTimeout`]) and its handler is dropped;
//! * **lingering close**: a connection the server closes is drained of what the client
//!   still sends, within `linger_timeout_ms` and `linger_max_bytes` ([`linger`]), so an
//!   early answer (413 for a body over the limit) reaches a client that writes its whole
//!   body before reading, instead of a reset.
//!
//! axum's own `serve` has none of these but the request timeout, so this is its loop
//! (hyper-util's auto builder, HTTP/1 and HTTP/2, cleartext HTTP/2 included) with them,
//! and a graceful drain on shutdown.

pub mod activity;
pub mod linger;
pub mod peers;

use crate::config::ServerSettings;
use crate::error::ApiError;
use crate::ratelimit::TrustedProxies;
use activity::{Activity, Tracked};
use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::response::IntoResponse;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use peers::PeerCaps;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
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

/// The time limits of one connection's life (see the module docs).
#[derive(Debug, Clone, Copy)]
struct Lifetime {
    /// No request in flight this long: the connection is shut down.
    idle: Duration,
    /// After the idle shutdown's GOAWAY, the peer's time to close.
    idle_grace: Duration,
    /// The connection is shut down this long after it opened.
    max_age: Duration,
    /// After the age or server shutdown, the time its requests have to finish.
    drain_grace: Duration,
}

impl Lifetime {
    fn of(settings: &ServerSettings) -> Self {
        Self {
            idle: Duration::from_millis(settings.header_read_timeout_ms),
            idle_grace: Duration::from_millis(settings.http2_keep_alive_timeout_ms),
            max_age: Duration::from_millis(settings.max_connection_age_ms),
            drain_grace: Duration::from_millis(settings.request_timeout_ms),
        }
    }
}

/// hyper's builder, HTTP/1 and HTTP/2, with the limits hyper itself enforces.
fn builder(settings: &ServerSettings) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(settings.header_read_timeout_ms));
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_millis(settings.http2_keep_alive_interval_ms))
        .keep_alive_timeout(Duration::from_millis(settings.http2_keep_alive_timeout_ms));
    builder
}

/// Serves `router` on `listener` until `shutdown`, then stops accepting and waits for
/// the open connections' requests to finish (at most `request_timeout_ms`).
/// `exempt` peers (the trusted proxies) have no per-peer connection cap.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: &ServerSettings,
    exempt: TrustedProxies,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut make_service = router.into_make_service_with_connect_info::<SocketAddr>();
    let builder = builder(settings);
    let lifetime = Lifetime::of(settings);
    let linger = linger::LingerLimits {
        timeout: Duration::from_millis(settings.linger_timeout_ms),
        max_bytes: settings.linger_max_bytes,
    };
    let permits = Arc::new(Semaphore::new(settings.max_connections));
    let peers = PeerCaps::new(settings.max_connections_per_peer, exempt);
    let connections = TaskTracker::new();
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
        let Some(slot) = peers.admit(peer.ip()) else {
            tracing::debug!(%peer, "connection refused: the peer holds its max_connections_per_peer");
            continue;
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
        }
        let activity = Activity::default();
        let Ok(service) = make_service.call(peer).await;
        let service = TowerToHyperService::new(Tracked::new(service, activity.clone()));
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(linger::Lingering::new(tcp, linger)), service)
            .into_owned();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            if let Err(e) = live(connection, &activity, lifetime, &shutdown).await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop((slot, permit));
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Drives `connection` until it ends, or until it has been idle, old or asked to stop
/// for long enough: then shuts it down gracefully and, if it has not closed within the
/// grace period, drops it (which closes the socket).
async fn live<C: GracefulConnection>(
    connection: C,
    activity: &Activity,
    lifetime: Lifetime,
    shutdown: &CancellationToken,
) -> Result<(), C::Error> {
    tokio::pin!(connection);
    let grace = tokio::select! {
        ended = connection.as_mut() => return ended,
        () = activity.idle_for(lifetime.idle) => lifetime.idle_grace,
        () = tokio::time::sleep(lifetime.max_age) => lifetime.drain_grace,
        () = shutdown.cancelled() => lifetime.drain_grace,
    };
    connection.as_mut().graceful_shutdown();
    match tokio::time::timeout(grace, connection).await {
        Ok(ended) => ended,
        Err(_) => Ok(()),
    }
}
