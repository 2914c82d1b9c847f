//! {{Name}} settings: defaults for local development, overridden by the file
//! named in `APP_CONFIG_FILE` and `APP_*` variables (see `sagaworks_config`).

use sagaworks_config::{DatabaseSettings, Environment, KafkaSettings, ListenSettings, TelemetrySettings};
use sagaworks_mtls::TlsSettings;
use sagaworks_runtime::FaultSettings;
use sagaworks_outbox::{ConsumerSettings, RelaySettings};
use sagaworks_resilience::ClientSettings;
use sagaworks_saga::SagaSettings;
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
    /// The Kafka consumer of this service's events of interest.
    pub consumer: ConsumerSettings,
    /// The inventory service, asked whether a product exists (`APP_INVENTORY__URL`).
    pub inventory: ClientSettings,
    /// How the example saga is driven (leases, deadlines, retries; `max_wait_ms`:
    /// how long `CreateItem` waits for it).
    pub saga: SagaSettings,
    /// Fault injection (`PUT /fault` on the HTTP port) for tests; off by default, refused in production.
    pub fault: FaultSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            environment: Environment::default(),
            tls: TlsSettings::default(),
            grpc: ListenSettings::new("127.0.0.1", {{grpc_port}}),
            http: ListenSettings::new("127.0.0.1", {{http_port}}),
            database: DatabaseSettings {
                url: "postgres://{{name}}_svc@127.0.0.1:5432/sagaworks_{{name}}".into(),
                ..Default::default()
            },
            kafka: KafkaSettings::default(),
            telemetry: TelemetrySettings::default(),
            outbox: RelaySettings { service: "{{name}}".into(), ..Default::default() },
            consumer: ConsumerSettings {
                group_id: "{{name}}".into(),
                topics: vec!["order".into()],
                // Only each topic's publisher (services.toml) is believed.
                sources: sagaworks_mtls::topic_sources(sagaworks_runtime::services_toml!())
                    .expect("services.toml parses (its allow-list is checked at start-up)"),
                // And only the event types the catalog puts on each topic.
                types: sagaworks_events::catalog::topic_types(),
                ..Default::default()
            },
            inventory: ClientSettings::with_url("http://127.0.0.1:7082"),
            saga: SagaSettings::default(),
            fault: FaultSettings::default(),
        }
    }
}

sagaworks_runtime::host_settings!(Settings, test_hooks: [outbox, consumer, saga]);
