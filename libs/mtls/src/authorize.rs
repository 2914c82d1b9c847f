//! [`AuthorizeLayer`]: the gRPC server layer that admits a call only from a caller the
//! [`Policy`] names for its method.

use crate::{Policy, caller_of};
use futures::future::Either;
use http::{Request, Response};
use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower::{Layer, Service};

/// Counter of refused calls, labelled `service`, `method` (the gRPC path, or `_OTHER`
/// for a method no caller may call, so a caller cannot invent series) and `caller` (the
/// identity in its certificate, `unknown` without one).
pub(crate) const DENIED_METRIC: &str = "rpc_server_denied_total";

/// Applies `policy` to every call (see the crate docs). The server must run with TLS
/// that requires client certificates: the caller is read from the certificate the
/// handshake verified.
#[derive(Clone)]
pub struct AuthorizeLayer {
    policy: Arc<Policy>,
    trust_domain: Arc<str>,
    callers: Arc<Callers>,
}

/// The identity of each certificate seen, so a certificate is parsed once, not on every
/// call. Keyed by the
/// certificate's bytes, so a new certificate is always parsed; bounded, since only the
/// services' few certificates are expected (beyond the bound, parsed every time).
#[derive(Default)]
struct Callers(std::sync::Mutex<HashMap<Vec<u8>, Option<String>>>);

const MAX_CACHED_CERTIFICATES: usize = 64;

impl Callers {
    fn of(&self, der: &[u8], trust_domain: &str) -> Option<String> {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(caller) = known.get(der) {
            return caller.clone();
        }
        let caller = caller_of(der, trust_domain);
        if known.len() < MAX_CACHED_CERTIFICATES {
            known.insert(der.to_vec(), caller.clone());
        }
        caller
    }
}

impl AuthorizeLayer {
    pub fn new(policy: Policy, trust_domain: &str) -> Self {
        for caller in policy.callers() {
            metrics::counter!(DENIED_METRIC, "service" => policy.service().to_owned(), "method" => "_OTHER",
                "caller" => caller.to_owned())
            .absolute(0);
        }
        Self { policy: Arc::new(policy), trust_domain: trust_domain.into(), callers: Arc::default() }
    }
}

impl<S> Layer<S> for AuthorizeLayer {
    type Service = Authorize<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authorize { inner, layer: self.clone() }
    }
}

/// The service of [`AuthorizeLayer`].
#[derive(Clone)]
pub struct Authorize<S> {
    inner: S,
    layer: AuthorizeLayer,
}

impl<S> Authorize<S> {
    fn caller<B>(&self, request: &Request<B>) -> Option<String> {
        let certs = request.extensions().get::<TlsConnectInfo<TcpConnectInfo>>()?.peer_certs()?;
        self.layer.callers.of(certs.first()?, &self.layer.trust_domain)
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Authorize<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<std::future::Ready<Result<S::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let path = request.uri().path();
        let caller = self.caller(&request);
        let policy = &self.layer.policy;
        if let Some(caller) = &caller
            && policy.allows(caller, path)
        {
            return Either::Right(self.inner.call(request));
        }
        let method = if policy.knows(path) { path.to_owned() } else { "_OTHER".to_owned() };
        let message = match &caller {
            Some(caller) => {
                format!(
                    "{caller} may not call {path} of {} (services.toml, [service.rpcs])",
                    policy.service()
                )
            }
            None => format!(
                "the client certificate names no service of trust domain {0} (a URI SAN spiffe://{0}/<service>): it may not call {path} of {1}",
                self.layer.trust_domain,
                policy.service()
            ),
        };
        let caller = caller.unwrap_or_else(|| "unknown".into());
        tracing::warn!(service = policy.service(), %caller, method = path, reason = %message, "gRPC call refused");
        metrics::counter!(DENIED_METRIC, "service" => policy.service().to_owned(), "method" => method,
            "caller" => caller)
        .increment(1);
        let status = tonic::Status::permission_denied(message);
        Either::Left(std::future::ready(Ok(status.into_http())))
    }
}
