//! SPIFFE identities: `spiffe://<trust_domain>/<service>`, written into a service's
//! certificate and read back from a peer's.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The identity of `service` in `trust_domain`: `spiffe://<trust_domain>/<service>`.
pub(crate) fn spiffe_id(trust_domain: &str, service: &str) -> String {
    format!("spiffe://{trust_domain}/{service}")
}

/// The service a DER certificate names in `trust_domain`: the path of its first URI SAN
/// `spiffe://<trust_domain>/<service>` whose service is a name of services.toml's form
/// (lower-case letters and digits). `None` for anything else, an unparseable
/// certificate included. Only meaningful for a certificate the TLS handshake verified.
pub(crate) fn caller_of(der: &[u8], trust_domain: &str) -> Option<String> {
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
