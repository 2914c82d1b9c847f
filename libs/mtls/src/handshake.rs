//! rustls configurations that read an [`Identity`]'s current material on every
//! handshake: the certificate this side shows ([`ResolvesServerCert`],
//! [`ResolvesClientCert`]) and the CA bundle it verifies the peer against (verifiers
//! that delegate to the current WebPKI verifiers).

use crate::Identity;
use rustls::DigitallySignedStruct;
use rustls::client::ResolvesClientCert;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DistinguishedName, ServerConfig, SignatureScheme};
use std::sync::Arc;

/// The ALPN protocol of gRPC.
const ALPN_H2: &[u8] = b"h2";

/// The current certificate and the current CA bundle of an [`Identity`], for either side
/// of a handshake.
#[derive(Clone)]
struct Current(Identity);

impl std::fmt::Debug for Current {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Current").field(&self.0.service()).finish()
    }
}

impl ResolvesServerCert for Current {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0.current().certified))
    }
}

impl ResolvesClientCert for Current {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0.current().certified))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl ClientCertVerifier for Current {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// None: a client shows its one certificate whatever the hints, and the bundle's
    /// names cannot be lent out of a value that a reload may replace.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0.current().client_verifier.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.provider().signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.provider().signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.provider().signature_verification_algorithms.supported_schemes()
    }
}

impl ServerCertVerifier for Current {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.0.current().server_verifier.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        let expected = server_name.to_str();
        let trust_domain = self.0.trust_domain();
        match crate::caller_of(end_entity, trust_domain) {
            Some(service) if service == expected => Ok(verified),
            _ => Err(rustls::Error::General(format!(
                "the server's certificate does not name {} (trust domain {trust_domain})",
                crate::spiffe_id(trust_domain, &expected)
            ))),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        ClientCertVerifier::verify_tls12_signature(self, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        ClientCertVerifier::verify_tls13_signature(self, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        ClientCertVerifier::supported_verify_schemes(self)
    }
}

impl Identity {
    /// The gRPC server's TLS: this service's current certificate, and a client
    /// certificate from the current CA bundle required of every caller. ALPN `h2`.
    pub fn server_config(&self) -> ServerConfig {
        let current = Arc::new(Current(self.clone()));
        let mut config = ServerConfig::builder_with_provider(Arc::clone(self.provider()))
            .with_safe_default_protocol_versions()
            .expect("the provider supports the default TLS versions")
            .with_client_cert_verifier(Arc::clone(&current) as Arc<dyn ClientCertVerifier>)
            .with_cert_resolver(current);
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        config
    }

    /// The TLS of this service's calls: the server's certificate must come from the
    /// current CA bundle and name the server the caller meant ([`crate::TlsConnector`]),
    /// as a DNS SAN and as the SPIFFE ID `spiffe://<trust_domain>/<server>`; this service
    /// shows its current certificate. ALPN `h2`.
    pub fn client_config(&self) -> ClientConfig {
        let current = Arc::new(Current(self.clone()));
        let mut config = ClientConfig::builder_with_provider(Arc::clone(self.provider()))
            .with_safe_default_protocol_versions()
            .expect("the provider supports the default TLS versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::clone(&current) as Arc<dyn ServerCertVerifier>)
            .with_client_cert_resolver(current);
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        config
    }
}
