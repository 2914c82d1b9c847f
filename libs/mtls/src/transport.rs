//! Mutual TLS connections for tonic, set up here rather than by tonic so that each
//! handshake uses an [`Identity`]'s current material: [`incoming`] for a gRPC server,
//! [`TlsConnector`] for a client channel.

use crate::Identity;
use futures::Stream;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// How long a peer has to complete its TLS handshake.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How many finished handshakes may wait for the server to take them.
const BACKLOG: usize = 64;

/// The TLS connections accepted on `listener`, for tonic's `serve_with_incoming*`: each
/// TCP connection gets `TCP_NODELAY` and its handshake in a task of its own (bounded by
/// `HANDSHAKE_TIMEOUT`), so a slow or failing peer holds up no one else. A failed
/// handshake is logged at debug level and dropped. The peer's certificates reach the
/// requests as tonic's `TlsConnectInfo`. Accepting stops when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    identity: &Identity,
) -> impl Stream<Item = Result<tokio_rustls::server::TlsStream<TcpStream>, std::io::Error>> + Send + 'static {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(identity.server_config()));
    let (tx, mut rx) = tokio::sync::mpsc::channel(BACKLOG);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => break,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, most likely: give the server time to close some.
                    tracing::warn!(error = %e, "gRPC server: cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
            }
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(tls).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "gRPC server: TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "gRPC server: TLS handshake timed out"),
                }
            });
        }
    });
    futures::stream::poll_fn(move |cx: &mut Context<'_>| rx.poll_recv(cx).map(|tls| tls.map(Ok)))
}

/// tonic's connector (`Endpoint::connect_with_connector_lazy`) for calls to one
/// downstream: TCP (with `TCP_NODELAY`) to the URI's host and port, then TLS with the
/// identity's current material, requiring the server's certificate to name
/// `downstream` (a DNS SAN), whatever address the URI has.
///
/// tonic refuses an `https` URI with a connector of its own: the endpoint's URI is
/// `http://`, and TLS is this connector's.
#[derive(Clone)]
pub struct TlsConnector {
    tls: tokio_rustls::TlsConnector,
    downstream: ServerName<'static>,
}

impl Identity {
    /// The connector of this service's calls to `downstream`.
    pub fn connector(&self, downstream: &str) -> Result<TlsConnector, crate::TlsError> {
        let name = ServerName::try_from(downstream.to_owned())
            .map_err(|_| crate::TlsError::ServerName(downstream.to_owned()))?;
        Ok(TlsConnector {
            tls: tokio_rustls::TlsConnector::from(Arc::new(self.client_config())),
            downstream: name,
        })
    }
}

impl tower::Service<http::Uri> for TlsConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let (tls, downstream) = (self.tls.clone(), self.downstream.clone());
        Box::pin(async move {
            let host = uri.host().ok_or_else(|| std::io::Error::other(format!("{uri}: no host")))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(443);
            let tcp = TcpStream::connect((host, port)).await?;
            tcp.set_nodelay(true)?;
            let stream =
                tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connect(downstream, tcp)).await.map_err(
                    |_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out"),
                )??;
            Ok(TokioIo::new(stream))
        })
    }
}
