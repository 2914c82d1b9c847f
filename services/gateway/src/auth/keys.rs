//! Token verification: which key checks which token, and the JWKS cache.
//!
//! * `HS256` tokens are checked with `auth.jwt_secret` (development).
//! * `RS256` tokens are checked with the RSA key of the JWKS whose `kid`
//!   matches the token's (or the only RSA key when the token names none).
//!   Keys come from `auth.jwks_json`, or from `auth.jwks_url` through the cache
//!   of [`super::jwks`] (fetched outside any lock, stale keys during an outage).
//!
//! Any other algorithm is refused; so is a JWKS key that is not RSA, so an
//! `oct` key or an HS256 token can never be checked against public material.
//!
//! This is the one place that reads the HS256 secret (`expose_secret`);
//! outside `environment = "development"` it refuses the development secret
//! and any secret shorter than [`MIN_JWT_SECRET_BYTES`].

use super::jwks::RemoteJwks;
use crate::config::{AuthSettings, DEV_ONLY_INSECURE_JWT_SECRET, Environment, MIN_JWT_SECRET_BYTES};
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use secrecy::ExposeSecret;
use serde::Deserialize;
use std::time::Duration;

const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "auth is enabled but no signing key is configured: set auth.jwt_secret (APP_AUTH__JWT_SECRET, HS256) \
         or auth.jwks_url (APP_AUTH__JWKS_URL, RS256) or auth.jwks_json; for local development use \
         APP_AUTH__JWT_SECRET={dev}",
        dev = DEV_ONLY_INSECURE_JWT_SECRET
    )]
    NoKeys,
    #[error("auth.jwt_secret must not be empty")]
    EmptySecret,
    #[error(
        "auth.jwt_secret (APP_AUTH__JWT_SECRET) is the development-only secret, refused with \
         environment = {environment} (APP_ENVIRONMENT): set a random secret of at least \
         {MIN_JWT_SECRET_BYTES} bytes, or verify RS256 tokens with auth.jwks_url (APP_AUTH__JWKS_URL)"
    )]
    DevSecret { environment: Environment },
    #[error(
        "auth.jwt_secret (APP_AUTH__JWT_SECRET) is {bytes} bytes long, refused with \
         environment = {environment} (APP_ENVIRONMENT): use a random secret of at least \
         {MIN_JWT_SECRET_BYTES} bytes"
    )]
    ShortSecret { bytes: usize, environment: Environment },
    #[error(
        "auth.enabled = false (APP_AUTH__ENABLED) is refused with environment = {environment} \
         (APP_ENVIRONMENT): turning authentication off is for development only"
    )]
    AuthDisabled { environment: Environment },
    #[error(
        "{key} is not set, refused with environment = {environment} (APP_ENVIRONMENT): without it any \
         token the keys verify is accepted, whoever it was issued for"
    )]
    Unbound { key: &'static str, environment: Environment },
    #[error(
        "auth.jwks_url (APP_AUTH__JWKS_URL) is not https, refused with environment = {environment} \
         (APP_ENVIRONMENT): whoever is on the path could hand the gateway their own keys"
    )]
    InsecureJwks { environment: Environment },
    #[error("auth.jwks_json is not a JWKS document: {0}")]
    Jwks(#[source] serde_json::Error),
    #[error("auth.jwks_url and auth.jwks_json are both set; choose one")]
    TwoJwks,
    #[error("cannot build the JWKS HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// Why a presented token is refused.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Bad token: answered with 401.
    #[error("{0}")]
    Invalid(String),
    /// The keys could not be fetched: answered with 503.
    #[error("{0}")]
    KeysUnavailable(String),
}

/// The claims the gateway reads.
#[derive(Debug)]
pub struct Claims {
    pub sub: String,
    /// The strings of the roles claim (`auth.roles_claim`); none when it is missing or
    /// not an array (non-string entries are left out).
    pub roles: Vec<String>,
}

/// A token's claims as decoded: `sub`, and the rest to find the roles claim in.
#[derive(Deserialize)]
struct RawClaims {
    sub: String,
    #[serde(flatten)]
    other: serde_json::Map<String, serde_json::Value>,
}

enum Jwks {
    Static(JwkSet),
    Remote(RemoteJwks),
}

/// Checks bearer tokens against the configured keys and claims.
pub struct Verifier {
    secret: Option<DecodingKey>,
    jwks: Option<Jwks>,
    issuer: Option<String>,
    audience: Option<String>,
    roles_claim: String,
    leeway: u64,
}

impl Verifier {
    /// Outside [`Environment::Development`], an HS256 secret must not be the
    /// development one and must be at least [`MIN_JWT_SECRET_BYTES`] long.
    pub fn new(settings: &AuthSettings, environment: Environment) -> Result<Self, ConfigError> {
        let secret = match settings.jwt_secret.as_ref().map(|s| s.expose_secret()) {
            Some("") => return Err(ConfigError::EmptySecret),
            Some(s) => {
                let production = environment != Environment::Development;
                if s == DEV_ONLY_INSECURE_JWT_SECRET {
                    if production {
                        return Err(ConfigError::DevSecret { environment });
                    }
                    tracing::warn!("auth.jwt_secret is the development secret: anyone can mint tokens");
                } else if production && s.len() < MIN_JWT_SECRET_BYTES {
                    return Err(ConfigError::ShortSecret { bytes: s.len(), environment });
                }
                // Refuses only an empty secret, refused above.
                Some(DecodingKey::from_secret(s.as_bytes()).map_err(|_| ConfigError::EmptySecret)?)
            }
            None => None,
        };
        let jwks = match (&settings.jwks_url, &settings.jwks_json) {
            (Some(_), Some(_)) => return Err(ConfigError::TwoJwks),
            (None, Some(json)) => Some(Jwks::Static(serde_json::from_str(json).map_err(ConfigError::Jwks)?)),
            (Some(url), None) => Some(Jwks::Remote(RemoteJwks::new(
                url.clone(),
                reqwest::Client::builder().timeout(FETCH_TIMEOUT).build().map_err(ConfigError::Client)?,
                Duration::from_secs(settings.jwks_refresh_secs.max(1)),
                Duration::from_millis(settings.jwks_unknown_kid_refetch_ms),
            ))),
            (None, None) => None,
        };
        if secret.is_none() && jwks.is_none() {
            return Err(ConfigError::NoKeys);
        }
        if environment != Environment::Development {
            if settings.issuer.as_deref().is_none_or(str::is_empty) {
                return Err(ConfigError::Unbound { key: "auth.issuer (APP_AUTH__ISSUER)", environment });
            }
            if settings.audience.as_deref().is_none_or(str::is_empty) {
                return Err(ConfigError::Unbound { key: "auth.audience (APP_AUTH__AUDIENCE)", environment });
            }
            if settings.jwks_url.as_deref().is_some_and(|url| !url.starts_with("https://")) {
                return Err(ConfigError::InsecureJwks { environment });
            }
        }
        Ok(Self {
            secret,
            jwks,
            issuer: settings.issuer.clone(),
            audience: settings.audience.clone(),
            roles_claim: settings.roles_claim.clone(),
            leeway: settings.leeway_secs,
        })
    }

    /// Verifies `token` (signature, `exp`, `nbf`, `iss`, `aud`) and returns its claims.
    pub async fn verify(&self, token: &str) -> Result<Claims, VerifyError> {
        let header =
            decode_header(token).map_err(|e| VerifyError::Invalid(format!("malformed token: {e}")))?;
        let key = match header.alg {
            Algorithm::HS256 => {
                self.secret.clone().ok_or_else(|| invalid("HS256 tokens are not accepted"))?
            }
            Algorithm::RS256 => self.rsa_key(header.kid.as_deref()).await?,
            other => return Err(invalid(&format!("{other:?} tokens are not accepted"))),
        };
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        // jsonwebtoken checks `iss` / `aud` only when present, so configured ones are also required.
        let mut required = vec!["exp", "sub"];
        if let Some(iss) = &self.issuer {
            validation.set_issuer(&[iss]);
            required.push("iss");
        }
        match &self.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                required.push("aud");
            }
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        let data =
            decode::<RawClaims>(token, &key, &validation).map_err(|e| VerifyError::Invalid(describe(&e)))?;
        let RawClaims { sub, other } = data.claims;
        if sub.is_empty() {
            return Err(invalid("the token has an empty sub"));
        }
        let roles = match other.get(&self.roles_claim) {
            Some(serde_json::Value::Array(roles)) => {
                roles.iter().filter_map(|r| r.as_str().map(str::to_owned)).collect()
            }
            _ => Vec::new(),
        };
        Ok(Claims { sub, roles })
    }

    async fn rsa_key(&self, kid: Option<&str>) -> Result<DecodingKey, VerifyError> {
        match &self.jwks {
            None => Err(invalid("RS256 tokens are not accepted")),
            Some(Jwks::Static(keys)) => pick(keys, kid),
            Some(Jwks::Remote(remote)) => {
                let keys = remote
                    .keys(|keys| pick(keys, kid).is_ok())
                    .await
                    .map_err(|super::jwks::Unavailable::NoKeys(why)| VerifyError::KeysUnavailable(why))?;
                pick(&keys, kid)
            }
        }
    }
}

fn invalid(message: &str) -> VerifyError {
    VerifyError::Invalid(message.to_string())
}

/// The RSA key named `kid`, or the only RSA key when the token names none.
fn pick(keys: &JwkSet, kid: Option<&str>) -> Result<DecodingKey, VerifyError> {
    let mut rsa = keys.keys.iter().filter(|k| matches!(k.algorithm, AlgorithmParameters::RSA(_)));
    let jwk = match kid {
        Some(kid) => rsa.find(|k| k.common.key_id.as_deref() == Some(kid)),
        None => match (rsa.next(), rsa.next()) {
            (Some(only), None) => Some(only),
            _ => None,
        },
    };
    let jwk = jwk.ok_or_else(|| invalid("no signing key matches the token's kid"))?;
    DecodingKey::from_jwk(jwk).map_err(|e| VerifyError::Invalid(format!("unusable signing key: {e}")))
}

fn describe(e: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::ExpiredSignature => "the token has expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet".into(),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::InvalidAudience => "the token is for another audience".into(),
        ErrorKind::InvalidIssuer => "the token is from another issuer".into(),
        ErrorKind::MissingRequiredClaim(c) => format!("the token lacks the {c} claim"),
        _ => format!("invalid token: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    const DEV: Environment = Environment::Development;
    const PROD: Environment = Environment::Production;

    fn settings() -> AuthSettings {
        AuthSettings { jwt_secret: Some("unit-test-secret".into()), ..Default::default() }
    }

    fn token(secret: &str, claims: serde_json::Value) -> String {
        encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.as_bytes()).unwrap())
            .unwrap()
    }

    fn exp(offset_secs: i64) -> i64 {
        chrono::Utc::now().timestamp() + offset_secs
    }

    #[test]
    fn no_key_source_is_a_start_up_error() {
        let err = Verifier::new(&AuthSettings::default(), DEV).err().expect("refused");
        assert!(matches!(err, ConfigError::NoKeys));
        assert!(err.to_string().contains("APP_AUTH__JWT_SECRET"), "{err}");
        let empty = AuthSettings { jwt_secret: Some("".into()), ..Default::default() };
        assert!(matches!(Verifier::new(&empty, DEV), Err(ConfigError::EmptySecret)));
        let bad = AuthSettings { jwks_json: Some("{".into()), ..Default::default() };
        assert!(matches!(Verifier::new(&bad, DEV), Err(ConfigError::Jwks(_))));
    }

    #[test]
    fn outside_development_the_dev_secret_and_short_secrets_are_refused() {
        let with = |secret: &str| AuthSettings {
            jwt_secret: Some(secret.into()),
            issuer: Some("https://idp.example/".into()),
            audience: Some("sagaworks".into()),
            ..Default::default()
        };
        let dev_secret = with(DEV_ONLY_INSECURE_JWT_SECRET);
        let err = Verifier::new(&dev_secret, PROD).err().expect("the dev secret is refused in production");
        assert!(matches!(err, ConfigError::DevSecret { .. }), "{err}");
        let message = err.to_string();
        for names in ["APP_AUTH__JWT_SECRET", "APP_ENVIRONMENT", "production"] {
            assert!(message.contains(names), "{message}");
        }
        assert!(!message.contains(DEV_ONLY_INSECURE_JWT_SECRET), "the error repeats the secret: {message}");
        let short = "0123456789abcdef0123456789abcde"; // 31 bytes
        let err = Verifier::new(&with(short), PROD).err().expect("a short secret is refused in production");
        assert!(matches!(err, ConfigError::ShortSecret { bytes: 31, .. }), "{err}");
        assert!(!err.to_string().contains(short), "{err}");
        assert!(Verifier::new(&with(&format!("{short}f")), PROD).is_ok(), "32 bytes are enough");
        // Development takes both, and RS256-only production needs no secret.
        assert!(Verifier::new(&dev_secret, DEV).is_ok());
        assert!(Verifier::new(&with(short), DEV).is_ok());
        let jwks_only =
            AuthSettings { jwt_secret: None, jwks_json: Some(r#"{"keys":[]}"#.into()), ..with("x") };
        assert!(Verifier::new(&jwks_only, PROD).is_ok());
    }

    #[test]
    fn outside_development_tokens_must_be_bound_to_an_issuer_and_audience_and_keys_come_over_https() {
        let strong = "a-production-secret-of-more-than-32-bytes-3f9c1e";
        let bound = AuthSettings {
            jwt_secret: Some(strong.into()),
            issuer: Some("https://idp.example/".into()),
            audience: Some("sagaworks".into()),
            ..Default::default()
        };
        assert!(Verifier::new(&bound, PROD).is_ok());
        let cases = [
            (AuthSettings { issuer: None, ..bound.clone() }, "APP_AUTH__ISSUER"),
            (AuthSettings { issuer: Some(String::new()), ..bound.clone() }, "APP_AUTH__ISSUER"),
            (AuthSettings { audience: None, ..bound.clone() }, "APP_AUTH__AUDIENCE"),
            (
                AuthSettings {
                    jwt_secret: None,
                    jwks_url: Some("http://idp.example/jwks".into()),
                    ..bound.clone()
                },
                "APP_AUTH__JWKS_URL",
            ),
        ];
        for (settings, key) in cases {
            let err = Verifier::new(&settings, PROD).err().unwrap_or_else(|| panic!("{key}: accepted"));
            assert!(err.to_string().contains(key) && err.to_string().contains("production"), "{err}");
            assert!(Verifier::new(&settings, DEV).is_ok(), "{key}: development accepts it");
        }
    }

    #[tokio::test]
    async fn the_roles_come_from_the_configured_claim() {
        let namespaced = "https://sagaworks.example/roles";
        let v = Verifier::new(&AuthSettings { roles_claim: namespaced.into(), ..settings() }, DEV).unwrap();
        let claims = json!({"sub": "c1", "roles": ["admin"], namespaced: ["ops", 7], "exp": exp(60)});
        let roles = v.verify(&token("unit-test-secret", claims)).await.unwrap().roles;
        assert_eq!(roles, ["ops"], "the namespaced claim, not `roles`; non-strings left out");
        let no_array = json!({"sub": "c1", namespaced: "admin", "exp": exp(60)});
        assert!(v.verify(&token("unit-test-secret", no_array)).await.unwrap().roles.is_empty());
    }

    #[tokio::test]
    async fn hs256_claims_are_checked() {
        let v = Verifier::new(&settings(), DEV).unwrap();
        let ok = token("unit-test-secret", json!({"sub": "c1", "roles": ["admin"], "exp": exp(60)}));
        let claims = v.verify(&ok).await.unwrap();
        assert_eq!((claims.sub.as_str(), claims.roles), ("c1", vec!["admin".to_string()]));

        let wrong_secret = token("other", json!({"sub": "c1", "exp": exp(60)}));
        let expired = token("unit-test-secret", json!({"sub": "c1", "exp": exp(-120)}));
        let no_sub = token("unit-test-secret", json!({"exp": exp(60)}));
        let no_exp = token("unit-test-secret", json!({"sub": "c1"}));
        for bad in [wrong_secret, expired, no_sub, no_exp, "not.a.jwt".into()] {
            assert!(matches!(v.verify(&bad).await, Err(VerifyError::Invalid(_))), "{bad} accepted");
        }
    }

    #[tokio::test]
    async fn issuer_and_audience_are_enforced_when_configured() {
        let s = AuthSettings { issuer: Some("idp".into()), audience: Some("sagaworks".into()), ..settings() };
        let v = Verifier::new(&s, DEV).unwrap();
        let good =
            token("unit-test-secret", json!({"sub": "c", "exp": exp(60), "iss": "idp", "aud": "sagaworks"}));
        assert!(v.verify(&good).await.is_ok());
        let wrong_aud =
            token("unit-test-secret", json!({"sub": "c", "exp": exp(60), "iss": "idp", "aud": "x"}));
        let wrong_iss =
            token("unit-test-secret", json!({"sub": "c", "exp": exp(60), "iss": "x", "aud": "sagaworks"}));
        let no_aud = token("unit-test-secret", json!({"sub": "c", "exp": exp(60), "iss": "idp"}));
        let no_iss = token("unit-test-secret", json!({"sub": "c", "exp": exp(60), "aud": "sagaworks"}));
        for bad in [wrong_aud, wrong_iss, no_aud, no_iss] {
            assert!(matches!(v.verify(&bad).await, Err(VerifyError::Invalid(_))));
        }
    }

    #[tokio::test]
    async fn hs256_is_refused_when_only_a_jwks_is_configured() {
        let s = AuthSettings { jwks_json: Some(r#"{"keys":[]}"#.into()), ..Default::default() };
        let v = Verifier::new(&s, DEV).unwrap();
        let t = token("anything", json!({"sub": "c", "exp": exp(60)}));
        assert!(matches!(v.verify(&t).await, Err(VerifyError::Invalid(m)) if m.contains("HS256")));
    }
}
