//! Gateway settings: defaults for local development, overridden by the file
//! named in `APP_CONFIG_FILE` and `APP_*` variables (see `sagaworks_config`).

pub use sagaworks_config::Environment;
use sagaworks_config::{ListenSettings, TelemetrySettings};
use sagaworks_mtls::TlsSettings;
use sagaworks_resilience::ClientSettings;
use secrecy::SecretString;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Where the gateway runs (APP_ENVIRONMENT, required): outside `development` it
    /// refuses the development secret and other unsafe shortcuts at start-up.
    pub environment: Environment,
    /// Its certificate for mutual TLS to the services (`sagaworks_mtls`).
    pub tls: TlsSettings,
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
    /// Requests per client (token subject, else client address).
    pub rate_limit: RateLimitSettings,
    /// What one client may hold of the server: connections, time to send headers, time per request.
    pub server: ServerSettings,
}

/// `[server]`: the limits of the public HTTP server (see `crate::server`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ServerSettings {
    /// A connection that has not delivered a complete request head this long after it
    /// opened (or after its last request ended) is closed: on HTTP/1 a slowloris
    /// client, on HTTP/2 one with no request in flight, e.g. that sent only the preface
    /// or a header block it never finishes (after a GOAWAY and at most
    /// `http2_keep_alive_timeout_ms` for the peer to close).
    pub header_read_timeout_ms: u64,
    /// A request that has not been answered this long after it arrived is answered 504
    /// (problem+json). Must exceed `api.order_wait_ms`.
    pub request_timeout_ms: u64,
    /// Connections served at once; the next ones wait in the listen backlog.
    pub max_connections: usize,
    /// Connections served at once from one client address (an IPv6 client by its /64);
    /// one more is closed when accepted. `rate_limit.trusted_proxies` are exempt.
    pub max_connections_per_peer: usize,
    /// An HTTP/2 connection is sent a PING this often ...
    pub http2_keep_alive_interval_ms: u64,
    /// ... and closed when the peer has not answered it within this long.
    pub http2_keep_alive_timeout_ms: u64,
    /// A connection open this long is shut down gracefully (GOAWAY, `Connection:
    /// close`); its requests have `request_timeout_ms` to finish.
    pub max_connection_age_ms: u64,
    /// A connection the server closes is first drained of what the client still sends
    /// (lingering close), for at most this long, so a client that writes a whole body
    /// before reading gets the early answer (413) and not a reset.
    pub linger_timeout_ms: u64,
    /// ... and of at most this many bytes.
    pub linger_max_bytes: usize,
}

impl ServerSettings {
    /// The first limit set to zero, which would refuse every connection or none.
    pub fn zero_limit(&self) -> Option<&'static str> {
        [
            ("server.header_read_timeout_ms", self.header_read_timeout_ms == 0),
            ("server.request_timeout_ms", self.request_timeout_ms == 0),
            ("server.max_connections", self.max_connections == 0),
            ("server.max_connections_per_peer", self.max_connections_per_peer == 0),
            ("server.http2_keep_alive_interval_ms", self.http2_keep_alive_interval_ms == 0),
            ("server.http2_keep_alive_timeout_ms", self.http2_keep_alive_timeout_ms == 0),
            ("server.max_connection_age_ms", self.max_connection_age_ms == 0),
            ("server.linger_timeout_ms", self.linger_timeout_ms == 0),
            ("server.linger_max_bytes", self.linger_max_bytes == 0),
        ]
        .into_iter()
        .find_map(|(key, zero)| zero.then_some(key))
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: 10_000,
            request_timeout_ms: 30_000,
            max_connections: 10_000,
            max_connections_per_peer: 256,
            http2_keep_alive_interval_ms: 20_000,
            http2_keep_alive_timeout_ms: 10_000,
            max_connection_age_ms: 600_000,
            linger_timeout_ms: 5_000,
            linger_max_bytes: 8 * 1024 * 1024,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            environment: Environment::default(),
            tls: TlsSettings::default(),
            http: ListenSettings::new("127.0.0.1", 8080),
            telemetry: TelemetrySettings::default(),
            order: ClientSettings::with_url("http://127.0.0.1:7081"),
            inventory: ClientSettings::with_url("http://127.0.0.1:7082"),
            payment: ClientSettings::with_url("http://127.0.0.1:7083"),
            api: ApiSettings::default(),
            auth: AuthSettings::default(),
            rate_limit: RateLimitSettings::default(),
            server: ServerSettings::default(),
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

/// The deployment profile. `development` (the default, for `scripts/dev-up`,
/// docker-compose and tests) accepts the development JWT secret; `production`
/// (the k8s prod overlay) refuses it, an HS256 secret shorter than
/// [`MIN_JWT_SECRET_BYTES`], and `auth.enabled = false`.
/// The shortest HS256 secret accepted outside development (RFC 7518 3.2: a
/// key at least as long as the hash output, 256 bits).
pub const MIN_JWT_SECRET_BYTES: usize = 32;

/// The most clock skew production takes in `auth.leeway_secs`: five minutes, the
/// tolerance Kerberos and most identity providers use. More keeps an expired (or
/// revoked, short-lived) token usable that much longer.
pub const MAX_LEEWAY_SECS: u64 = 300;

/// The HS256 secret used by `scripts/dev-up`, docker-compose and the tests.
/// Anyone can mint tokens with it: never configure it outside development.
pub const DEV_ONLY_INSECURE_JWT_SECRET: &str = "dev-only-insecure-jwt-secret";

/// `[auth]`: bearer tokens are JWTs signed with HS256 (`jwt_secret`, for
/// development) and/or RS256 with keys from a JWKS (`jwks_url`, or
/// `jwks_json` inline for offline use). Start-up fails when auth is enabled
/// and no key source is configured; there is no built-in default secret.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct AuthSettings {
    /// `false` turns authentication and authorization off (local experiments only).
    pub enabled: bool,
    /// HS256 shared secret (APP_AUTH__JWT_SECRET). Redacted in `Debug` and
    /// when serialized ([`REDACTED`]); only the token verifier (and the
    /// `mint-token` bin) read it.
    #[serde(serialize_with = "redacted")]
    pub jwt_secret: Option<SecretString>,
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
    /// Required `iss`, if set; production refuses to start without it.
    pub issuer: Option<String>,
    /// Required `aud`, if set; production refuses to start without it.
    pub audience: Option<String>,
    /// The claim holding the caller's roles (an array of strings): `roles`, or a
    /// namespaced one such as `https://sagaworks.example/roles` where the identity
    /// provider's tokens carry roles of several applications.
    pub roles_claim: String,
    /// The entry of the roles claim that grants the admin endpoints.
    pub admin_role: String,
    /// Clock skew tolerated on `exp` and `nbf`; production refuses more than
    /// [`MAX_LEEWAY_SECS`] (an expired token would stay good that long).
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
            roles_claim: "roles".into(),
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
            .field("jwt_secret", &self.jwt_secret.as_ref().map(|_| REDACTED))
            .field("jwks_url", &self.jwks_url)
            .field("jwks_json", &self.jwks_json.as_ref().map(|_| "<inline>"))
            .field("jwks_refresh_secs", &self.jwks_refresh_secs)
            .field("jwks_unknown_kid_refetch_ms", &self.jwks_unknown_kid_refetch_ms)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("roles_claim", &self.roles_claim)
            .field("admin_role", &self.admin_role)
            .field("leeway_secs", &self.leeway_secs)
            .finish()
    }
}

/// What a secret serializes as (and shows as in `Debug`).
pub const REDACTED: &str = "[REDACTED]";

/// Serializes a secret as [`REDACTED`], so the settings can be dumped (and
/// loaded: `sagaworks_config` serializes the defaults, which hold none).
fn redacted<S: Serializer>(secret: &Option<SecretString>, serializer: S) -> Result<S::Ok, S::Error> {
    match secret {
        Some(_) => serializer.serialize_some(REDACTED),
        None => serializer.serialize_none(),
    }
}

/// `[rate_limit]`: a GCRA bucket per client; `burst` requests at once, refilled
/// at `per_second`. Over the limit: 429 with Retry-After.
///
/// The client is the token's subject, else its IP address: the peer's, or,
/// when the peer is one of `trusted_proxies`, the right-most address of
/// `X-Forwarded-For` that is not itself a trusted proxy. `X-Forwarded-For`
/// from any other peer is ignored, so a client cannot pick its own bucket.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct RateLimitSettings {
    pub enabled: bool,
    pub per_second: u32,
    pub burst: u32,
    /// One request back every this many milliseconds, instead of `per_second`
    /// (for rates below one a second, e.g. `3600000`: one an hour).
    pub refill_interval_ms: Option<u64>,
    /// The reverse proxies (ingress, load balancer) in front of the gateway:
    /// IP addresses or CIDR blocks, e.g. `["10.0.0.0/8"]`; in an environment
    /// variable, comma-separated (APP_RATE_LIMIT__TRUSTED_PROXIES=10.0.0.0/8,192.0.2.7).
    /// Empty (the default): `X-Forwarded-For` is never read.
    #[serde(deserialize_with = "list_or_comma_separated")]
    pub trusted_proxies: Vec<String>,
}

impl Default for RateLimitSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            per_second: 20,
            burst: 40,
            refill_interval_ms: None,
            trusted_proxies: Vec::new(),
        }
    }
}

/// A list, or one string of comma-separated entries (how an `APP_*` variable
/// spells a list).
fn list_or_comma_separated<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrString {
        List(Vec<String>),
        String(String),
    }
    Ok(match ListOrString::deserialize(deserializer)? {
        ListOrString::List(list) => list,
        ListOrString::String(text) => {
            text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "a-very-secret-value-nobody-may-read-0123456789";

    fn with_secret() -> Settings {
        let mut settings = Settings::default();
        settings.auth.jwt_secret = Some(SECRET.into());
        settings
    }

    #[test]
    fn the_jwt_secret_never_shows_in_debug_or_serialized_settings() {
        let settings = with_secret();
        for shown in [
            format!("{settings:?}"),
            format!("{settings:#?}"),
            format!("{:?}", settings.auth),
            serde_json::to_string(&settings).unwrap(),
        ] {
            assert!(!shown.contains(SECRET), "the secret leaked: {shown}");
            assert!(shown.contains(REDACTED), "the secret is shown as set: {shown}");
        }
        let json = serde_json::to_value(Settings::default()).unwrap();
        assert_eq!(json["auth"]["jwt_secret"], serde_json::Value::Null, "no secret, nothing to redact");
    }

    #[test]
    fn the_secret_and_the_environment_load_from_the_settings_sources() {
        let settings: Settings = serde_json::from_value(serde_json::json!({
            "environment": "production",
            "auth": { "jwt_secret": SECRET },
        }))
        .unwrap();
        assert_eq!(settings.environment, Environment::Production);
        use secrecy::ExposeSecret;
        assert_eq!(settings.auth.jwt_secret.as_ref().map(|s| s.expose_secret()), Some(SECRET));
        assert_eq!(Settings::default().environment, Environment::Development);
        let unknown = serde_json::from_value::<Settings>(serde_json::json!({ "environment": "prod" }));
        assert!(unknown.is_err(), "only development and production");
    }

    #[test]
    fn every_server_limit_must_be_set() {
        assert_eq!(ServerSettings::default().zero_limit(), None);
        let unlimited = serde_json::from_value::<ServerSettings>(serde_json::json!({
            "http2_keep_alive_timeout_ms": 0,
        }))
        .unwrap();
        assert_eq!(unlimited.zero_limit(), Some("server.http2_keep_alive_timeout_ms"));
        let no_peer_cap = ServerSettings { max_connections_per_peer: 0, ..ServerSettings::default() };
        assert_eq!(no_peer_cap.zero_limit(), Some("server.max_connections_per_peer"));
    }

    #[test]
    fn trusted_proxies_are_a_list_or_a_comma_separated_string() {
        let from = |v: serde_json::Value| {
            serde_json::from_value::<RateLimitSettings>(serde_json::json!({ "trusted_proxies": v }))
                .unwrap()
                .trusted_proxies
        };
        assert_eq!(from(serde_json::json!(["10.0.0.0/8", "::1"])), ["10.0.0.0/8", "::1"]);
        assert_eq!(from(serde_json::json!("10.0.0.0/8, 192.0.2.7,")), ["10.0.0.0/8", "192.0.2.7"]);
        assert!(from(serde_json::json!("")).is_empty());
        assert!(RateLimitSettings::default().trusted_proxies.is_empty());
    }
}
