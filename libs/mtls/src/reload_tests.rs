//! Replaced certificate files reach new handshakes on both sides, over real TLS
//! connections: [`crate::incoming`] on one side, [`crate::TlsConnector`] on the other.

use crate::dev_ca::DevCa;
use crate::{Identity, TlsError, TlsSettings};
use futures::StreamExt;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tower::Service;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(label: &str) -> Dir {
    let dir = std::env::temp_dir().join(format!("sw-mtls-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Dir(dir)
}

fn load(dir: &Path, service: &str) -> Identity {
    Identity::load(&TlsSettings::in_dir(dir, service), service).unwrap().unwrap()
}

/// The leaf certificate in `<service>.pem`, as it is on disk now.
fn leaf_on_disk(dir: &Path, service: &str) -> Vec<u8> {
    let pem = std::fs::read(dir.join(format!("{service}.pem"))).unwrap();
    CertificateDer::pem_slice_iter(&pem).next().unwrap().unwrap().to_vec()
}

/// Replaces `name` in `dir` the way cert-manager or a secret volume does: a whole new
/// file renamed over it.
fn replace(dir: &Path, name: &str, contents: &[u8]) {
    let temporary = dir.join(format!(".{name}.tmp"));
    std::fs::write(&temporary, contents).unwrap();
    std::fs::rename(&temporary, dir.join(name)).unwrap();
}

/// A server of `identity` that, per connection, reports the client's leaf certificate
/// and then echoes what it reads.
fn serve(listener: tokio::net::TcpListener, identity: &Identity) -> mpsc::UnboundedReceiver<Vec<u8>> {
    let (seen, rx) = mpsc::unbounded_channel();
    let mut incoming = Box::pin(crate::incoming(listener, identity));
    tokio::spawn(async move {
        while let Some(Ok(mut tls)) = incoming.next().await {
            let client = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
            let _ = seen.send(client);
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n) = tls.read(&mut buf).await {
                    if n == 0 || tls.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    rx
}

type Client = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// Connects as `identity` to `payment` at `port`: the stream and the server's leaf.
async fn connect(identity: &Identity, port: u16) -> Result<(Client, Vec<u8>), std::io::Error> {
    let mut connector = identity.connector("payment").unwrap();
    let uri: http::Uri = format!("http://127.0.0.1:{port}").parse().unwrap();
    let io = connector.call(uri).await?.into_inner();
    let server = io.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    Ok((io, server))
}

async fn echo(stream: &mut Client, message: &[u8]) {
    stream.write_all(message).await.unwrap();
    let mut back = vec![0u8; message.len()];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(back, message);
}

#[tokio::test]
async fn new_handshakes_use_the_replaced_files_and_old_connections_stay() {
    let dir = scratch("rotate");
    let ca = DevCa::new("CA one").unwrap();
    ca.write(&dir.0, &["payment", "order"], "sagaworks").unwrap();
    let (payment, order) = (load(&dir.0, "payment"), load(&dir.0, "order"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut clients_seen = serve(listener, &payment);

    let (mut before, server) = connect(&order, port).await.unwrap();
    assert_eq!(server, leaf_on_disk(&dir.0, "payment"));
    assert_eq!(clients_seen.recv().await.unwrap(), leaf_on_disk(&dir.0, "order"));
    echo(&mut before, b"before").await;
    assert!(!payment.reload().unwrap(), "unchanged files are not loaded again");

    // A new leaf from the same CA for each side.
    let (old_payment, old_order) = (leaf_on_disk(&dir.0, "payment"), leaf_on_disk(&dir.0, "order"));
    ca.write_service(&dir.0, "payment", "sagaworks").unwrap();
    ca.write_service(&dir.0, "order", "sagaworks").unwrap();
    assert_ne!(leaf_on_disk(&dir.0, "payment"), old_payment);
    assert!(payment.reload().unwrap() && order.reload().unwrap());
    let (mut after, server) = connect(&order, port).await.unwrap();
    assert_eq!(server, leaf_on_disk(&dir.0, "payment"), "the server shows its new certificate");
    assert_eq!(clients_seen.recv().await.unwrap(), leaf_on_disk(&dir.0, "order"), "and the client its");
    assert_ne!(leaf_on_disk(&dir.0, "order"), old_order);
    echo(&mut after, b"after").await;
    echo(&mut before, b"the old connection still works").await;

    // A rotation caught half written (the new certificate, still the old key) is neither
    // loaded nor reported; once the key is written too, the pair is loaded.
    let before_rotation = payment.serial();
    let next = ca.issue("payment", "sagaworks").unwrap();
    replace(&dir.0, "payment.pem", next.cert_pem.as_bytes());
    assert!(!payment.reload().unwrap(), "half written: read again at the next poll");
    assert_eq!(payment.serial(), before_rotation);
    replace(&dir.0, "payment-key.pem", next.key_pem.as_bytes());
    assert!(payment.reload().unwrap(), "the whole pair is loaded");
    assert_ne!(payment.serial(), before_rotation);

    // Broken files keep what is in use: garbage, then a key that is not the certificate's.
    let serial = payment.serial();
    // Each is reported when a second read finds it unchanged (the first may be a
    // rotation caught half written), and once only.
    replace(&dir.0, "payment.pem", b"not a certificate");
    assert!(!payment.reload().unwrap(), "not reported at the first read");
    assert!(matches!(payment.reload(), Err(TlsError::NoCertificate { .. })));
    assert!(!payment.reload().unwrap(), "a rejected version is not tried again");
    let other = ca.issue("payment", "sagaworks").unwrap();
    replace(&dir.0, "payment.pem", other.cert_pem.as_bytes());
    assert!(!payment.reload().unwrap());
    let err = payment.reload().unwrap_err();
    assert!(err.to_string().contains("not the key of the certificate"), "{err}");
    // Another trust domain, or another service's name: refused too.
    let foreign = ca.issue("payment", "elsewhere").unwrap();
    replace(&dir.0, "payment-key.pem", foreign.key_pem.as_bytes());
    replace(&dir.0, "payment.pem", foreign.cert_pem.as_bytes());
    assert!(!payment.reload().unwrap());
    assert!(matches!(payment.reload(), Err(TlsError::NoIdentity { .. })));
    assert_eq!(payment.serial(), serial);
    let (mut still, _) = connect(&order, port).await.unwrap();
    echo(&mut still, b"served with the previous certificate").await;
    clients_seen.recv().await.unwrap();
}

#[tokio::test]
async fn a_new_ca_is_trusted_through_an_overlap_bundle() {
    let dir = scratch("new-ca");
    let (one, two) = (DevCa::new("CA one").unwrap(), DevCa::new("CA two").unwrap());
    one.write(&dir.0, &["payment", "order"], "sagaworks").unwrap();
    let (payment, order) = (load(&dir.0, "payment"), load(&dir.0, "order"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut clients_seen = serve(listener, &payment);
    let (mut before, _) = connect(&order, port).await.unwrap();
    clients_seen.recv().await.unwrap();

    // Payment's certificate from CA two before anyone trusts it: order refuses it.
    let payment_dir = scratch("new-ca-payment");
    std::fs::copy(dir.0.join("ca.pem"), payment_dir.0.join("ca.pem")).unwrap();
    two.write_service(&payment_dir.0, "payment", "sagaworks").unwrap();
    let early = load(&payment_dir.0, "payment");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let early_port = listener.local_addr().unwrap().port();
    let _early_seen = serve(listener, &early);
    assert!(connect(&order, early_port).await.is_err(), "CA two is not trusted yet");

    // Both trust both CAs, then payment moves to CA two.
    let bundle = format!("{}{}", one.ca_pem(), two.ca_pem());
    replace(&dir.0, "ca.pem", bundle.as_bytes());
    assert!(order.reload().unwrap() && payment.reload().unwrap());
    two.write_service(&dir.0, "payment", "sagaworks").unwrap();
    assert!(payment.reload().unwrap());
    let (mut after, server) = connect(&order, port).await.unwrap();
    assert_eq!(server, leaf_on_disk(&dir.0, "payment"));
    assert_eq!(clients_seen.recv().await.unwrap(), leaf_on_disk(&dir.0, "order"), "order's CA one cert");
    echo(&mut after, b"across CAs").await;
    echo(&mut before, b"old connection").await;

    // Order moves too, and CA one leaves the bundle: a CA one certificate is refused.
    two.write_service(&dir.0, "order", "sagaworks").unwrap();
    replace(&dir.0, "ca.pem", two.ca_pem().as_bytes());
    assert!(order.reload().unwrap() && payment.reload().unwrap());
    let (_, server) = connect(&order, port).await.unwrap();
    assert_eq!(server, leaf_on_disk(&dir.0, "payment"));
    clients_seen.recv().await.unwrap();
    let stale = scratch("new-ca-stale");
    one.write(&stale.0, &["order"], "sagaworks").unwrap();
    replace(&stale.0, "ca.pem", two.ca_pem().as_bytes());
    let stale_order = load(&stale.0, "order");
    let refused = match connect(&stale_order, port).await {
        Err(e) => e.to_string(),
        // TLS 1.3: the client learns of the refusal on its first read.
        Ok((mut stream, _)) => {
            let _ = stream.write_all(b"x").await;
            let mut buf = [0u8; 1];
            stream.read(&mut buf).await.map(|n| format!("read {n}")).unwrap_or_else(|e| e.to_string())
        }
    };
    assert!(
        refused.contains("UnknownCA") || refused == "read 0",
        "a CA one certificate is refused: {refused}"
    );
}

#[tokio::test]
async fn a_client_refuses_a_server_of_another_trust_domain() {
    let dir = scratch("trust-domain");
    let ca = DevCa::new("CA").unwrap();
    ca.write(&dir.0, &["order"], "sagaworks").unwrap();
    ca.write_service(&dir.0, "payment", "elsewhere").unwrap();
    let settings = TlsSettings { trust_domain: "elsewhere".into(), ..TlsSettings::in_dir(&dir.0, "payment") };
    let payment = Identity::load(&settings, "payment").unwrap().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let _seen = serve(listener, &payment);

    // The right CA and the DNS name payment, but spiffe://elsewhere/payment.
    let err = connect(&load(&dir.0, "order"), port).await.unwrap_err();
    assert!(err.to_string().contains("does not name spiffe://sagaworks/payment"), "{err}");
}
