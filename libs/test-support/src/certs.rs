//! Certificates for the services a test starts: one development CA per test process
//! ([`sagaworks_mtls::dev_ca`]), its files in a directory of the process's own, and a
//! certificate issued for each name on first use.
//!
//! [`tls`] is what a service under test gets in its `[tls]` settings. [`foreign_tls`]
//! is a certificate of another CA with the same name, for tests that a service trusts
//! only its own CA.

use sagaworks_mtls::TlsSettings;
use sagaworks_mtls::dev_ca::DevCa;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

struct Authority {
    ca: DevCa,
    dir: PathBuf,
}

impl Authority {
    fn new(label: &str) -> Self {
        let root = std::env::temp_dir().join("sagaworks-test-certs");
        remove_stale(&root);
        let dir = root.join(format!("{}-{label}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the test certificates");
        let ca = DevCa::new(&format!("sagaworks test CA ({label})")).expect("a test CA");
        ca.write(&dir, &[], "sagaworks").expect("write the test CA");
        Self { ca, dir }
    }

    fn tls(&self, service: &str) -> TlsSettings {
        assert_ne!(service, "ca", "ca.pem is the CA's certificate");
        let settings = TlsSettings::in_dir(&self.dir, service);
        if !Path::new(&settings.cert_file).exists() {
            // Not `write`: services of this process may be reading ca.pem right now.
            self.ca.write_service(&self.dir, service, "sagaworks").expect("write a test certificate");
        }
        settings
    }
}

/// Directories of test processes that are gone.
fn remove_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn authority(
    which: &'static OnceLock<Mutex<Authority>>,
    label: &str,
) -> std::sync::MutexGuard<'static, Authority> {
    which.get_or_init(|| Mutex::new(Authority::new(label))).lock().unwrap_or_else(|p| p.into_inner())
}

static OWN: OnceLock<Mutex<Authority>> = OnceLock::new();
static FOREIGN: OnceLock<Mutex<Authority>> = OnceLock::new();

/// `[tls]` of `service` (or of any other name, e.g. an identity no policy admits),
/// issued by this test process's CA.
pub fn tls(service: &str) -> TlsSettings {
    authority(&OWN, "own").tls(service)
}

/// `[tls]` of `service` issued by another CA, which no service under test trusts.
pub fn foreign_tls(service: &str) -> TlsSettings {
    authority(&FOREIGN, "foreign").tls(service)
}

/// This process's CA certificate file (what a test client trusts).
pub fn ca_file() -> String {
    authority(&OWN, "own").dir.join("ca.pem").display().to_string()
}
