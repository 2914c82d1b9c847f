//! Order settings: defaults for local development, overridden by the file
//! named in `APP_CONFIG_FILE` and `APP_*` variables (see `sagaworks_config`).

use sagaworks_config::{DatabaseSettings, Environment, KafkaSettings, ListenSettings, TelemetrySettings};
use sagaworks_mtls::TlsSettings;
use sagaworks_outbox::{ConsumerSettings, DeadLetterSettings, RelaySettings};
use sagaworks_resilience::ClientSettings;
use sagaworks_runtime::FaultSettings;
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
    /// Fault injection (`PUT /fault` on the HTTP port) for tests; off by default, refused in production.
    pub fault: FaultSettings,
    /// The Kafka consumer of this service's events of interest.
    pub consumer: ConsumerSettings,
    /// The inventory service (saga participant).
    pub inventory: ClientSettings,
    /// The payment service (saga participant).
    pub payment: ClientSettings,
    /// How the saga engine drives order sagas (leases, deadlines, retries).
    pub saga: SagaSettings,
    /// The dead-letter topics operators work on through this service (all of
    /// the system's: order hosts the operations API).
    pub dead_letters: DeadLetterSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            environment: Environment::default(),
            tls: TlsSettings::default(),
            grpc: ListenSettings::new("127.0.0.1", 7081),
            http: ListenSettings::new("127.0.0.1", 8081),
            database: DatabaseSettings {
                url: "postgres://order_svc@127.0.0.1:5432/sagaworks_order".into(),
                ..Default::default()
            },
            kafka: KafkaSettings::default(),
            telemetry: TelemetrySettings::default(),
            outbox: RelaySettings { service: "order".into(), ..Default::default() },
            fault: FaultSettings::default(),
            consumer: ConsumerSettings {
                group_id: "order-timeline".into(),
                topics: vec!["order", "reservation", "payment"].into_iter().map(String::from).collect(),
                // The timeline only inserts its own rows: batches cannot deadlock.
                // Waiting 50 ms for more events makes a batch one transaction for
                // several sagas' events under load.
                batch_size: 64,
                batch_wait_ms: 50,
                // Only each topic's publisher (services.toml) is believed.
                sources: sagaworks_mtls::topic_sources(sagaworks_runtime::services_toml!())
                    .expect("services.toml parses (its allow-list is checked at start-up)"),
                // And only the event types the catalog puts on each topic.
                types: sagaworks_events::catalog::topic_types(),
                ..Default::default()
            },
            inventory: ClientSettings::with_url("http://127.0.0.1:7082"),
            payment: ClientSettings::with_url("http://127.0.0.1:7083"),
            saga: SagaSettings::default(),
            dead_letters: DeadLetterSettings {
                topics: vec!["order", "reservation", "payment"].into_iter().map(String::from).collect(),
                ..Default::default()
            },
        }
    }
}

sagaworks_runtime::host_settings!(Settings, test_hooks: [outbox, consumer, saga]);
