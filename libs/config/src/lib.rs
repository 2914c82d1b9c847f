//! Layered configuration for every sagaworks service.
//!
//! A service's settings are one serde struct whose `Default` is a working local
//! set-up. On top of the defaults come, in order:
//!
//! 1. a TOML file, named by `APP_CONFIG_FILE` (or passed to [`load_from`]);
//! 2. environment variables prefixed `APP_`, with `__` between nested keys:
//!    `APP_DATABASE__URL=postgres://...` sets `database.url`,
//!    `APP_GRPC__PORT=0` sets `grpc.port`.
//!
//! The building blocks shared by the services ([`DatabaseSettings`],
//! [`KafkaSettings`], [`ListenSettings`], [`TelemetrySettings`]) live here so that
//! compose files, k8s manifests and the services agree on one set of names.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The environment variable that names the optional config file.
pub const CONFIG_FILE_ENV: &str = "APP_CONFIG_FILE";
/// Prefix of every override variable (`APP_` + key path joined by `__`).
pub const ENV_PREFIX: &str = "APP";
/// Separator between nested keys in override variables.
pub const ENV_SEPARATOR: &str = "__";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path} does not exist")]
    MissingFile { path: String },
    #[error("invalid configuration: {0}")]
    Invalid(#[from] config::ConfigError),
}

/// Loads `T` from its defaults, the file named by `APP_CONFIG_FILE` (if set) and
/// `APP_*` environment variables.
pub fn load<T>() -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default,
{
    let file = std::env::var(CONFIG_FILE_ENV).ok();
    load_from(file.as_deref().map(Path::new))
}

/// Like [`load`] with an explicit file (which must exist when given).
pub fn load_from<T>(file: Option<&Path>) -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default,
{
    let mut builder = config::Config::builder().add_source(config::Config::try_from(&T::default())?);
    if let Some(path) = file {
        if !path.exists() {
            return Err(ConfigError::MissingFile { path: path.display().to_string() });
        }
        builder = builder.add_source(config::File::from(path).format(config::FileFormat::Toml));
    }
    builder = builder.add_source(
        config::Environment::with_prefix(ENV_PREFIX)
            .prefix_separator("_")
            .separator(ENV_SEPARATOR)
            .try_parsing(true),
    );
    Ok(builder.build()?.try_deserialize()?)
}

/// A PostgreSQL database owned by one service.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct DatabaseSettings {
    /// `postgres://role@host:port/dbname`.
    pub url: String,
    pub max_connections: u32,
    /// How long a request waits for a pooled connection before failing.
    pub acquire_timeout_ms: u64,
    /// Ping a pooled connection before handing it out. Off by default: the ping
    /// is one more round trip per checkout (a measurable share of the CPU under
    /// load), and a dead connection is found by its first query anyway, whose
    /// error every caller already handles (retry, resume, redelivery).
    pub test_before_acquire: bool,
    /// PostgreSQL's `plan_cache_mode` on the service's connections. The default,
    /// `force_generic_plan`, plans each prepared statement once per connection.
    /// PostgreSQL's own default (`auto`) compares the first five runs' plans with
    /// a generic one and may settle on planning a statement on every run, which
    /// under load made a service's database cost differ from run to run
    /// (docs/perf-log.md). Empty = the server's setting.
    pub plan_cache_mode: String,
    /// Run the service's migrations at start-up.
    pub migrate: bool,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/postgres".into(),
            max_connections: 10,
            acquire_timeout_ms: 3_000,
            test_before_acquire: false,
            plan_cache_mode: "force_generic_plan".into(),
            migrate: true,
        }
    }
}

/// Connection to the Kafka cluster (any Kafka-protocol broker).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct KafkaSettings {
    /// Comma-separated `host:port` list (`bootstrap.servers`).
    pub brokers: String,
    /// Prefix of every topic name, so several environments can share a cluster.
    pub topic_prefix: String,
    /// Extra librdkafka properties, e.g. security settings.
    pub properties: std::collections::BTreeMap<String, String>,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            topic_prefix: "sagaworks".into(),
            properties: Default::default(),
        }
    }
}

/// An address a server listens on. Port 0 picks a free port (used by tests).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ListenSettings {
    pub host: String,
    pub port: u16,
}

impl ListenSettings {
    pub fn new(host: &str, port: u16) -> Self {
        Self { host: host.into(), port }
    }

    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

impl Default for ListenSettings {
    fn default() -> Self {
        Self::new("127.0.0.1", 0)
    }
}

/// Logging and tracing. The standard `OTEL_*` variables are honoured on top of
/// these (see the telemetry crate).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct TelemetrySettings {
    /// `tracing` filter directive, overridden by `RUST_LOG`.
    pub log_level: String,
    /// `json` (one object per line, with trace ids) or `pretty`.
    pub log_format: String,
    /// OTLP/gRPC endpoint, e.g. `http://jaeger:4317`; `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// wins when set. Empty disables span export.
    pub otlp_endpoint: String,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self { log_level: "info".into(), log_format: "json".into(), otlp_endpoint: String::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(default)]
    struct Sample {
        database: DatabaseSettings,
        http: ListenSettings,
        name: String,
    }

    // Environment variables are process-global: keep every env-touching case in
    // one test so they cannot race each other.
    #[test]
    fn defaults_then_file_then_env() {
        let dir = std::env::temp_dir().join(format!("sw-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("svc.toml");
        std::fs::write(&file, "name = \"from-file\"\n[http]\nport = 7000\n[database]\nmax_connections = 3\n")
            .unwrap();

        let s: Sample = load_from(None).unwrap();
        assert_eq!(s, Sample::default());

        let s: Sample = load_from(Some(&file)).unwrap();
        assert_eq!(s.name, "from-file");
        assert_eq!(s.http.port, 7000);
        assert_eq!(s.http.host, "127.0.0.1", "unset keys keep their defaults");
        assert_eq!(s.database.max_connections, 3);

        unsafe {
            std::env::set_var("APP_HTTP__PORT", "7001");
            std::env::set_var("APP_DATABASE__URL", "postgres://x@h/db");
        }
        let s: Sample = load_from(Some(&file)).unwrap();
        unsafe {
            std::env::remove_var("APP_HTTP__PORT");
            std::env::remove_var("APP_DATABASE__URL");
        }
        assert_eq!(s.http.port, 7001, "env beats the file");
        assert_eq!(s.database.url, "postgres://x@h/db");
        assert_eq!(s.database.max_connections, 3);

        let err = load_from::<Sample>(Some(&dir.join("nope.toml"))).unwrap_err();
        assert!(matches!(err, ConfigError::MissingFile { .. }), "{err}");

        std::fs::write(&file, "[http]\nport = \"not a port\"\n").unwrap();
        let err = load_from::<Sample>(Some(&file)).unwrap_err();
        assert!(err.to_string().contains("port"), "error names the key: {err}");
    }
}
