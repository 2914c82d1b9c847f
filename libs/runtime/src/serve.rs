//! Running a service's servers until shutdown.

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `router` until `shutdown`, then drains in-flight requests.
pub async fn http(listener: TcpListener, router: axum::Router, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, router).with_graceful_shutdown(shutdown.cancelled_owned()).await
}

/// Serves gRPC `routes` until `shutdown`, then drains in-flight calls. Every
/// call gets a server span continuing the caller's W3C trace context.
pub async fn grpc(
    listener: TcpListener,
    routes: tonic::service::Routes,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tonic::transport::Server::builder()
        .layer(sagaworks_telemetry::grpc::ServerTraceLayer::default())
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
}
