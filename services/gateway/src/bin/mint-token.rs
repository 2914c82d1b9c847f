//! `mint-token`: prints an HS256 bearer token signed with the gateway's
//! `auth.jwt_secret` (read like the gateway reads it: `APP_CONFIG_FILE`,
//! `APP_AUTH__JWT_SECRET`). For development, scripts and fuzzing only.
//!
//! ```text
//! mint-token --sub <subject> [--role <role>]... [--ttl-secs <seconds>]
//! TOKEN=$(cargo run -q -p gateway --bin mint-token -- --sub ops --role admin)
//! ```

use anyhow::{Context, bail};
use jsonwebtoken::{EncodingKey, Header, encode};
use serde_json::json;

const USAGE: &str = "usage: mint-token --sub <subject> [--role <role>]... [--ttl-secs <seconds>]";

fn main() -> anyhow::Result<()> {
    let settings: gateway::config::Settings = sagaworks_config::load()?;
    let Some(secret) = settings.auth.jwt_secret.filter(|s| !s.is_empty()) else {
        bail!("auth.jwt_secret is not set (APP_AUTH__JWT_SECRET); only HS256 tokens can be minted here");
    };
    let (mut sub, mut roles, mut ttl) = (None, Vec::new(), 3600_i64);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--sub" => sub = Some(value),
            "--role" => roles.push(value),
            "--ttl-secs" => ttl = value.parse().with_context(|| format!("--ttl-secs {value}\n{USAGE}"))?,
            _ => bail!("unknown argument {flag}\n{USAGE}"),
        }
    }
    let sub = sub.context(USAGE)?;
    let now = chrono::Utc::now().timestamp();
    let mut claims = json!({ "sub": sub, "roles": roles, "iat": now, "exp": now + ttl });
    if let Some(iss) = settings.auth.issuer {
        claims["iss"] = iss.into();
    }
    if let Some(aud) = settings.auth.audience {
        claims["aud"] = aud.into();
    }
    let token = encode(&Header::default(), &claims, &EncodingKey::from_secret(secret.as_bytes()))?;
    println!("{token}");
    Ok(())
}
