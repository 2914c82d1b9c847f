//! Builds and runs the gateway: REST API (behind auth and rate limiting), OpenAPI, health, metrics.

use crate::api::{self, AppState};
use crate::auth::Authenticator;
use crate::config::Settings;
use crate::ratelimit::Limiter;
use sagaworks_proto::deadletter::v1::dead_letter_service_client::DeadLetterServiceClient;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_proto::order::v1::order_service_client::OrderServiceClient;
use sagaworks_proto::payment::v1::payment_service_client::PaymentServiceClient;
use sagaworks_runtime::health::Readiness;
use sagaworks_telemetry::grpc::ClientTraceLayer;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::Layer;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot listen on {address}: {source}")]
    Bind { address: String, source: std::io::Error },
    #[error("invalid client settings: {0}")]
    Client(#[from] sagaworks_resilience::ResilienceError),
    #[error("invalid [auth] settings: {0}")]
    Auth(#[from] crate::auth::keys::ConfigError),
    #[error("invalid [rate_limit] settings: {0}")]
    RateLimit(#[from] crate::ratelimit::RateLimitError),
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
        let auth = Arc::new(Authenticator::new(&settings.auth)?);
        let limiter = Limiter::new(&settings.rate_limit)?.map(Arc::new);
        let listener = sagaworks_runtime::bind(&settings.http)
            .await
            .map_err(|source| StartupError::Bind { address: settings.http.address(), source })?;
        let traced = ClientTraceLayer::new("gateway");
        let order = traced.layer(sagaworks_resilience::channel("order", &settings.order)?);
        let state = AppState {
            order: OrderServiceClient::new(order.clone()),
            dead_letters: DeadLetterServiceClient::new(order),
            inventory: InventoryServiceClient::new(
                traced.layer(sagaworks_resilience::channel("inventory", &settings.inventory)?),
            ),
            payment: PaymentServiceClient::new(
                traced.layer(sagaworks_resilience::channel("payment", &settings.payment)?),
            ),
            settings: settings.api.clone(),
            auth,
            limiter,
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
            .layer(sagaworks_telemetry::http::ServerTraceLayer::new("gateway"))
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), StartupError> {
        // The peer address keys the rate limit of requests without a valid token.
        let app = Self::router(self.state).into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .map_err(StartupError::Serve)
    }
}
