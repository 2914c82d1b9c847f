//! The files of a [`crate::TlsSettings`] read and checked, and turned into what rustls
//! needs: this service's certified key, and verifiers that trust the CA bundle.

use crate::{TlsError, TlsSettings, caller_of};
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;
use std::sync::Arc;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The bytes of the three files, as read.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Files {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub ca: Vec<u8>,
}

fn read(path: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

impl Files {
    /// Reads the files `settings` names (all three must be set).
    pub fn read(settings: &TlsSettings) -> Result<Self, TlsError> {
        Ok(Self {
            cert: read(&settings.cert_file)?,
            key: read(&settings.key_file)?,
            ca: read(&settings.ca_file)?,
        })
    }
}

/// A loaded identity: what every handshake made while it is current uses.
pub(crate) struct Material {
    pub files: Files,
    pub certified: Arc<CertifiedKey>,
    pub client_verifier: Arc<dyn ClientCertVerifier>,
    pub server_verifier: Arc<WebPkiServerVerifier>,
    /// The leaf's serial number (hex), for logs.
    pub serial: String,
    /// The leaf's `notAfter`, seconds since the epoch.
    pub not_after: i64,
}

impl Material {
    /// Parses `files` as the identity of `service`: the certificate chain (leaf first)
    /// must name `service` in `settings.trust_domain`, the key must be the leaf's, and
    /// the CA bundle must hold at least one certificate, every one of them usable as a
    /// trust anchor.
    pub fn parse(
        files: Files,
        settings: &TlsSettings,
        service: &str,
        provider: &Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let chain = certificates(&files.cert, &settings.cert_file)?;
        let leaf = &chain[0];
        let (serial, not_after) = leaf_facts(leaf, &settings.cert_file)?;
        let named = caller_of(leaf, &settings.trust_domain).ok_or_else(|| TlsError::NoIdentity {
            path: settings.cert_file.clone(),
            trust_domain: settings.trust_domain.clone(),
        })?;
        if named != service {
            return Err(TlsError::WrongIdentity {
                path: settings.cert_file.clone(),
                found: named,
                expected: service.to_owned(),
            });
        }
        let key = PrivateKeyDer::from_pem_slice(&files.key).map_err(|e| TlsError::Parse {
            path: settings.key_file.clone(),
            reason: format!("no PEM private key ({e})"),
        })?;
        let certified = CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::Parse {
            path: settings.key_file.clone(),
            reason: format!("not the key of the certificate in {} ({e})", settings.cert_file),
        })?;
        let roots = Arc::new(roots(&files.ca, &settings.ca_file)?);
        let invalid_ca = |e: rustls::server::VerifierBuilderError| TlsError::Parse {
            path: settings.ca_file.clone(),
            reason: e.to_string(),
        };
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(provider))
                .build()
                .map_err(invalid_ca)?;
        let server_verifier = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(provider))
            .build()
            .map_err(invalid_ca)?;
        Ok(Self {
            files,
            certified: Arc::new(certified),
            client_verifier,
            server_verifier,
            serial,
            not_after,
        })
    }
}

/// The PEM certificates in `pem`, at least one.
fn certificates(pem: &[u8], path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Parse { path: path.to_owned(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path.to_owned() });
    }
    Ok(certs)
}

/// The CA bundle: every certificate in it a trust anchor (several while a CA is being
/// replaced).
fn roots(pem: &[u8], path: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(pem, path)? {
        roots.add(cert).map_err(|e| TlsError::Parse { path: path.to_owned(), reason: e.to_string() })?;
    }
    Ok(roots)
}

fn leaf_facts(leaf: &CertificateDer<'_>, path: &str) -> Result<(String, i64), TlsError> {
    let (_, cert) = X509Certificate::from_der(leaf)
        .map_err(|e| TlsError::Parse { path: path.to_owned(), reason: e.to_string() })?;
    Ok((cert.raw_serial_as_string(), cert.validity().not_after.timestamp()))
}
