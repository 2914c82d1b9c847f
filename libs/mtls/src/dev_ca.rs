//! A certificate authority for development and tests (rcgen): `scripts/dev-up` writes
//! one to `.dev/certs` (`sagaworks-tools dev-certs`) and the tests make one per test
//! process. Its key sits in memory or beside the certificates, unprotected: production
//! issues certificates with cert-manager or a mesh instead (docs/security.md).

use crate::spiffe_id;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::path::Path;

pub use rcgen::Error;

/// A certificate and its private key, PEM each.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A self-signed CA that issues the services' certificates ([`DevCa::issue`]), or, a CA
/// of its own, the certificates of Kafka's nodes ([`DevCa::issue_node`]).
pub struct DevCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl DevCa {
    /// A new CA whose certificate's common name is `name`.
    pub fn new(name: &str) -> Result<Self, Error> {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Ok(Self { issuer: CertifiedIssuer::self_signed(params, KeyPair::generate()?)? })
    }

    /// The CA's certificate (what every service trusts).
    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `service`: URI SAN `spiffe://<trust_domain>/<service>`, DNS SANs
    /// `service` and `localhost`, IP SAN 127.0.0.1, usable by a server and a client.
    pub fn issue(&self, service: &str, trust_domain: &str) -> Result<Issued, Error> {
        self.sign(service, Some(spiffe_id(trust_domain, service)))
    }

    /// A certificate for the host `name` outside the services' trust domain (Kafka's
    /// nodes): common name `name`, DNS SANs `name` and `localhost`, IP SAN 127.0.0.1,
    /// no SPIFFE identity, usable by a server and a client. Its key is PKCS#8.
    pub fn issue_node(&self, name: &str) -> Result<Issued, Error> {
        self.sign(name, None)
    }

    /// A certificate for `name` (common name, DNS SANs `name` and `localhost`, IP SAN
    /// 127.0.0.1) with the URI SAN `uri` if any, usable by a server and a client.
    fn sign(&self, name: &str, uri: Option<String>) -> Result<Issued, Error> {
        let mut params =
            CertificateParams::new(vec![name.to_owned(), "localhost".into(), "127.0.0.1".into()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        if let Some(uri) = uri {
            params.subject_alt_names.push(SanType::URI(uri.try_into()?));
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// Writes this CA's certificate to `dir/<name>-ca.pem` and a certificate of
    /// [`DevCa::issue_node`] for `name` to `<name>.pem` and `<name>-key.pem` (mode 0600):
    /// the files of a CA that issues `name`'s nodes only, e.g. `kafka-ca.pem`, `kafka.pem`
    /// and `kafka-key.pem` (`scripts/kafka up --secure <dir>`).
    pub fn write_nodes(&self, dir: &Path, name: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let issued = self.issue_node(name).map_err(std::io::Error::other)?;
        replace(&dir.join(format!("{name}-ca.pem")), self.ca_pem().as_bytes(), 0o644)?;
        replace(&dir.join(format!("{name}-key.pem")), issued.key_pem.as_bytes(), 0o600)?;
        replace(&dir.join(format!("{name}.pem")), issued.cert_pem.as_bytes(), 0o644)
    }

    /// Writes `ca.pem` and, per service, `<service>.pem` and `<service>-key.pem` (mode
    /// 0600) to `dir` (created), the layout [`crate::TlsSettings::in_dir`] reads.
    ///
    /// Every file is written beside its final name and renamed over it, so a service
    /// that reads the directory meanwhile sees the old file or the new one, never a
    /// truncated one.
    pub fn write(&self, dir: &Path, services: &[&str], trust_domain: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        replace(&dir.join("ca.pem"), self.ca_pem().as_bytes(), 0o644)?;
        for service in services {
            self.write_service(dir, service, trust_domain)?;
        }
        Ok(())
    }

    /// Writes `<service>.pem` and `<service>-key.pem` (mode 0600) to `dir`, which
    /// [`DevCa::write`] made, leaving `ca.pem` as it is.
    pub fn write_service(&self, dir: &Path, service: &str, trust_domain: &str) -> std::io::Result<()> {
        let issued = self.issue(service, trust_domain).map_err(std::io::Error::other)?;
        replace(&dir.join(format!("{service}-key.pem")), issued.key_pem.as_bytes(), 0o600)?;
        replace(&dir.join(format!("{service}.pem")), issued.cert_pem.as_bytes(), 0o644)
    }
}

/// Writes `contents` to a temporary file beside `path` with `mode`, then renames it
/// over `path` (atomic within one file system).
fn replace(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(&temporary)?;
    file.write_all(contents)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Identity, TlsError, TlsSettings, caller_of};

    #[test]
    fn an_issued_certificate_names_its_service_and_loads_as_its_identity() {
        let dir = std::env::temp_dir().join(format!("sw-mtls-{}", std::process::id()));
        let ca = DevCa::new("test CA").unwrap();
        ca.write(&dir, &["payment", "order"], "sagaworks").unwrap();

        let issued = ca.issue("order", "sagaworks").unwrap();
        let der =
            x509_parser::pem::Pem::iter_from_buffer(issued.cert_pem.as_bytes()).next().unwrap().unwrap();
        assert_eq!(caller_of(&der.contents, "sagaworks").as_deref(), Some("order"));
        assert_eq!(caller_of(&der.contents, "elsewhere"), None, "another trust domain");
        assert_eq!(caller_of(b"not a certificate", "sagaworks"), None);

        let payment = Identity::load(&TlsSettings::in_dir(&dir, "payment"), "payment").unwrap().unwrap();
        assert_eq!(payment.service(), "payment");
        let wrong = Identity::load(&TlsSettings::in_dir(&dir, "order"), "payment").unwrap_err();
        assert!(matches!(wrong, TlsError::WrongIdentity { .. }), "{wrong}");
        let partial = TlsSettings { key_file: String::new(), ..TlsSettings::in_dir(&dir, "order") };
        assert!(matches!(Identity::load(&partial, "order"), Err(TlsError::Partial("key_file"))));
        assert!(Identity::load(&TlsSettings::default(), "order").unwrap().is_none(), "off");

        // A later service leaves ca.pem alone (services may be reading it), keeps its
        // key private and leaves no temporary file behind.
        #[cfg(unix)]
        {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            let before = std::fs::metadata(dir.join("ca.pem")).unwrap().ino();
            ca.write_service(&dir, "inventory", "sagaworks").unwrap();
            assert_eq!(std::fs::metadata(dir.join("ca.pem")).unwrap().ino(), before);
            let mode = std::fs::metadata(dir.join("inventory-key.pem")).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let mut names: Vec<_> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_node_certificate_has_no_spiffe_identity_and_comes_with_its_own_ca_file() {
        let dir = std::env::temp_dir().join(format!("sw-mtls-nodes-{}", std::process::id()));
        let ca = DevCa::new("node CA").unwrap();
        ca.write_nodes(&dir, "kafka").unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("kafka-ca.pem")).unwrap(), ca.ca_pem());
        assert!(!dir.join("ca.pem").exists(), "the services' CA file is not this CA's");
        let pem = std::fs::read(dir.join("kafka.pem")).unwrap();
        let der = x509_parser::pem::Pem::iter_from_buffer(&pem).next().unwrap().unwrap();
        assert_eq!(caller_of(&der.contents, "sagaworks"), None, "no SPIFFE identity");
        let cert = der.parse_x509().unwrap();
        let cn = cert.subject().iter_common_name().next().and_then(|c| c.as_str().ok());
        assert_eq!(cn, Some("kafka"));
        assert!(std::fs::read_to_string(dir.join("kafka-key.pem")).unwrap().contains("BEGIN PRIVATE KEY"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
