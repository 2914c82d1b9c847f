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

/// A self-signed CA that issues the services' certificates.
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
        let mut params =
            CertificateParams::new(vec![service.to_owned(), "localhost".into(), "127.0.0.1".into()])?;
        params.distinguished_name.push(DnType::CommonName, service);
        params.subject_alt_names.push(SanType::URI(spiffe_id(trust_domain, service).try_into()?));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// Writes `ca.pem` and, per service, `<service>.pem` and `<service>-key.pem` (mode
    /// 0600) to `dir` (created), the layout [`crate::TlsSettings::in_dir`] reads.
    pub fn write(&self, dir: &Path, services: &[&str], trust_domain: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("ca.pem"), self.ca_pem())?;
        for service in services {
            let issued = self.issue(service, trust_domain).map_err(std::io::Error::other)?;
            std::fs::write(dir.join(format!("{service}.pem")), issued.cert_pem)?;
            write_private(&dir.join(format!("{service}-key.pem")), issued.key_pem.as_bytes())?;
        }
        Ok(())
    }
}

fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    options.open(path)?.write_all(contents)
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
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
