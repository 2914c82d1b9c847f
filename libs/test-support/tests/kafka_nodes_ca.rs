//! The Kafka nodes' certificate (CN=kafka, a super user on their controller listener) comes
//! from a Kafka CA of their own: the controller listener admits the nodes and refuses a
//! certificate named CN=kafka from the services' CA; Kafka's clients verify the broker
//! with the Kafka CA, which the services' CA cannot stand in for.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sagaworks_test_support::{Broker, certs};
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Kafka's ApiVersions request (key 18, version 0) with correlation id `id`, framed.
fn api_versions_request(id: i32) -> Vec<u8> {
    let client_id = b"sw-test";
    let mut body = Vec::new();
    body.extend_from_slice(&18i16.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&id.to_be_bytes());
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    let mut framed = (body.len() as i32).to_be_bytes().to_vec();
    framed.extend(body);
    framed
}

fn roots(ca_file: &str) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).unwrap_or_else(|e| panic!("{ca_file}: {e}")) {
        roots.add(cert.expect("a CA certificate")).expect("a usable CA certificate");
    }
    roots
}

fn builder() -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier> {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
}

/// An ApiVersions round trip over TLS to `address`, which must show a certificate of
/// `ca_file`, as the holder of `cert_file` and `key_file` (`None`: no client certificate):
/// the response's correlation id, or why there is none.
async fn api_versions(
    address: &str,
    ca_file: &str,
    client: Option<(&Path, &Path)>,
) -> Result<i32, std::io::Error> {
    let config = match client {
        Some((cert_file, key_file)) => {
            let chain = CertificateDer::pem_file_iter(cert_file)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .unwrap_or_else(|e| panic!("{}: {e}", cert_file.display()));
            let key = PrivateKeyDer::from_pem_file(key_file)
                .unwrap_or_else(|e| panic!("{}: {e}", key_file.display()));
            builder().with_root_certificates(roots(ca_file)).with_client_auth_cert(chain, key)
        }
        None => Ok(builder().with_root_certificates(roots(ca_file)).with_no_client_auth()),
    }
    .expect("a TLS client configuration");
    let tcp = tokio::net::TcpStream::connect(address).await?;
    let server = ServerName::try_from("127.0.0.1").expect("a server name");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(server, tcp).await?;
    tls.write_all(&api_versions_request(7)).await?;
    tls.flush().await?;
    // TLS 1.3: the server judges the client's certificate after the client's handshake is
    // done, so a refusal shows here, as an alert or a closed connection.
    let size = tls.read_i32().await?;
    let id = tls.read_i32().await?;
    let mut rest = vec![0; usize::try_from(size - 4).expect("a response size")];
    tls.read_exact(&mut rest).await?;
    Ok(id)
}

#[tokio::test]
async fn the_controller_listener_admits_the_nodes_and_not_a_cn_kafka_of_the_services_ca() {
    let broker = Broker::private().await;
    let controller = broker.controller_address(1);
    let kafka_ca = broker.kafka_ca_file().to_owned();

    // The nodes' own certificate (they run: the broker started through this listener).
    let nodes = certs::kafka_dir();
    let answered =
        api_versions(&controller, &kafka_ca, Some((&nodes.join("kafka.pem"), &nodes.join("kafka-key.pem"))))
            .await
            .expect("the nodes' certificate passes the controller listener");
    assert_eq!(answered, 7, "the response to the request sent");

    // CN=kafka issued by the services' CA (the one every service's certificate comes from).
    let forged = certs::tls("kafka");
    let refused = api_versions(
        &controller,
        &kafka_ca,
        Some((Path::new(&forged.cert_file), Path::new(&forged.key_file))),
    )
    .await
    .expect_err("a CN=kafka certificate of the services' CA must not pass the controller listener");
    assert!(
        matches!(
            refused.kind(),
            std::io::ErrorKind::InvalidData
                | std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
        ),
        "refused in the TLS handshake, not otherwise: {refused:?}"
    );
    // No client certificate at all: refused too.
    api_versions(&controller, &kafka_ca, None)
        .await
        .expect_err("the controller listener requires a client certificate");
}

#[tokio::test]
async fn kafka_clients_verify_the_broker_with_the_kafka_ca_and_not_the_services_ca() {
    let broker = Broker::private().await;
    let client_listener = broker.node_address(1);
    let connect = |ca_file: String| {
        let address = client_listener.clone();
        async move {
            let config = builder().with_root_certificates(roots(&ca_file)).with_no_client_auth();
            let tcp = tokio::net::TcpStream::connect(&address).await.expect("the client listener");
            let server = ServerName::try_from("127.0.0.1").expect("a server name");
            tokio_rustls::TlsConnector::from(Arc::new(config)).connect(server, tcp).await.map(drop)
        }
    };
    connect(broker.kafka_ca_file().to_owned()).await.expect("the broker's certificate is of the Kafka CA");
    let refused =
        connect(certs::ca_file()).await.expect_err("the services' CA does not vouch for the broker");
    assert!(refused.to_string().contains("UnknownIssuer"), "{refused}");
}
