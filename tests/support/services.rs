//! `services.toml` (the repository root): the one list of services, which the scripts
//! (`scripts/lib/services.sh`), `scripts/generate`, the deploy checks (`deploy/tidy`) and these tests
//! read. Its comments say what each field means; `deploy/test_deploy.py` checks that it is
//! well formed and names exactly the directories under `services/`.

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicesToml {
    pub broker: Broker,
    /// In file (start) order.
    #[serde(rename = "service")]
    pub services: Vec<ServiceEntry>,
}

/// `[broker]`: the Kafka-protocol broker.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Broker {
    pub name: String,
    pub port: u16,
}

/// One `[[service]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceEntry {
    pub name: String,
    pub kind: Kind,
    pub http_port: u16,
    pub grpc_port: Option<u16>,
    pub database: Option<Database>,
    #[serde(default)]
    pub topics: Vec<String>,
    /// The aggregates whose topics its consumer reads.
    #[serde(default)]
    pub consumes: Vec<String>,
    /// The consumer groups it uses (its ACLs name exactly these).
    #[serde(default)]
    pub groups: Vec<String>,
    /// Hosts the dead-letter operations (reads every `.dlq` topic, replays onto any topic).
    #[serde(default)]
    pub operates_dead_letters: bool,
    #[serde(default)]
    pub calls: Vec<String>,
    /// Per service it calls, the gRPC methods it calls (the callee's allow-list).
    #[serde(default)]
    pub rpcs: std::collections::BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Backend,
    Gateway,
}

/// The database a service owns: `<prefix>_<suffix>`, logged in to as `role`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Database {
    pub suffix: String,
    pub role: String,
}

impl ServicesToml {
    /// `<root>/services.toml`; panics when it is missing or malformed.
    pub fn read(root: &Path) -> Self {
        let path = root.join("services.toml");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// This workspace's file.
    pub fn workspace() -> Self {
        Self::read(&workspace_root())
    }

    pub fn get(&self, name: &str) -> Option<&ServiceEntry> {
        self.services.iter().find(|s| s.name == name)
    }

    /// The services that own a database, in file order.
    pub fn with_database(&self) -> impl Iterator<Item = (&ServiceEntry, &Database)> {
        self.services.iter().filter_map(|s| s.database.as_ref().map(|d| (s, d)))
    }
}

/// The workspace root (the parent of `tests/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}
