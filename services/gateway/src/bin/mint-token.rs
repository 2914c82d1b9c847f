//! `mint-token`: prints an HS256 bearer token signed with the gateway's
//! `auth.jwt_secret` (read like the gateway reads it: `APP_CONFIG_FILE`,
//! `APP_AUTH__JWT_SECRET`). For development, scripts and fuzzing only.
//!
//! `scripts/dev-up` builds it with the gateway (`target/<profile>/mint-token`):
//!
//! ```text
//! TOKEN=$(target/release/mint-token --sub ops --role admin)
//! ```

use anyhow::bail;
use clap::Parser;
use jsonwebtoken::{EncodingKey, Header, encode};
use secrecy::ExposeSecret;
use serde_json::json;

/// Print an HS256 bearer token for the gateway, signed with its development secret.
///
/// The secret, issuer and audience are read as the gateway reads them: the TOML file named
/// by APP_CONFIG_FILE, then APP_AUTH__JWT_SECRET, APP_AUTH__ISSUER, APP_AUTH__AUDIENCE.
/// A gateway that verifies RS256 tokens against a JWKS needs tokens from its identity
/// provider instead.
#[derive(Debug, Parser)]
#[command(
    name = "mint-token",
    version,
    after_help = "Examples:\n  mint-token --sub ops --role admin\n  mint-token --sub 7f3c0a4e-5b1d-4c2e-9a57-0d7c5e1f2a3b   # a customer"
)]
struct Args {
    /// The token's subject: a customer id for a customer's token, any name for an operator.
    #[arg(long, value_name = "SUBJECT", value_parser = non_empty)]
    sub: String,

    /// A role in the token's `roles` claim (repeat for several), e.g. `admin`.
    #[arg(long = "role", value_name = "ROLE")]
    roles: Vec<String>,

    /// Lifetime in seconds (`exp` = now + this).
    #[arg(long, value_name = "SECS", default_value_t = 3600, value_parser = clap::value_parser!(i64).range(1..))]
    ttl_secs: i64,
}

fn non_empty(s: &str) -> Result<String, String> {
    if s.trim().is_empty() { Err("must not be empty".into()) } else { Ok(s.to_string()) }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let settings: gateway::config::Settings = sagaworks_config::load()?;
    let Some(secret) = settings.auth.jwt_secret.filter(|s| !s.expose_secret().is_empty()) else {
        bail!("auth.jwt_secret is not set (APP_AUTH__JWT_SECRET); only HS256 tokens can be minted here");
    };
    let now = chrono::Utc::now().timestamp();
    let mut claims = json!({ "sub": args.sub, "roles": args.roles, "iat": now, "exp": now + args.ttl_secs });
    if let Some(iss) = settings.auth.issuer {
        claims["iss"] = iss.into();
    }
    if let Some(aud) = settings.auth.audience {
        claims["aud"] = aud.into();
    }
    let key = EncodingKey::from_secret(secret.expose_secret().as_bytes())?;
    let token = encode(&Header::default(), &claims, &key)?;
    println!("{token}");
    Ok(())
}
