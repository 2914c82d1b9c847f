//! Running a service's servers until shutdown.
//!
//! Both servers set `TCP_NODELAY` on every accepted connection. tonic sets it
//! only on listeners it binds itself, and axum never does; without it, an
//! answer written in more than one piece (HTTP/2 headers, data and trailers)
//! waits under Nagle's algorithm for the caller's delayed ACK, about 40 ms on
//! Linux, on every call.

use axum::serve::{Listener, ListenerExt};
use sagaworks_mtls::{AuthorizeLayer, Identity, Policy};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;

/// Serves `router` until `shutdown`, then drains in-flight requests.
pub(crate) async fn http(
    listener: TcpListener,
    router: axum::Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(http_incoming(listener), router).with_graceful_shutdown(shutdown.cancelled_owned()).await
}

/// Serves gRPC `routes` until `shutdown`, then drains in-flight calls. Every
/// call gets a server span continuing the caller's W3C trace context, and is
/// counted in `rpc_server_duration_seconds{service = name}`.
///
/// With `tls`, the port speaks mutual TLS only (a caller without a certificate of the
/// CA does not get past the handshake; [`sagaworks_mtls::incoming`]), and every call is
/// checked against `policy` (the caller's identity may call that method) before it
/// reaches `routes`. Each handshake uses the identity's certificate and CA bundle of the
/// moment ([`Identity::watch`] reloads them).
pub(crate) async fn grpc(
    name: &'static str,
    listener: TcpListener,
    routes: tonic::service::Routes,
    tls: Option<(&Identity, Policy)>,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let authorize =
        tls.as_ref().map(|(identity, policy)| AuthorizeLayer::new(policy.clone(), identity.trust_domain()));
    let router = tonic::transport::Server::builder()
        .layer(sagaworks_telemetry::grpc::ServerTraceLayer::new(name))
        .layer(tower::util::option_layer(authorize))
        .add_routes(routes);
    match tls {
        Some((identity, _)) => {
            let incoming = sagaworks_mtls::incoming(listener, identity);
            router.serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned()).await
        }
        None => {
            router.serve_with_incoming_shutdown(grpc_incoming(listener), shutdown.cancelled_owned()).await
        }
    }
}

/// The gRPC server's connections: `TCP_NODELAY` set on each.
fn grpc_incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// The HTTP server's connections: `TCP_NODELAY` set on each.
fn http_incoming(
    listener: TcpListener,
) -> impl Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    async fn bound() -> (TcpListener, std::net::SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (listener, addr)
    }

    #[tokio::test]
    async fn grpc_connections_are_accepted_with_nodelay() {
        let (listener, addr) = bound().await;
        let mut incoming = grpc_incoming(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.expect("a connection").expect("accepted");
        assert!(accepted.nodelay().unwrap(), "Nagle is still on");
    }

    #[tokio::test]
    async fn http_connections_are_accepted_with_nodelay() {
        let (listener, addr) = bound().await;
        let mut incoming = http_incoming(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = incoming.accept().await;
        assert!(accepted.nodelay().unwrap(), "Nagle is still on");
    }
}
