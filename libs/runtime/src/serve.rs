//! Running a service's servers until shutdown.

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `router` until `shutdown`, then drains in-flight requests.
///
/// Accepted connections get `TCP_NODELAY` (as on the gRPC side): a response
/// written in more than one piece must not wait for the client's delayed ACK.
pub async fn http(listener: TcpListener, router: axum::Router, shutdown: CancellationToken) -> std::io::Result<()> {
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
        }
    });
    axum::serve(listener, router).with_graceful_shutdown(shutdown.cancelled_owned()).await
}

/// Serves gRPC `routes` until `shutdown`, then drains in-flight calls. Every
/// call gets a server span continuing the caller's W3C trace context.
///
/// Accepted connections get `TCP_NODELAY`. tonic sets it only on listeners it
/// binds itself; without it, an answer's HTTP/2 frames (headers, data,
/// trailers) are held back by Nagle's algorithm until the caller's delayed
/// ACK, about 40 ms on Linux, on every call.
pub async fn grpc(
    listener: TcpListener,
    routes: tonic::service::Routes,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .layer(sagaworks_telemetry::grpc::ServerTraceLayer::default())
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
}
