//! A service's TLS identity: its certificate and key and the CA it trusts.

use crate::{TlsError, TlsSettings};
use tonic::transport::{Certificate, ClientTlsConfig, ServerTlsConfig};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The identity of `service` in `trust_domain`: `spiffe://<trust_domain>/<service>`.
pub fn spiffe_id(trust_domain: &str, service: &str) -> String {
    format!("spiffe://{trust_domain}/{service}")
}

/// The service a DER certificate names in `trust_domain`: the path of its first URI SAN
/// `spiffe://<trust_domain>/<service>` whose service is a name of services.toml's form
/// (lower-case letters and digits). `None` for anything else, an unparseable
/// certificate included. Only meaningful for a certificate the TLS handshake verified.
pub fn caller_of(der: &[u8], trust_domain: &str) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let prefix = format!("spiffe://{trust_domain}/");
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|name| match name {
        GeneralName::URI(uri) => {
            let service = uri.strip_prefix(&prefix)?;
            let valid = service.starts_with(|c: char| c.is_ascii_lowercase())
                && service.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
            valid.then(|| service.to_owned())
        }
        _ => None,
    })
}

/// A service's certificate, key and CA, loaded from [`TlsSettings`].
#[derive(Clone)]
pub struct Identity {
    service: String,
    trust_domain: String,
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("service", &self.service)
            .field("trust_domain", &self.trust_domain)
            .finish_non_exhaustive()
    }
}

fn read(path: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

impl Identity {
    /// Loads the files of `settings` for `service`; `None` when TLS is off. Fails when
    /// only some files are named, one cannot be read, or the certificate does not name
    /// `service` (a certificate mounted for the wrong service).
    pub fn load(settings: &TlsSettings, service: &str) -> Result<Option<Self>, TlsError> {
        if !settings.enabled() {
            return Ok(None);
        }
        for (key, value) in [
            ("ca_file", &settings.ca_file),
            ("cert_file", &settings.cert_file),
            ("key_file", &settings.key_file),
        ] {
            if value.is_empty() {
                return Err(TlsError::Partial(key));
            }
        }
        let cert = read(&settings.cert_file)?;
        let leaf = x509_parser::pem::Pem::iter_from_buffer(&cert)
            .next()
            .and_then(Result::ok)
            .ok_or_else(|| TlsError::NoCertificate { path: settings.cert_file.clone() })?;
        let named =
            caller_of(&leaf.contents, &settings.trust_domain).ok_or_else(|| TlsError::NoIdentity {
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
        Ok(Some(Self {
            service: service.to_owned(),
            trust_domain: settings.trust_domain.clone(),
            ca: read(&settings.ca_file)?,
            cert,
            key: read(&settings.key_file)?,
        }))
    }

    pub fn service(&self) -> &str {
        &self.service
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    fn own(&self) -> tonic::transport::Identity {
        tonic::transport::Identity::from_pem(&self.cert, &self.key)
    }

    /// The gRPC server's TLS: this service's certificate, and a client certificate
    /// signed by the CA required of every caller.
    pub fn server_tls(&self) -> ServerTlsConfig {
        ServerTlsConfig::new().identity(self.own()).client_ca_root(Certificate::from_pem(&self.ca))
    }

    /// TLS of the calls to `downstream`: the server must show a certificate from the CA
    /// for the DNS name `downstream` (whatever address the URL has), and this service
    /// shows its own.
    pub fn client_tls(&self, downstream: &str) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(self.own())
            .domain_name(downstream)
    }
}
