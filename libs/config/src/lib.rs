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

/// Where a service runs (`environment`, `APP_ENVIRONMENT`). In `production` a service
/// refuses, at start-up, every setting that is only safe on a developer's machine (TLS
/// off, fault injection, the development JWT secret, ...; docs/security.md lists them).
///
/// The default is `development` in a debug build and `production` in a release build,
/// so the release images are strict unless told otherwise; `scripts/dev-up` and the
/// compose file, which run release builds locally, set `development`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Environment {
    Development,
    Production,
}

impl Default for Environment {
    fn default() -> Self {
        if cfg!(debug_assertions) { Self::Development } else { Self::Production }
    }
}

impl std::fmt::Display for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Development => "development",
            Self::Production => "production",
        })
    }
}

/// A setting refused with `environment = production`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} is refused with environment = production (APP_ENVIRONMENT): {why}")]
pub struct Unsafe {
    /// The setting, as its config key (`tls.cert_file`, `fault.enabled`).
    pub setting: &'static str,
    pub why: &'static str,
}

impl Environment {
    /// `Err(Unsafe)` for the first of `checks` whose condition holds, in production;
    /// always `Ok` in development. `checks`: (unsafe?, setting, why).
    pub fn refuse(self, checks: &[(bool, &'static str, &'static str)]) -> Result<(), Unsafe> {
        if self == Self::Development {
            return Ok(());
        }
        match checks.iter().find(|(bad, ..)| *bad) {
            Some((_, setting, why)) => Err(Unsafe { setting, why }),
            None => Ok(()),
        }
    }
}

/// What a secret shows as in `Debug` (settings are logged at start-up).
pub const REDACTED: &str = "[REDACTED]";

/// `url` with the password of its user info (`user:password@`) and any `password=`
/// query parameter replaced by [`REDACTED`].
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(scheme_end) = out.find("://") {
        let rest = scheme_end + 3;
        let authority_end = out[rest..].find(['/', '?']).map_or(out.len(), |i| rest + i);
        if let Some(at) = out[rest..authority_end].rfind('@').map(|i| rest + i)
            && let Some(colon) = out[rest..at].find(':').map(|i| rest + i)
        {
            out.replace_range(colon + 1..at, REDACTED);
        }
    }
    if let Some(query) = out.find('?') {
        let (head, tail) = out.split_at(query + 1);
        let params: Vec<String> = tail
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={REDACTED}"),
                _ => p.to_owned(),
            })
            .collect();
        out = format!("{head}{}", params.join("&"));
    }
    out
}

/// Whether a librdkafka property may hold a secret (its value is redacted in `Debug`).
pub fn is_secret_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "secret", "jaas", "key", "token", "credential"].iter().any(|s| key.contains(s))
}

/// A PostgreSQL database owned by one service. `Debug` redacts the URL's password.
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct DatabaseSettings {
    /// `postgres://role@host:port/dbname`: the runtime role, which may read and write
    /// the tables (DML) but not change them.
    pub url: String,
    /// The role that owns the database, for migrations only (`migrate`, and start-up
    /// migrations with `migrate = true`): a pool of one connection, closed once they ran.
    /// Empty: migrations run as `url`'s role, which must then own the database.
    pub owner_url: String,
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

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &redact_url(&self.url))
            .field("owner_url", &redact_url(&self.owner_url))
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .field("test_before_acquire", &self.test_before_acquire)
            .field("plan_cache_mode", &self.plan_cache_mode)
            .field("migrate", &self.migrate)
            .finish()
    }
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/postgres".into(),
            owner_url: String::new(),
            max_connections: 10,
            acquire_timeout_ms: 3_000,
            test_before_acquire: false,
            plan_cache_mode: "force_generic_plan".into(),
            migrate: true,
        }
    }
}

/// Connection to the Kafka cluster (any Kafka-protocol broker). `Debug` redacts the
/// values of the properties that may hold secrets ([`is_secret_property`]).
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct KafkaSettings {
    /// Comma-separated `host:port` list (`bootstrap.servers`).
    pub brokers: String,
    /// Prefix of every topic name, so several environments can share a cluster.
    pub topic_prefix: String,
    /// `plaintext`, or `sasl_ssl`: TLS (the broker's certificate checked against
    /// `ssl_ca_file`, or the system's roots when empty) and SCRAM-SHA-512 as
    /// `sasl_username` / `sasl_password` (each service its own user; its ACLs say which
    /// topics it may write and read). Anything else is a configuration error.
    pub security_protocol: KafkaSecurity,
    pub sasl_username: String,
    /// Redacted in `Debug`.
    pub sasl_password: String,
    pub ssl_ca_file: String,
    /// Extra librdkafka properties (they win over the above).
    pub properties: std::collections::BTreeMap<String, String>,
}

/// How a service connects to Kafka ([`KafkaSettings::security_protocol`]).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KafkaSecurity {
    /// No TLS, no authentication: development only.
    #[default]
    Plaintext,
    /// TLS and SCRAM-SHA-512.
    SaslSsl,
}

impl KafkaSettings {
    /// Whether the connection is encrypted: `security_protocol = sasl_ssl`, or an extra
    /// `security.protocol` property of `ssl` or `sasl_ssl` (which wins over the field).
    pub fn is_encrypted(&self) -> bool {
        match self.properties.iter().find(|(k, _)| k.eq_ignore_ascii_case("security.protocol")) {
            Some((_, v)) => v.eq_ignore_ascii_case("ssl") || v.eq_ignore_ascii_case("sasl_ssl"),
            None => self.security_protocol == KafkaSecurity::SaslSsl,
        }
    }

    /// The librdkafka properties of `security_protocol` and the SASL and TLS settings;
    /// none for `plaintext`.
    pub fn security_properties(&self) -> Vec<(&'static str, String)> {
        if self.security_protocol != KafkaSecurity::SaslSsl {
            return Vec::new();
        }
        let mut properties = vec![
            ("security.protocol", "SASL_SSL".to_owned()),
            ("sasl.mechanism", "SCRAM-SHA-512".to_owned()),
            ("sasl.username", self.sasl_username.clone()),
            ("sasl.password", self.sasl_password.clone()),
        ];
        if !self.ssl_ca_file.is_empty() {
            properties.push(("ssl.ca.location", self.ssl_ca_file.clone()));
        }
        properties
    }
}

impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let properties: std::collections::BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| (k.as_str(), if is_secret_property(k) { REDACTED } else { v.as_str() }))
            .collect();
        f.debug_struct("KafkaSettings")
            .field("brokers", &self.brokers)
            .field("topic_prefix", &self.topic_prefix)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &if self.sasl_password.is_empty() { "" } else { REDACTED })
            .field("ssl_ca_file", &self.ssl_ca_file)
            .field("properties", &properties)
            .finish()
    }
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            topic_prefix: "sagaworks".into(),
            security_protocol: KafkaSecurity::Plaintext,
            sasl_username: String::new(),
            sasl_password: String::new(),
            ssl_ca_file: String::new(),
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

    #[test]
    fn debug_shows_no_password_and_no_secret_kafka_property() {
        let db = DatabaseSettings {
            url: "postgres://order_svc:s3cr3t@db:5432/sagaworks_order?sslmode=require&password=other".into(),
            ..Default::default()
        };
        let shown = format!("{db:?}");
        assert!(!shown.contains("s3cr3t") && !shown.contains("other"), "{shown}");
        assert!(
            shown.contains("postgres://order_svc:[REDACTED]@db:5432/sagaworks_order?sslmode=require"),
            "{shown}"
        );
        assert_eq!(redact_url("postgres://order_svc@db/x"), "postgres://order_svc@db/x", "no password");

        let mut kafka = KafkaSettings { sasl_password: "hunter1".into(), ..Default::default() };
        assert!(!format!("{kafka:?}").contains("hunter1"));
        kafka.properties.insert("sasl.password".into(), "hunter2".into());
        kafka.properties.insert("sasl.jaas.config".into(), "x password=\"hunter3\"".into());
        kafka.properties.insert("security.protocol".into(), "SASL_SSL".into());
        let shown = format!("{kafka:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("hunter3"), "{shown}");
        assert!(shown.contains("SASL_SSL"), "other properties stay readable: {shown}");
    }

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
