//! Order settings: defaults for local development, overridden by the file
//! named in `APP_CONFIG_FILE` and `APP_*` variables (see `sagaworks_config`).

use sagaworks_config::{DatabaseSettings, KafkaSettings, ListenSettings, TelemetrySettings};
use sagaworks_outbox::{ConsumerSettings, RelaySettings};
use sagaworks_resilience::ClientSettings;
use sagaworks_runtime::fault::FaultSettings;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Settings {
    pub grpc: ListenSettings,
    /// Health, readiness and metrics.
    pub http: ListenSettings,
    pub database: DatabaseSettings,
    pub kafka: KafkaSettings,
    pub telemetry: TelemetrySettings,
    /// The outbox relay (runs in this process unless `outbox.enabled = false`).
    pub outbox: RelaySettings,
    /// Fault injection (`PUT /fault` on the HTTP port) for tests; off by default, never in production.
    pub fault: FaultSettings,
    /// The Kafka consumer of this service's events of interest.
    pub consumer: ConsumerSettings,
    /// The inventory service (saga participant).
    pub inventory: ClientSettings,
    /// The payment service (saga participant).
    pub payment: ClientSettings,
    pub saga: SagaSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            grpc: ListenSettings::new("127.0.0.1", 50051),
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
                ..Default::default()
            },
            inventory: ClientSettings::with_url("http://127.0.0.1:50052"),
            payment: ClientSettings::with_url("http://127.0.0.1:50053"),
            saga: SagaSettings::default(),
        }
    }
}

/// How the orchestrator drives sagas.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SagaSettings {
    /// How long a driver owns a saga without renewing; after that another
    /// replica (or this one after a restart) takes it over.
    pub lease_ms: u64,
    /// How often the worker looks for sagas to resume.
    pub poll_interval_ms: u64,
    /// Sagas one replica drives at once.
    pub max_concurrent: usize,
    /// A forward step still unfinished this long after it started (across
    /// crashes and restarts) is given up and compensated.
    pub step_deadline_ms: u64,
    /// First and largest delay between attempts of a compensation step.
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// The longest `CreateOrder` may wait for the saga before answering.
    pub max_wait_ms: u64,
    /// Fault injection for tests, off (empty) by default: makes this replica
    /// stop dead at a point of a saga, as if the process had been killed
    /// there. `before:<step>`, `after_call:<step>` (the participant did the
    /// work, nothing was recorded) or `after_commit:<step>`.
    pub crash_point: String,
}

impl Default for SagaSettings {
    fn default() -> Self {
        Self {
            lease_ms: 30_000,
            poll_interval_ms: 500,
            max_concurrent: 256,
            step_deadline_ms: 60_000,
            retry_base_ms: 100,
            retry_max_ms: 10_000,
            max_wait_ms: 10_000,
            crash_point: String::new(),
        }
    }
}
