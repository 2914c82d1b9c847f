//! Payment settings: defaults for local development, overridden by the file
//! named in `APP_CONFIG_FILE` and `APP_*` variables (see `sagaworks_config`).

use sagaworks_config::{DatabaseSettings, Environment, KafkaSettings, ListenSettings, TelemetrySettings};
use sagaworks_mtls::TlsSettings;
use sagaworks_outbox::RelaySettings;
use sagaworks_runtime::FaultSettings;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Settings {
    /// Where it runs (`APP_ENVIRONMENT`, required): `production` refuses TLS off, `/fault`,
    /// every test hook and the weak settings `sagaworks_runtime::HostSettings::check`
    /// lists (see `sagaworks_config::Environment`).
    pub environment: Environment,
    /// Its certificate for mutual TLS on gRPC, both ways (`sagaworks_mtls`).
    pub tls: TlsSettings,
    pub grpc: ListenSettings,
    /// Health, readiness and metrics.
    pub http: ListenSettings,
    pub database: DatabaseSettings,
    pub kafka: KafkaSettings,
    pub telemetry: TelemetrySettings,
    /// The outbox relay (runs in this process unless `outbox.enabled = false`).
    pub outbox: RelaySettings,
    /// Fault injection (`PUT /fault` on the HTTP port) for tests; off by default, refused in production.
    pub fault: FaultSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            environment: Environment::default(),
            tls: TlsSettings::default(),
            grpc: ListenSettings::new("127.0.0.1", 7083),
            http: ListenSettings::new("127.0.0.1", 8083),
            database: DatabaseSettings {
                url: "postgres://payment_svc@127.0.0.1:5432/sagaworks_payment".into(),
                ..Default::default()
            },
            kafka: KafkaSettings::default(),
            telemetry: TelemetrySettings::default(),
            outbox: RelaySettings { service: "payment".into(), ..Default::default() },
            fault: FaultSettings::default(),
        }
    }
}

sagaworks_runtime::host_settings!(Settings, test_hooks: [outbox]);
