//! Bearer tokens and gateway settings for the system tests.
//!
//! The [`Stack`](crate::Stack) gateway verifies HS256 tokens signed with
//! [`TEST_JWT_SECRET`]; its client sends an [`admin_token`] by default, and
//! `Stack::place` sends a [`customer_token`] for the ordering customer.
//! RS256 tokens are signed with the test key pair in `tests/fixtures/`
//! (`jwt-rs256-test.pem`, public half in `jwks-rs256-test.json`, kid `test-key-1`);
//! a second pair (`jwt-rs256-test-2.pem`, `jwks-rs256-test-2.json`, kid
//! `test-key-2`) is the key an identity provider rotates to.

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The HS256 secret of the test gateways.
pub const TEST_JWT_SECRET: &str = "system-tests-hs256-secret";
pub const RS256_KID: &str = "test-key-1";
pub const RS256_PRIVATE_PEM: &str = include_str!("../fixtures/jwt-rs256-test.pem");
pub const RS256_JWKS: &str = include_str!("../fixtures/jwks-rs256-test.json");
pub const RS256_KID_2: &str = "test-key-2";
pub const RS256_PRIVATE_PEM_2: &str = include_str!("../fixtures/jwt-rs256-test-2.pem");
pub const RS256_JWKS_2: &str = include_str!("../fixtures/jwks-rs256-test-2.json");

/// Seconds since the epoch, `offset` from now.
pub fn epoch(offset_secs: i64) -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
        + offset_secs
}

/// `sub` with `roles`, valid for an hour.
pub fn claims(sub: &str, roles: &[&str]) -> Value {
    json!({ "sub": sub, "roles": roles, "iat": epoch(0), "exp": epoch(3600) })
}

pub fn sign_hs256(secret: &str, claims: &Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()).expect("a secret"),
    )
    .expect("HS256 signs")
}

/// Signs with the fixture RSA key, naming `kid` in the header.
pub fn sign_rs256(kid: Option<&str>, claims: &Value) -> String {
    sign_rs256_with(RS256_PRIVATE_PEM, kid, claims)
}

/// Signs with the RSA key `pem` (e.g. [`RS256_PRIVATE_PEM_2`]), naming `kid` in the header.
pub fn sign_rs256_with(pem: &str, kid: Option<&str>, claims: &Value) -> String {
    let key = EncodingKey::from_rsa_pem(pem.as_bytes()).expect("fixture RSA key");
    let mut header = Header::new(Algorithm::RS256);
    header.kid = kid.map(str::to_string);
    encode(&header, claims, &key).expect("RS256 signs")
}

/// A token with the admin role.
pub fn admin_token() -> String {
    sign_hs256(TEST_JWT_SECRET, &claims("test-admin", &["admin"]))
}

/// A customer's token: `sub` = the customer id, no roles.
pub fn customer_token(customer_id: &str) -> String {
    sign_hs256(TEST_JWT_SECRET, &claims(customer_id, &[]))
}

/// HS256 with [`TEST_JWT_SECRET`], and a rate limit high enough never to
/// matter unless a test lowers it.
pub fn use_test_auth(settings: &mut gateway::config::Settings) {
    settings.auth.jwt_secret = Some(TEST_JWT_SECRET.into());
    settings.rate_limit.per_second = 100_000;
    settings.rate_limit.burst = 100_000;
}

/// A minimal HTTP server answering every request with `body` as JSON, like
/// an identity provider's JWKS endpoint; counts the requests it served, and
/// [`JwksServer::serve`] swaps the document (a key rotation).
pub struct JwksServer {
    pub url: String,
    pub hits: Arc<AtomicUsize>,
    body: Arc<Mutex<String>>,
    hang: Arc<std::sync::atomic::AtomicBool>,
    task: JoinHandle<()>,
}

impl JwksServer {
    pub async fn start(body: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/.well-known/jwks.json", listener.local_addr().expect("addr"));
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let body = Arc::new(Mutex::new(body.to_string()));
        let served = body.clone();
        let hang = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hanging = hang.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = socket.read(&mut request).await;
                counter.fetch_add(1, Ordering::SeqCst);
                if hanging.load(Ordering::SeqCst) {
                    held.push(socket);
                    continue;
                }
                let body = served.lock().unwrap().clone();
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            }
        });
        Self { url, hits, body, hang, task }
    }

    /// From now on, accepts and reads requests but never answers (an outage that hangs).
    pub fn hang(&self) {
        self.hang.store(true, Ordering::SeqCst);
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Answers the following requests with `body` instead.
    pub fn serve(&self, body: &str) {
        *self.body.lock().unwrap() = body.to_string();
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
