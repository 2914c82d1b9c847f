//! Inventory settings: defaults for local development, overridden by the file
//! named in `APP_CONFIG_FILE` and `APP_*` variables (see `sagaworks_config`).

use sagaworks_config::{DatabaseSettings, Environment, KafkaSettings, ListenSettings, TelemetrySettings};
use sagaworks_mtls::TlsSettings;
use sagaworks_outbox::{ConsumerSettings, RelaySettings};
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
    /// The Kafka consumer of this service's events of interest.
    pub consumer: ConsumerSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            environment: Environment::default(),
            tls: TlsSettings::default(),
            grpc: ListenSettings::new("127.0.0.1", 7082),
            http: ListenSettings::new("127.0.0.1", 8082),
            database: DatabaseSettings {
                url: "postgres://inventory_svc@127.0.0.1:5432/sagaworks_inventory".into(),
                ..Default::default()
            },
            kafka: KafkaSettings::default(),
            telemetry: TelemetrySettings::default(),
            outbox: RelaySettings { service: "inventory".into(), ..Default::default() },
            fault: FaultSettings::default(),
            consumer: ConsumerSettings {
                group_id: "inventory".into(),
                topics: vec!["order"].into_iter().map(String::from).collect(),
                // OrderConfirmed in batches: a batch is five round trips and one
                // commit whatever its size (`OrderEvents::handle_many`), and no
                // saga waits for it.
                batch_size: 64,
                batch_wait_ms: 50,
                // Only each topic's publisher (services.toml) is believed.
                sources: sagaworks_mtls::topic_sources(sagaworks_runtime::services_toml!())
                    .expect("services.toml parses (its allow-list is checked at start-up)"),
                // And only the event types the catalog puts on each topic.
                types: sagaworks_events::catalog::topic_types(),
                ..Default::default()
            },
        }
    }
}

sagaworks_runtime::host_settings!(Settings, test_hooks: [outbox, consumer]);
