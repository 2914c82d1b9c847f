//! Mutual TLS between the services, and who may call which gRPC method.
//!
//! ```text
//!   order ──TLS, order's certificate──▶ payment: TLS handshake (the CA signed it?)
//!                                       └▶ caller = "order" (its SPIFFE ID)
//!                                          └▶ Policy: may order call PaymentService/Charge?
//!                                               yes: the call goes on; no: PERMISSION_DENIED
//! ```
//!
//! * [`TlsSettings`] (`[tls]` of every service): the CA that signs the services'
//!   certificates, and this service's certificate and key. Off when empty, which
//!   only `environment = "development"` accepts.
//! * [`Identity`]: those files loaded; the server side requires a client certificate
//!   signed by the CA, the client side checks that the server's certificate names the
//!   service it meant to call (its DNS name) and shows its own. [`Identity::watch`]
//!   reads the files again every `reload_interval_ms`: changed files that parse are
//!   what the next handshake uses (connections already made keep theirs); files that
//!   do not are logged and the previous ones stay.
//! * [`incoming`] and [`TlsConnector`]: the gRPC server's and clients' TLS connections,
//!   made with the identity's material of the moment.
//! * A service's identity is the URI SAN of its certificate, `spiffe://<trust
//!   domain>/<service>`, which the server reads from the caller's certificate.
//! * [`Policy`]: the allow-list, parsed from the `services.toml` the service compiles in
//!   and hands over (this library reads no deployment file): each
//!   service's `[service.rpcs]` names the methods it calls on each callee, so the
//!   callee admits exactly those. Everything else is refused.
//! * [`topic_sources`]: from the same file, each topic's publisher, whose `ce_source`
//!   alone the consumers accept on it.
//! * [`AuthorizeLayer`]: the server layer that applies it, answering
//!   `PERMISSION_DENIED` and counting `rpc_server_denied_total{service,method,caller}`.
//! * `dev_ca` (feature `dev-ca`): the development CA of `scripts/dev-up` and the tests.

mod authorize;
#[cfg(feature = "dev-ca")]
pub mod dev_ca;
mod handshake;
mod identity;
mod material;
mod policy;
#[cfg(all(test, feature = "dev-ca"))]
mod reload_tests;
mod settings;
mod spiffe;
mod transport;

pub use authorize::{Authorize, AuthorizeLayer};
pub use identity::Identity;
pub use policy::{Policy, PolicyError, topic_sources};
pub use settings::TlsSettings;
pub(crate) use spiffe::{caller_of, spiffe_id};
pub use transport::{TlsConnector, incoming};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tls: {0} is set but not all of ca_file, cert_file and key_file are")]
    Partial(&'static str),
    #[error("tls: cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("tls: {path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("tls: {path}: {reason}")]
    Parse { path: String, reason: String },
    #[error("tls: {0:?} is not a DNS name to verify a server's certificate against")]
    ServerName(String),
    #[error(
        "tls: the certificate in {path} does not name a service of trust domain {trust_domain} (a URI SAN spiffe://{trust_domain}/<service>)"
    )]
    NoIdentity { path: String, trust_domain: String },
    #[error("tls: the certificate in {path} names {found}, not this service ({expected})")]
    WrongIdentity { path: String, found: String, expected: String },
}
