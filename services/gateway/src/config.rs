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
    /// Who may call the API (JWT bearer tokens).
    pub auth: AuthSettings,
    /// Requests per client (token subject, else client IP).
    pub rate_limit: RateLimitSettings,
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
            auth: AuthSettings::default(),
            rate_limit: RateLimitSettings::default(),
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
    /// A trace in the tracing UI (Jaeger), `{trace_id}` replaced: the admin
    /// saga view links to it.
    pub trace_url: String,
    /// Origins a browser may call the API from (CORS), e.g.
    /// `["https://shop.example.com"]`; empty (the default): no CORS headers,
    /// so browsers allow same-origin calls only.
    pub cors_allowed_origins: Vec<String>,
}

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            order_wait_ms: 5_000,
            max_body_bytes: 64 * 1024,
            trace_url: "http://127.0.0.1:16686/trace/{trace_id}".into(),
            cors_allowed_origins: Vec::new(),
        }
    }
}

/// The HS256 secret used by `scripts/dev-up`, docker-compose and the tests.
/// Anyone can mint tokens with it: never configure it outside development.
pub const DEV_ONLY_INSECURE_JWT_SECRET: &str = "dev-only-insecure-jwt-secret";

/// `[auth]`: bearer tokens are JWTs signed with HS256 (`jwt_secret`, for
/// development) and/or RS256 with keys from a JWKS (`jwks_url`, or
/// `jwks_json` inline for offline use). Start-up fails when auth is enabled
/// and no key source is configured; there is no built-in default secret.
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct AuthSettings {
    /// `false` turns authentication and authorization off (local experiments only).
    pub enabled: bool,
    /// HS256 shared secret (APP_AUTH__JWT_SECRET).
    pub jwt_secret: Option<String>,
    /// JWKS endpoint of the identity provider for RS256 tokens (APP_AUTH__JWKS_URL).
    pub jwks_url: Option<String>,
    /// A JWKS document inline, instead of fetching `jwks_url`.
    pub jwks_json: Option<String>,
    /// Fetched keys are refreshed after this long (and on an unknown `kid`, see below).
    pub jwks_refresh_secs: u64,
    /// A token naming a `kid` the fetched keys lack makes the gateway fetch
    /// them again (key rotation), at most once per this interval (10 s), so
    /// unknown-`kid` tokens cannot flood the identity provider.
    pub jwks_unknown_kid_refetch_ms: u64,
    /// Required `iss`, if set.
    pub issuer: Option<String>,
    /// Required `aud`, if set.
    pub audience: Option<String>,
    /// The entry of the token's `roles` array that grants the admin endpoints.
    pub admin_role: String,
    /// Clock skew tolerated on `exp` and `nbf`.
    pub leeway_secs: u64,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            jwt_secret: None,
            jwks_url: None,
            jwks_json: None,
            jwks_refresh_secs: 300,
            jwks_unknown_kid_refetch_ms: 10_000,
            issuer: None,
            audience: None,
            admin_role: "admin".into(),
            leeway_secs: 30,
        }
    }
}

/// Secrets stay out of logs.
impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("enabled", &self.enabled)
            .field("jwt_secret", &self.jwt_secret.as_ref().map(|_| "<redacted>"))
            .field("jwks_url", &self.jwks_url)
            .field("jwks_json", &self.jwks_json.as_ref().map(|_| "<inline>"))
            .field("jwks_refresh_secs", &self.jwks_refresh_secs)
            .field("jwks_unknown_kid_refetch_ms", &self.jwks_unknown_kid_refetch_ms)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("admin_role", &self.admin_role)
            .field("leeway_secs", &self.leeway_secs)
            .finish()
    }
}

/// `[rate_limit]`: a GCRA bucket per client; `burst` requests at once, refilled
/// at `per_second`. Over the limit: 429 with Retry-After.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct RateLimitSettings {
    pub enabled: bool,
    pub per_second: u32,
    pub burst: u32,
}

impl Default for RateLimitSettings {
    fn default() -> Self {
        Self { enabled: true, per_second: 20, burst: 40 }
    }
}
