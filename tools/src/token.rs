//! Bearer tokens for the gateway: none, one fixed token (`SW_TOKEN`), or
//! HS256 tokens minted with the gateway's shared secret (`SW_JWT_SECRET`; in
//! development the gateway's `DEV_ONLY_INSECURE_JWT_SECRET`). Minted tokens
//! are an admin token (`roles: ["admin"]`) for seeding and one per customer
//! (`sub` = customer id) for its orders, so each customer acts for itself and
//! has its own rate-limit bucket, like real clients.

use crate::ToolError;
use jsonwebtoken::{EncodingKey, Header, encode};
use serde::Serialize;

/// Tokens live this long; a run must be shorter.
const LIFETIME_SECS: i64 = 4 * 3600;

#[derive(Clone)]
pub enum Tokens {
    /// No `Authorization` header (a gateway with auth disabled).
    None,
    /// The same token on every call.
    Fixed(String),
    /// Minted per call with the HS256 secret.
    Minted(Minter),
}

#[derive(Clone)]
pub struct Minter {
    key: EncodingKey,
    issuer: Option<String>,
    audience: Option<String>,
}

#[derive(Serialize)]
struct Claims<'a> {
    sub: &'a str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    roles: &'a [&'a str],
    iat: i64,
    exp: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    iss: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aud: Option<&'a str>,
}

impl Minter {
    /// Fails on an empty `secret`.
    pub fn new(secret: &str, issuer: Option<String>, audience: Option<String>) -> Result<Self, ToolError> {
        Ok(Self { key: EncodingKey::from_secret(secret.as_bytes())?, issuer, audience })
    }

    /// An HS256 JWT for `sub` with `roles`, valid from now for a few hours.
    pub fn mint(&self, sub: &str, roles: &[&str]) -> Result<String, ToolError> {
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            sub,
            roles,
            iat: now,
            exp: now + LIFETIME_SECS,
            iss: self.issuer.as_deref(),
            aud: self.audience.as_deref(),
        };
        Ok(encode(&Header::default(), &claims, &self.key)?)
    }
}

impl Tokens {
    /// From the environment: `SW_TOKEN` (fixed), else `SW_JWT_SECRET` (minted,
    /// with `SW_JWT_ISSUER` / `SW_JWT_AUDIENCE` if the gateway requires them), else none.
    pub fn from_env() -> Result<Self, ToolError> {
        let var = |name: &str| std::env::var(name).ok();
        Self::from_parts(var("SW_TOKEN"), var("SW_JWT_SECRET"), var("SW_JWT_ISSUER"), var("SW_JWT_AUDIENCE"))
    }

    /// A fixed `token`, else minted with `secret` (and `issuer` / `audience`
    /// if given), else none; an empty value counts as not given.
    pub fn from_parts(
        token: Option<String>,
        secret: Option<String>,
        issuer: Option<String>,
        audience: Option<String>,
    ) -> Result<Self, ToolError> {
        let given = |v: Option<String>| v.filter(|v| !v.is_empty());
        if let Some(token) = given(token) {
            return Ok(Self::Fixed(token));
        }
        Ok(match given(secret) {
            Some(secret) => Self::Minted(Minter::new(&secret, given(issuer), given(audience))?),
            None => Self::None,
        })
    }

    /// For the admin endpoints.
    pub fn admin(&self) -> Result<Option<String>, ToolError> {
        match self {
            Self::None => Ok(None),
            Self::Fixed(t) => Ok(Some(t.clone())),
            Self::Minted(m) => m.mint("sagaworks-tools", &["admin"]).map(Some),
        }
    }

    /// For calls on behalf of `customer_id`.
    pub fn customer(&self, customer_id: &str) -> Result<Option<String>, ToolError> {
        match self {
            Self::None => Ok(None),
            Self::Fixed(t) => Ok(Some(t.clone())),
            Self::Minted(m) => m.mint(customer_id, &[]).map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode};

    #[derive(serde::Deserialize)]
    struct Decoded {
        sub: String,
        #[serde(default)]
        roles: Vec<String>,
        aud: Option<String>,
    }

    #[test]
    fn minted_tokens_verify_with_the_secret_and_carry_sub_roles_and_audience() {
        let tokens = Tokens::Minted(Minter::new("s3cret", None, Some("sagaworks".into())).unwrap());
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&["sagaworks"]);
        validation.set_required_spec_claims(&["exp", "sub"]);
        let key = DecodingKey::from_secret(b"s3cret").unwrap();

        let admin = tokens.admin().unwrap().unwrap();
        let claims = decode::<Decoded>(&admin, &key, &validation).unwrap().claims;
        assert_eq!(claims.roles, vec!["admin".to_string()]);
        assert_eq!(claims.aud.as_deref(), Some("sagaworks"));

        let customer = tokens.customer("c-42").unwrap().unwrap();
        let claims = decode::<Decoded>(&customer, &key, &validation).unwrap().claims;
        assert_eq!(claims.sub, "c-42");
        assert!(claims.roles.is_empty());

        assert!(
            decode::<Decoded>(&customer, &DecodingKey::from_secret(b"other").unwrap(), &validation).is_err()
        );
        assert_eq!(Tokens::None.customer("c").unwrap(), None);
        assert_eq!(Tokens::Fixed("t".into()).admin().unwrap().as_deref(), Some("t"));
    }
}
