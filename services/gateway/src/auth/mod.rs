//! Who is calling, and what they may do: the one place for authentication
//! and authorization.
//!
//! [`guard`] runs in front of every `/v1` route: it verifies the bearer token
//! ([`keys::Verifier`]), charges the caller's rate-limit bucket, and stores the
//! [`Caller`] in the request. Handlers take a [`Caller`] (any authenticated
//! client) or an [`Admin`] (a caller with the admin role) and check ownership
//! with [`Caller::may_act_for`]. `/health/*`, `/metrics` and `/openapi.json`
//! are outside the guard.

mod jwks;
pub mod keys;

use crate::config::{AuthSettings, Environment};
use crate::error::ApiError;
use crate::ratelimit::Limiter;
use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use keys::{ConfigError, Verifier, VerifyError};
use std::net::SocketAddr;
use std::sync::Arc;

/// An authenticated client: the token's `sub` and `roles`.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    pub subject: String,
    pub roles: Vec<String>,
    admin: bool,
}

impl Caller {
    pub fn is_admin(&self) -> bool {
        self.admin
    }

    /// Admins act for everyone; a customer only for itself (`sub` == customer id).
    pub fn may_act_for(&self, customer_id: &str) -> Result<(), ApiError> {
        if self.admin || self.subject == customer_id {
            Ok(())
        } else {
            Err(ApiError::Forbidden("this resource belongs to another customer".into()))
        }
    }

    /// Whether this caller may see a resource of `customer_id`: as [`Self::may_act_for`],
    /// but another customer's resource is answered as missing (`hidden`, the answer of an
    /// unknown id), so that a 403 does not tell that it exists.
    pub fn may_see(&self, customer_id: &str, hidden: impl FnOnce() -> ApiError) -> Result<(), ApiError> {
        self.may_act_for(customer_id).map_err(|_| hidden())
    }

    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.admin {
            Ok(())
        } else {
            Err(ApiError::Forbidden("this endpoint needs the admin role".into()))
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        // Set by `guard`; missing only on a route the guard does not cover.
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::Unauthenticated("no bearer token".into()))
    }
}

/// A [`Caller`] with the admin role; anyone else gets 403.
#[derive(Debug, Clone)]
pub struct Admin(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        caller.require_admin()?;
        Ok(Admin(caller))
    }
}

/// Token verification plus the admin role name; `verifier` is `None` when
/// auth is disabled, and then every request acts as an admin.
pub struct Authenticator {
    verifier: Option<Verifier>,
    admin_role: String,
}

impl Authenticator {
    /// Outside development, auth must be on and an HS256 secret strong (see [`Verifier::new`]).
    pub fn new(settings: &AuthSettings, environment: Environment) -> Result<Self, ConfigError> {
        if !settings.enabled && environment != Environment::Development {
            return Err(ConfigError::AuthDisabled { environment });
        }
        let verifier = if settings.enabled { Some(Verifier::new(settings, environment)?) } else { None };
        if verifier.is_none() {
            tracing::warn!("auth.enabled = false: every request is treated as an admin");
        }
        Ok(Self { verifier, admin_role: settings.admin_role.clone() })
    }

    /// The caller named by the `Authorization: Bearer` header; `None` when auth is disabled.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Option<Caller>, ApiError> {
        let Some(verifier) = &self.verifier else { return Ok(None) };
        let token = bearer(headers)?;
        let claims = verifier.verify(token).await.map_err(|e| match e {
            VerifyError::Invalid(why) => ApiError::Unauthenticated(why),
            VerifyError::KeysUnavailable(why) => ApiError::KeysUnavailable(why),
        })?;
        let admin = claims.roles.contains(&self.admin_role);
        Ok(Some(Caller { subject: claims.sub, roles: claims.roles, admin }))
    }
}

fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| ApiError::Unauthenticated("no bearer token".into()))?
        .to_str()
        .map_err(|_| ApiError::Unauthenticated("the Authorization header is not ASCII".into()))?;
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() => {
            Ok(token.trim())
        }
        _ => Err(ApiError::Unauthenticated("expected Authorization: Bearer <token>".into())),
    }
}

/// What [`guard`] needs, and no more (so this module does not depend on the
/// API's state, which depends on it).
#[derive(Clone)]
pub struct Gate {
    pub auth: Arc<Authenticator>,
    /// `None` when rate limiting is disabled.
    pub limiter: Option<Arc<Limiter>>,
}

/// Middleware of the `/v1` routes: authenticate, rate-limit (per subject,
/// else per client IP, so failed logins are limited too; behind a trusted
/// proxy the IP comes from `X-Forwarded-For`, see [`crate::ratelimit`]), then run the handler
/// with the [`Caller`] in the request's extensions.
pub async fn guard(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    let caller = gate.auth.authenticate(req.headers()).await;
    if let Some(limiter) = &gate.limiter {
        let subject = match &caller {
            Ok(Some(c)) => Some(c.subject.as_str()),
            _ => None,
        };
        let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(addr)| *addr);
        let key = limiter.key(subject, peer, req.headers());
        if let Err(limited) = limiter.check(&key) {
            return limited.into_response();
        }
    }
    let caller = match caller {
        Ok(Some(c)) => c,
        Ok(None) => Caller { subject: "anonymous".into(), roles: Vec::new(), admin: true },
        Err(e) => return e.into_response(),
    };
    req.extensions_mut().insert(caller);
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn customer(sub: &str) -> Caller {
        Caller { subject: sub.into(), roles: vec!["customer".into()], admin: false }
    }

    #[test]
    fn ownership_and_admin_rules() {
        let c = customer("c1");
        assert!(c.may_act_for("c1").is_ok());
        assert!(matches!(c.may_act_for("c2"), Err(ApiError::Forbidden(_))));
        assert!(matches!(c.require_admin(), Err(ApiError::Forbidden(_))));
        let admin = Caller { admin: true, ..customer("ops") };
        assert!(admin.may_act_for("c2").is_ok() && admin.require_admin().is_ok());
    }

    #[test]
    fn bearer_header_parsing() {
        let mut h = HeaderMap::new();
        assert!(bearer(&h).is_err());
        for bad in ["Basic abc", "Bearer", "Bearer   ", "token"] {
            h.insert(header::AUTHORIZATION, HeaderValue::from_static(bad));
            assert!(bearer(&h).is_err(), "{bad} accepted");
        }
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("bearer abc.def.ghi"));
        assert_eq!(bearer(&h).unwrap(), "abc.def.ghi");
    }
}
