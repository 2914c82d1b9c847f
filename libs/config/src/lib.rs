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
const CONFIG_FILE_ENV: &str = "APP_CONFIG_FILE";
/// Prefix of every override variable (`APP_` + key path joined by `__`).
const ENV_PREFIX: &str = "APP";
/// Separator between nested keys in override variables.
const ENV_SEPARATOR: &str = "__";
/// The variable that says where a service runs ([`Environment`]); a service refuses to
/// start without it ([`load_service`]).
const ENVIRONMENT_ENV: &str = "APP_ENVIRONMENT";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path} does not exist")]
    MissingFile { path: String },
    #[error("invalid configuration: {0}")]
    Invalid(#[from] config::ConfigError),
    #[error(
        "APP_ENVIRONMENT is not set: a service starts only when told where it runs; set \
         APP_ENVIRONMENT=production (TLS, allow-lists, no test hooks) or APP_ENVIRONMENT=development \
         (a developer's machine), or `environment` in the APP_CONFIG_FILE"
    )]
    EnvironmentUnset,
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

/// Like [`load`], for a service: refuses ([`ConfigError::EnvironmentUnset`]) when
/// neither `APP_ENVIRONMENT` nor the file sets `environment`, so no service falls back
/// on a default (a debug build's `development`: no TLS, no allow-list, `/fault`) by
/// omission.
pub fn load_service<T>() -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default,
{
    let file = std::env::var(CONFIG_FILE_ENV).ok();
    load_service_from(file.as_deref().map(Path::new))
}

/// Like [`load_service`] with an explicit file (which must exist when given).
fn load_service_from<T>(file: Option<&Path>) -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default,
{
    let in_env = std::env::var(ENVIRONMENT_ENV).is_ok_and(|v| !v.trim().is_empty());
    if !in_env && !file_sets_environment(file)? {
        return Err(ConfigError::EnvironmentUnset);
    }
    load_from(file)
}

/// Whether `file` (TOML) sets `environment`.
fn file_sets_environment(file: Option<&Path>) -> Result<bool, ConfigError> {
    let Some(path) = file.filter(|p| p.exists()) else { return Ok(false) };
    let only_the_file = config::Config::builder()
        .add_source(config::File::from(path).format(config::FileFormat::Toml))
        .build()?;
    Ok(only_the_file.get_string("environment").is_ok_and(|v| !v.trim().is_empty()))
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
/// off, fault injection, test hooks, the development JWT secret, ...; docs/security.md
/// lists them).
///
/// A service binary requires it to be set ([`load_service`]); the default, `development`
/// in a debug build and `production` in a release build, is what settings built in
/// code (tests) start from.
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
    /// The setting, as its config key (`tls.cert_file`, `fault.enabled`, `saga.crash_point`).
    pub setting: String,
    pub why: &'static str,
}

/// One thing production refuses: (unsafe?, setting, why), for [`Environment::refuse`].
pub type Check<'a> = (bool, &'a str, &'static str);

impl Environment {
    /// `Err(Unsafe)` for the first of `checks` whose condition holds, in production;
    /// always `Ok` in development.
    pub fn refuse(self, checks: &[Check<'_>]) -> Result<(), Unsafe> {
        if self == Self::Development {
            return Ok(());
        }
        match checks.iter().find(|(bad, ..)| *bad) {
            Some((_, setting, why)) => Err(Unsafe { setting: (*setting).to_owned(), why }),
            None => Ok(()),
        }
    }
}

/// Why production refuses a committed development password.
const DEVELOPMENT_PASSWORD: &str = "it is a development password committed to the repository \
     (docker-compose.yml's defaults, the k8s dev overlay, the scripts), so anyone who read it can \
     log in; set a password of this deployment's own";

/// Whether `password` is one of the development passwords the repository commits:
/// docker-compose.yml's defaults (`order-dev-password`, `postgres-dev-password`, ...),
/// the k8s dev overlay's and its infrastructure's (`dev-only-order-password`,
/// `dev-only-order-kafka-password`, `dev-only-grafana-admin-password`, ...), the ones
/// `scripts/new-service` writes for a new service (the same patterns with its name), and
/// `scripts/validate-deploy`'s placeholders. Production refuses each of them.
fn is_development_password(password: &str) -> bool {
    let p = password.trim().to_ascii_lowercase();
    p.starts_with("dev-only-") || p.ends_with("-dev-password") || p.ends_with("-validate-deploy-placeholder")
}

/// The password in `url`: its user info's (`user:password@`), else a `password=` query
/// parameter; `None` without one.
fn url_password(url: &str) -> Option<&str> {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        if let Some((user_info, _)) = authority.rsplit_once('@')
            && let Some((_, password)) = user_info.split_once(':')
        {
            return Some(password);
        }
    }
    let (_, query) = url.split_once('?')?;
    query.split('&').find_map(|p| match p.split_once('=') {
        Some((k, v)) if k.eq_ignore_ascii_case("password") => Some(v),
        _ => None,
    })
}

/// What a secret shows as in `Debug` (settings are logged at start-up).
pub const REDACTED: &str = "[REDACTED]";

/// `url` with the password of its user info (`user:password@`) and any `password=`
/// query parameter replaced by [`REDACTED`].
fn redact_url(url: &str) -> String {
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
fn is_secret_property(key: &str) -> bool {
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
    /// under load makes a service's database cost differ from run to run.
    /// Empty = the server's setting.
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

impl DatabaseSettings {
    /// What production refuses here: a committed development password in `url` or
    /// `owner_url` (one of the repository's sample passwords).
    pub fn production_checks(&self) -> Vec<Check<'static>> {
        let development = |url: &str| url_password(url).is_some_and(is_development_password);
        vec![
            (development(&self.url), "database.url", DEVELOPMENT_PASSWORD),
            (development(&self.owner_url), "database.owner_url", DEVELOPMENT_PASSWORD),
        ]
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
/// values of the properties that may hold secrets (passwords, keys, tokens, credentials).
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
    /// The CA file the broker's certificate is checked against: the CA of the Kafka
    /// nodes (`kafka-ca.pem` of `sagaworks-tools dev-certs`), not `tls.ca_file`, the
    /// services' CA.
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
    /// The extra property `key` (librdkafka's names are case-insensitive here), if set.
    pub fn property(&self, key: &str) -> Option<&str> {
        self.properties.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v.as_str())
    }

    /// The protocol in effect, lower case: an extra `security.protocol` property wins over
    /// `security_protocol` (`plaintext`, `ssl`, `sasl_plaintext`, `sasl_ssl`).
    pub fn protocol(&self) -> String {
        match self.property("security.protocol") {
            Some(p) => p.trim().to_ascii_lowercase(),
            None if self.security_protocol == KafkaSecurity::SaslSsl => "sasl_ssl".into(),
            None => "plaintext".into(),
        }
    }

    /// Whether the connection is encrypted: [`protocol`](Self::protocol) `ssl` or `sasl_ssl`.
    fn is_encrypted(&self) -> bool {
        matches!(self.protocol().as_str(), "ssl" | "sasl_ssl")
    }

    /// The SASL user and password in effect: the `sasl.username` and `sasl.password`
    /// properties, which win over `sasl_username` and `sasl_password` (applied with
    /// `security_protocol = sasl_ssl` only). Empty ones count as missing.
    fn sasl_credentials(&self) -> (Option<&str>, Option<&str>) {
        let fields = self.security_protocol == KafkaSecurity::SaslSsl;
        let user = self.property("sasl.username").or(fields.then_some(self.sasl_username.as_str()));
        let password = self.property("sasl.password").or(fields.then_some(self.sasl_password.as_str()));
        (user.filter(|u| !u.is_empty()), password.filter(|p| !p.is_empty()))
    }

    /// Whether a client certificate is configured in the extra properties (PEM files,
    /// inline PEM, or a PKCS#12 keystore), as `ssl` without SASL needs.
    fn has_client_certificate(&self) -> bool {
        let set = |key: &str| self.property(key).is_some_and(|v| !v.trim().is_empty());
        (set("ssl.certificate.location") && set("ssl.key.location"))
            || (set("ssl.certificate.pem") && set("ssl.key.pem"))
            || set("ssl.keystore.location")
    }

    /// What production refuses here: a plaintext connection; SASL over TLS without the
    /// service's own user and password, whether `security_protocol` or the
    /// `security.protocol` property asks for it; `ssl` without SASL and without a client
    /// certificate (the broker would not know who connects); a committed development
    /// password.
    pub fn production_checks(&self) -> Vec<Check<'static>> {
        let protocol = self.protocol();
        let from_properties = self.property("security.protocol").is_some();
        let (user, password) = self.sasl_credentials();
        let anonymous = protocol == "sasl_ssl" && (user.is_none() || password.is_none());
        let development =
            password.is_some_and(is_development_password) || is_development_password(&self.sasl_password);
        vec![
            (
                !self.is_encrypted(),
                "kafka.security_protocol",
                "plaintext Kafka lets anyone who reaches a broker read every event and forge any, past the consumers' source check; set sasl_ssl",
            ),
            (
                anonymous && !from_properties,
                "kafka.sasl_password",
                "sasl_ssl needs the service's own user: set kafka.sasl_username and kafka.sasl_password",
            ),
            (
                anonymous && from_properties,
                "kafka.properties.\"security.protocol\"",
                "SASL_SSL needs the service's own user: set sasl.username and sasl.password among kafka.properties, or kafka.sasl_username and kafka.sasl_password with security_protocol = sasl_ssl",
            ),
            (
                protocol == "ssl" && !self.has_client_certificate(),
                "kafka.properties.\"security.protocol\"",
                "ssl without SASL authenticates the service only by a client certificate, and none is set: set ssl.certificate.location and ssl.key.location (or ssl.keystore.location) among kafka.properties, or use sasl_ssl",
            ),
            (development, "kafka.sasl_password", DEVELOPMENT_PASSWORD),
        ]
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

    /// The setting production refuses first among `checks`, if any.
    fn refused(checks: &[Check<'_>]) -> Option<String> {
        Environment::Production.refuse(checks).err().map(|e| e.setting)
    }

    #[test]
    fn kafka_in_production_needs_tls_and_a_user_however_the_protocol_is_set() {
        let sasl = KafkaSettings {
            security_protocol: KafkaSecurity::SaslSsl,
            sasl_username: "order".into(),
            sasl_password: "a-password-of-its-own".into(),
            ..Default::default()
        };
        let props = |pairs: &[(&str, &str)]| KafkaSettings {
            properties: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        let protocol = "kafka.properties.\"security.protocol\"";
        let cases: Vec<(&str, KafkaSettings, Option<&str>)> = vec![
            ("sasl_ssl with its user", sasl.clone(), None),
            ("plaintext", KafkaSettings::default(), Some("kafka.security_protocol")),
            (
                "sasl_plaintext property",
                props(&[("security.protocol", "SASL_PLAINTEXT")]),
                Some("kafka.security_protocol"),
            ),
            (
                "no password",
                KafkaSettings { sasl_password: String::new(), ..sasl.clone() },
                Some("kafka.sasl_password"),
            ),
            ("SASL_SSL property, no user", props(&[("security.protocol", "SASL_SSL")]), Some(protocol)),
            (
                "SASL_SSL property, a user in the properties",
                props(&[
                    ("security.protocol", "sasl_ssl"),
                    ("sasl.username", "order"),
                    ("sasl.password", "p-own"),
                ]),
                None,
            ),
            (
                "SASL_SSL property, the fields' user",
                KafkaSettings {
                    properties: props(&[("Security.Protocol", "SASL_SSL")]).properties,
                    ..sasl.clone()
                },
                None,
            ),
            ("ssl, no client certificate", props(&[("security.protocol", "ssl")]), Some(protocol)),
            (
                "ssl, a key but no certificate",
                props(&[("security.protocol", "SSL"), ("ssl.key.location", "/k.pem")]),
                Some(protocol),
            ),
            (
                "ssl with a client certificate",
                props(&[
                    ("security.protocol", "ssl"),
                    ("ssl.certificate.location", "/c.pem"),
                    ("ssl.key.location", "/k.pem"),
                ]),
                None,
            ),
            (
                "ssl with a keystore",
                props(&[("security.protocol", "ssl"), ("ssl.keystore.location", "/ks.p12")]),
                None,
            ),
            (
                "the dev overlay's password",
                KafkaSettings { sasl_password: "dev-only-order-kafka-password".into(), ..sasl.clone() },
                Some("kafka.sasl_password"),
            ),
            (
                "a development password in the properties",
                KafkaSettings {
                    properties: props(&[("sasl.password", "dev-only-kafka-admin-password")]).properties,
                    ..sasl.clone()
                },
                Some("kafka.sasl_password"),
            ),
        ];
        for (what, kafka, expected) in cases {
            let checks = kafka.production_checks();
            assert_eq!(refused(&checks).as_deref(), expected, "{what}");
            assert_eq!(Environment::Development.refuse(&checks), Ok(()), "{what}: development takes it");
        }
    }

    #[test]
    fn url_passwords_are_found_in_the_user_info_or_the_query() {
        assert_eq!(url_password("postgres://u:pw@h:5432/db"), Some("pw"));
        assert_eq!(url_password("postgres://u:p:w@h/db?sslmode=require"), Some("p:w"));
        assert_eq!(url_password("postgres://u@h/db?sslmode=require&password=q"), Some("q"));
        assert_eq!(url_password("postgres://u@h/db"), None);
        assert_eq!(url_password("postgres://h/db?user=u"), None);
        let db = |url: &str| DatabaseSettings { url: url.into(), ..Default::default() };
        assert_eq!(
            refused(&db("postgres://order_svc:order-dev-password@h/db").production_checks()).as_deref(),
            Some("database.url")
        );
        assert_eq!(refused(&db("postgres://order_svc:a-real-one@h/db").production_checks()), None);
        let owner = DatabaseSettings {
            owner_url: "postgres://o@h/db?password=dev-only-order-owner-password".into(),
            ..db("postgres://order_svc@h/db")
        };
        assert_eq!(refused(&owner.production_checks()).as_deref(), Some("database.owner_url"));
    }

    /// Every password the repository commits for development (docker-compose.yml's
    /// defaults, the k8s dev overlay and its infrastructure, deploy/README.md's Grafana
    /// one) is one [`is_development_password`] knows, read from the files themselves.
    #[test]
    fn every_committed_development_password_is_refused() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = vec![root.join("docker-compose.yml")];
        let mut dirs = vec![root.join("k8s/overlays/dev")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() { dirs.push(path) } else { files.push(path) }
            }
        }
        let value_end =
            |s: &str| s.find(|c: char| c.is_whitespace() || "}\"'@$,".contains(c)).unwrap_or(s.len());
        let mut found = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            for marker in ["PASSWORD:-", "password=", "PASSWORD: "] {
                for (at, _) in text.match_indices(marker) {
                    let rest = &text[at + marker.len()..];
                    let value = &rest[..value_end(rest)];
                    if !value.is_empty() {
                        found.push(value.to_owned());
                    }
                }
            }
            for line in text.lines().filter(|l| l.contains("postgres://")) {
                if let Some(at) = line.find("postgres://") {
                    let url = &line[at..];
                    if let Some(password) =
                        url_password(&url[..url.find(char::is_whitespace).unwrap_or(url.len())])
                    {
                        found.push(password.to_owned());
                    }
                }
            }
        }
        // Placeholders in comments (`<password>`) and variables are no passwords.
        found.retain(|p| !p.starts_with(['$', '<']) && !p.is_empty());
        found.sort();
        found.dedup();
        for expected in [
            "postgres-dev-password",
            "order-owner-dev-password",
            "dev-only-grafana-admin-password",
            "dev-only-payment-owner-password",
            "dev-only-inventory-kafka-password",
            "dev-only-kafka-admin-password",
            "dev-only-postgres-superuser-password",
        ] {
            assert!(found.iter().any(|p| p == expected), "{expected} not found in the files: {found:?}");
        }
        for password in &found {
            assert!(is_development_password(password), "{password} is committed but not refused");
        }
        for own in ["s3cr3t-of-this-deployment", "dev-only", "password", "order-dev-passwords"] {
            assert!(!is_development_password(own), "{own}");
        }
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

        // A service needs `environment` from APP_ENVIRONMENT or the file.
        unsafe { std::env::remove_var(ENVIRONMENT_ENV) };
        let err = load_service_from::<Sample>(Some(&file)).unwrap_err();
        assert!(matches!(err, ConfigError::EnvironmentUnset), "{err}");
        assert!(err.to_string().starts_with("APP_ENVIRONMENT is not set"), "{err}");
        unsafe { std::env::set_var(ENVIRONMENT_ENV, " ") };
        assert!(matches!(load_service_from::<Sample>(None), Err(ConfigError::EnvironmentUnset)), "blank");
        unsafe { std::env::set_var(ENVIRONMENT_ENV, "development") };
        let s: Sample = load_service_from(Some(&file)).unwrap();
        unsafe { std::env::remove_var(ENVIRONMENT_ENV) };
        assert_eq!(s.name, "from-file");
        let with_environment = dir.join("env.toml");
        std::fs::write(&with_environment, "environment = \"production\"\nname = \"prod\"\n").unwrap();
        let s: Sample = load_service_from(Some(&with_environment)).unwrap();
        assert_eq!(s.name, "prod", "the file's environment is as good as the variable");

        let err = load_from::<Sample>(Some(&dir.join("nope.toml"))).unwrap_err();
        assert!(matches!(err, ConfigError::MissingFile { .. }), "{err}");

        std::fs::write(&file, "[http]\nport = \"not a port\"\n").unwrap();
        let err = load_from::<Sample>(Some(&file)).unwrap_err();
        assert!(err.to_string().contains("port"), "error names the key: {err}");
    }
}
