//! Builds and runs the gateway: REST API, OpenAPI, health, metrics.

use crate::api::{self, AppState};
use crate::config::Settings;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_proto::order::v1::order_service_client::OrderServiceClient;
use sagaworks_proto::payment::v1::payment_service_client::PaymentServiceClient;
use sagaworks_runtime::health::Readiness;
use sagaworks_telemetry::grpc::ClientTraceLayer;
use tower::Layer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot listen on {address}: {source}")]
    Bind { address: String, source: std::io::Error },
    #[error("invalid client settings: {0}")]
    Client(#[from] sagaworks_resilience::ResilienceError),
    #[error("HTTP server failed: {0}")]
    Serve(#[source] std::io::Error),
}

pub struct Application {
    listener: TcpListener,
    state: AppState,
}

impl Application {
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        sagaworks_runtime::metrics::handle();
        let listener = sagaworks_runtime::bind(&settings.http)
            .await
            .map_err(|source| StartupError::Bind { address: settings.http.address(), source })?;
        let traced = ClientTraceLayer::default();
        let state = AppState {
            order: OrderServiceClient::new(traced.layer(sagaworks_resilience::channel("order", &settings.order)?)),
            inventory: InventoryServiceClient::new(
                traced.layer(sagaworks_resilience::channel("inventory", &settings.inventory)?),
            ),
            payment: PaymentServiceClient::new(traced.layer(sagaworks_resilience::channel("payment", &settings.payment)?)),
            settings: settings.api.clone(),
        };
        Ok(Self { listener, state })
    }

    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// The whole HTTP surface, for tests that drive it without a socket.
    pub fn router(state: AppState) -> axum::Router {
        api::router(state)
            .merge(Readiness::new().router())
            .layer(sagaworks_telemetry::http::ServerTraceLayer::default())
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), StartupError> {
        let router = Self::router(self.state);
        sagaworks_runtime::serve::http(self.listener, router, shutdown).await.map_err(StartupError::Serve)
    }
}
