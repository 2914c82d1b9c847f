//! `[tls]`: where a service finds its certificate.

use serde::{Deserialize, Serialize};

/// The files of a service's TLS identity, PEM each. All three empty: TLS off
/// (development only: production refuses to start without it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct TlsSettings {
    /// The CA that signs every service's certificate: the only one trusted, both
    /// for the servers this service calls and for the clients that call it.
    pub ca_file: String,
    /// This service's certificate (its chain, leaf first), with the URI SAN
    /// `spiffe://<trust_domain>/<service>` and the service's name as a DNS SAN.
    pub cert_file: String,
    /// Its private key.
    pub key_file: String,
    /// The SPIFFE trust domain of the identities (`spiffe://<trust_domain>/<service>`).
    pub trust_domain: String,
    /// How often the three files are read again, in milliseconds: when one changed (a
    /// renewed certificate, a CA bundle with a new CA), new connections use them. 0:
    /// read at start-up only.
    pub reload_interval_ms: u64,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            ca_file: String::new(),
            cert_file: String::new(),
            key_file: String::new(),
            trust_domain: "sagaworks".into(),
            reload_interval_ms: 30_000,
        }
    }
}

impl TlsSettings {
    /// The files of `dir` as the dev CA writes them: `ca.pem`, `<service>.pem`,
    /// `<service>-key.pem`.
    pub fn in_dir(dir: &std::path::Path, service: &str) -> Self {
        let file = |name: String| dir.join(name).display().to_string();
        Self {
            ca_file: file("ca.pem".into()),
            cert_file: file(format!("{service}.pem")),
            key_file: file(format!("{service}-key.pem")),
            ..Default::default()
        }
    }

    /// Whether TLS is asked for: any of the three files named (`Identity::load` then
    /// requires all three).
    pub fn enabled(&self) -> bool {
        !self.ca_file.is_empty() || !self.cert_file.is_empty() || !self.key_file.is_empty()
    }
}
