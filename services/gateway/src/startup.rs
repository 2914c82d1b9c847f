//! Builds and runs the gateway: REST API (behind auth and rate limiting), OpenAPI, health, metrics.

use crate::api::{self, AppState};
use crate::auth::Authenticator;
use crate::config::{ServerSettings, Settings};
use crate::ratelimit::{Limiter, TrustedProxies};
use axum::http::Method;
use axum::http::header::{
    AUTHORIZATION, CONTENT_TYPE, COOKIE, HeaderName, HeaderValue, LOCATION, RETRY_AFTER, SET_COOKIE,
};
use sagaworks_proto::deadletter::v1::dead_letter_service_client::DeadLetterServiceClient;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_proto::order::v1::order_service_client::OrderServiceClient;
use sagaworks_proto::payment::v1::payment_service_client::PaymentServiceClient;
use sagaworks_runtime::Readiness;
use sagaworks_telemetry::grpc::ClientTraceLayer;
use sagaworks_telemetry::http::{CallerTrace, ServerTraceLayer};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::Layer;
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveHeadersLayer;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot listen on {address}: {source}")]
    Bind { address: String, source: std::io::Error },
    #[error("invalid client settings: {0}")]
    Client(#[from] sagaworks_resilience::ResilienceError),
    #[error(transparent)]
    Unsafe(#[from] sagaworks_config::Unsafe),
    #[error(transparent)]
    Tls(#[from] sagaworks_mtls::TlsError),
    #[error("invalid [auth] settings: {0}")]
    Auth(#[from] crate::auth::keys::ConfigError),
    #[error("invalid [rate_limit] settings: {0}")]
    RateLimit(#[from] crate::ratelimit::RateLimitError),
    #[error("invalid [server] settings: {0}")]
    Server(String),
    #[error("invalid api.cors_allowed_origins entry {0:?}: not a header value")]
    CorsOrigin(String),
    #[error("HTTP server failed: {0}")]
    Serve(#[source] std::io::Error),
}

pub struct Application {
    listener: TcpListener,
    state: AppState,
    server: ServerSettings,
    /// Exempt from the per-peer connection cap (`rate_limit.trusted_proxies`).
    proxies: Vec<String>,
    /// The TLS identity of the calls to the services, read again while the gateway runs.
    identity: Option<sagaworks_mtls::Identity>,
}

/// The CORS layer for `origins` (none when empty); entries that are not header
/// values are skipped here, and refused by [`Application::build`].
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let origins: Vec<HeaderValue> = origins.iter().filter_map(|o| o.parse().ok()).collect();
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                AUTHORIZATION,
                CONTENT_TYPE,
                HeaderName::from_static("idempotency-key"),
                HeaderName::from_static("traceparent"),
                HeaderName::from_static("tracestate"),
                HeaderName::from_static("x-request-id"),
            ])
            .expose_headers([
                LOCATION,
                RETRY_AFTER,
                HeaderName::from_static("x-request-id"),
                HeaderName::from_static("idempotent-replayed"),
            ])
            .max_age(std::time::Duration::from_secs(600)),
    )
}

impl Application {
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        sagaworks_runtime::metrics::handle();
        if let Some(bad) =
            settings.api.cors_allowed_origins.iter().find(|o| o.parse::<HeaderValue>().is_err())
        {
            return Err(StartupError::CorsOrigin(bad.clone()));
        }
        let server = &settings.server;
        if let Some(zero) = server.zero_limit() {
            return Err(StartupError::Server(format!("{zero} must be > 0")));
        }
        if server.request_timeout_ms <= u64::from(settings.api.order_wait_ms) {
            return Err(StartupError::Server(format!(
                "request_timeout_ms ({}) must exceed api.order_wait_ms ({}), which POST /v1/orders may wait",
                server.request_timeout_ms, settings.api.order_wait_ms
            )));
        }
        let auth = Arc::new(Authenticator::new(&settings.auth, settings.environment)?);
        let limiter = Limiter::new(&settings.rate_limit)?.map(Arc::new);
        let listener = sagaworks_runtime::bind(&settings.http)
            .await
            .map_err(|source| StartupError::Bind { address: settings.http.address(), source })?;
        settings.environment.refuse(&[
            (
                !settings.tls.enabled(),
                "tls",
                "the calls to the services would be plaintext, and they would refuse them; set tls.ca_file, tls.cert_file and tls.key_file",
            ),
            (
                !settings.rate_limit.enabled,
                "rate_limit.enabled",
                "without rate limits one client can take the whole API (and guess at tokens and ids as fast as it likes)",
            ),
            (
                settings.auth.leeway_secs > crate::config::MAX_LEEWAY_SECS,
                "auth.leeway_secs",
                "more than 300 s of clock skew keeps expired tokens good that much longer",
            ),
        ])?;
        let identity = sagaworks_mtls::Identity::load(&settings.tls, "gateway")?;
        let tls = identity.as_ref();
        let traced = ClientTraceLayer::new("gateway");
        let order = traced.layer(sagaworks_resilience::channel("order", &settings.order, tls)?);
        let state = AppState {
            order: OrderServiceClient::new(order.clone()),
            dead_letters: DeadLetterServiceClient::new(order),
            inventory: InventoryServiceClient::new(traced.layer(sagaworks_resilience::channel(
                "inventory",
                &settings.inventory,
                tls,
            )?)),
            payment: PaymentServiceClient::new(traced.layer(sagaworks_resilience::channel(
                "payment",
                &settings.payment,
                tls,
            )?)),
            settings: settings.api.clone(),
            auth,
            limiter,
        };
        Ok(Self {
            listener,
            state,
            server: settings.server.clone(),
            proxies: settings.rate_limit.trusted_proxies.clone(),
            identity,
        })
    }

    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// The whole HTTP surface, for tests that drive it without a socket.
    ///
    /// Around every route, inside out: the request's server span and RED
    /// histogram (ours: the root of a new trace, linked to the client's W3C
    /// context when it sends one, and named by the matched route), then from tower-http: the `x-request-id` (kept from the
    /// caller or a new UUID, echoed in the response and recorded on the span),
    /// `Authorization`/`Cookie`/`Set-Cookie` marked sensitive (never printed by
    /// a `Debug` of the headers), gzip for callers that accept it, and CORS for
    /// `api.cors_allowed_origins`. The body limit is axum's `DefaultBodyLimit`
    /// (in [`api::router`]), so a body too large gets problem+json.
    pub fn router(state: AppState) -> axum::Router {
        let cors = cors(&state.settings.cors_allowed_origins);
        api::router(state)
            .merge(Readiness::new().router())
            .layer(ServerTraceLayer::new("gateway", CallerTrace::Link))
            .layer(PropagateRequestIdLayer::x_request_id())
            .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
            .layer(SetSensitiveHeadersLayer::new([AUTHORIZATION, COOKIE, SET_COOKIE]))
            .layer(CompressionLayer::new())
            .layer(tower::util::option_layer(cors))
    }

    /// Serves (with the limits of `[server]`, see [`crate::server`]) until `shutdown`.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), StartupError> {
        let server = self.server.clone();
        let proxies = TrustedProxies::parse(&self.proxies)?;
        let router = crate::server::with_request_timeout(Self::router(self.state), &server);
        let watch = self.identity.map(|identity| tokio::spawn(identity.watch()));
        let served = crate::server::serve(self.listener, router, &server, proxies, shutdown).await;
        if let Some(watch) = watch {
            watch.abort();
        }
        served.map_err(StartupError::Serve)
    }
}
