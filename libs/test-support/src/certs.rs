//! Certificates for the services a test starts: one development CA per test process
//! ([`sagaworks_mtls::dev_ca`]), its files in a directory of the process's own, and a
//! certificate issued for each name on first use.
//!
//! [`tls`] is what a service under test gets in its `[tls]` settings. [`foreign_tls`]
//! is a certificate of another CA with the same name, for tests that a service trusts
//! only its own CA. [`scratch_dir`] and [`issue_in`] give a test files of its own to
//! replace while services run (certificate rotation); [`server_leaf`] is the certificate
//! a server shows to a new connection.
//!
//! [`kafka_dir`] holds the certificate of the Kafka nodes a test starts, from a Kafka CA
//! of the process's own, apart from the services' CA (as `sagaworks-tools dev-certs`
//! issues them).

use sagaworks_mtls::TlsSettings;
pub use sagaworks_mtls::dev_ca::DevCa;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use tower::Service;

struct Authority {
    ca: DevCa,
    dir: PathBuf,
}

/// A new directory `<pid>-<label>` for this process's certificates (those of processes
/// that are gone are removed first).
fn process_dir(label: &str) -> PathBuf {
    let root = std::env::temp_dir().join("sagaworks-test-certs");
    remove_stale(&root);
    let dir = root.join(format!("{}-{label}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the test certificates");
    dir
}

impl Authority {
    fn new(label: &str) -> Self {
        let dir = process_dir(label);
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

static KAFKA: OnceLock<PathBuf> = OnceLock::new();

/// The directory `scripts/kafka up --secure` reads for the Kafka nodes this process starts:
/// `kafka-ca.pem` (this process's Kafka CA, which no service certificate comes from; what
/// the controller listener and Kafka's clients trust), `kafka.pem` and `kafka-key.pem`
/// (CN=kafka, the nodes' own).
pub fn kafka_dir() -> PathBuf {
    KAFKA
        .get_or_init(|| {
            let dir = process_dir("kafka");
            let ca = DevCa::new("sagaworks test Kafka CA").expect("a test Kafka CA");
            ca.write_nodes(&dir, "kafka").expect("write the Kafka nodes' certificate");
            dir
        })
        .clone()
}

/// This process's CA certificate file (what a test client trusts).
pub fn ca_file() -> String {
    authority(&OWN, "own").dir.join("ca.pem").display().to_string()
}

/// A new directory of the calling test's own holding a copy of this process's CA
/// certificate as `ca.pem`, for [`issue_in`]; removed with the process's others.
pub fn scratch_dir(label: &str) -> PathBuf {
    let own = authority(&OWN, "own");
    let dir =
        own.dir.with_file_name(format!("{}-{label}-{}", std::process::id(), uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("a directory for the test's certificates");
    std::fs::copy(own.dir.join("ca.pem"), dir.join("ca.pem")).expect("copy the test CA");
    dir
}

/// `[tls]` of `service` with its files in `dir` ([`scratch_dir`]), a new certificate
/// issued by this process's CA each time, each file replaced by a rename (as
/// cert-manager or a secret volume replaces it). `ca.pem` stays as it is.
pub fn issue_in(dir: &Path, service: &str) -> TlsSettings {
    issue_in_domain(dir, service, "sagaworks")
}

/// [`issue_in`] with the identity `spiffe://<trust_domain>/<service>`: a certificate of
/// the right CA from another deployment (`trust_domain` set to match, so it loads).
pub fn issue_in_domain(dir: &Path, service: &str, trust_domain: &str) -> TlsSettings {
    authority(&OWN, "own").ca.write_service(dir, service, trust_domain).expect("write a test certificate");
    TlsSettings { trust_domain: trust_domain.into(), ..TlsSettings::in_dir(dir, service) }
}

/// The leaf certificate (DER) that the server at 127.0.0.1:`port` shows to a new TLS
/// connection made as `tls`'s identity `caller` to `downstream`.
pub async fn server_leaf(tls: &TlsSettings, caller: &str, downstream: &str, port: u16) -> Vec<u8> {
    let identity = sagaworks_mtls::Identity::load(tls, caller)
        .expect("the client certificate loads")
        .expect("TLS is configured");
    let uri: http::Uri = format!("http://127.0.0.1:{port}").parse().expect("a URI");
    let io = identity
        .connector(downstream)
        .expect("a connector")
        .call(uri)
        .await
        .unwrap_or_else(|e| panic!("{caller} connects to {downstream} on port {port}: {e}"));
    let (_, session) = io.inner().get_ref();
    session.peer_certificates().expect("the server's certificates")[0].to_vec()
}

/// The leaf certificate (DER) in the PEM file `path`.
pub fn leaf_in(path: &str) -> Vec<u8> {
    let pem = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let leaf = x509_parser::pem::Pem::iter_from_buffer(&pem).next().and_then(Result::ok);
    leaf.unwrap_or_else(|| panic!("{path}: no PEM certificate")).contents
}
