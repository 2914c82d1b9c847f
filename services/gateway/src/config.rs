//! Gateway settings: defaults for local development, overridden by the file
//! named in `APP_CONFIG_FILE` and `APP_*` variables (see `sagaworks_config`).

use sagaworks_config::{ListenSettings, TelemetrySettings};
use sagaworks_resilience::ClientSettings;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Settings {
    /// The public REST API, health and metrics.
    pub http: ListenSettings,
    pub telemetry: TelemetrySettings,
    pub order: ClientSettings,
    /// Admin calls (products, stock).
    pub inventory: ClientSettings,
    /// Admin calls (customers, credit).
    pub payment: ClientSettings,
    pub api: ApiSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            http: ListenSettings::new("127.0.0.1", 8080),
            telemetry: TelemetrySettings::default(),
            order: ClientSettings::with_url("http://127.0.0.1:50051"),
            inventory: ClientSettings::with_url("http://127.0.0.1:50052"),
            payment: ClientSettings::with_url("http://127.0.0.1:50053"),
            api: ApiSettings::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ApiSettings {
    /// How long `POST /v1/orders` waits for the saga to finish before
    /// answering with the order as it is (PENDING, still running).
    pub order_wait_ms: u32,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
}

impl Default for ApiSettings {
    fn default() -> Self {
        Self { order_wait_ms: 5_000, max_body_bytes: 64 * 1024 }
    }
}
