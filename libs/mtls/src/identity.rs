//! A service's TLS identity: its certificate and key and the CA it trusts, read again
//! from their files whenever they change.

use crate::material::{Files, Material};
use crate::{TlsError, TlsSettings};
use rustls::crypto::CryptoProvider;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig};

/// Counter of the attempts to load changed certificate files, labelled `service` and
/// `outcome`: `loaded` (new handshakes use them) or `rejected` (unreadable, unparseable
/// or not this service's: the previous ones stay in use, and an error is logged).
pub(crate) const RELOADS_METRIC: &str = "tls_certificate_reloads_total";

/// Gauge of the `notAfter` of the certificate in use, seconds since the epoch, labelled
/// `service`: an alert can fire before a certificate that is not being renewed expires.
pub(crate) const EXPIRY_METRIC: &str = "tls_certificate_expiry_timestamp_seconds";

/// A service's certificate, key and CA bundle, loaded from [`TlsSettings`]. Clones share
/// them: [`Identity::reload`] (run every `reload_interval_ms` by [`Identity::watch`])
/// replaces them for every clone, and each TLS handshake uses what is current when it
/// starts. Connections already made keep theirs.
#[derive(Clone)]
pub struct Identity {
    shared: Arc<Shared>,
}

struct Shared {
    service: String,
    settings: TlsSettings,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<Material>>,
    /// What the polls have read so far.
    seen: Mutex<Seen>,
}

/// The files as last settled (loaded, or reported unusable: a rejected version is
/// reported once, not on every poll), and an unusable version read once and not yet
/// reported: a certificate and key written one after the other can be read half
/// written, so an unusable version counts only when the next poll reads it unchanged.
struct Seen {
    settled: Files,
    unsettled: Option<Files>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("service", &self.shared.service)
            .field("trust_domain", &self.shared.settings.trust_domain)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Loads the files of `settings` for `service`; `None` when TLS is off. Fails when
    /// only some files are named, one cannot be read or parsed, the key is not the
    /// certificate's, or the certificate does not name `service` in the trust domain (a
    /// certificate mounted for the wrong service).
    pub fn load(settings: &TlsSettings, service: &str) -> Result<Option<Self>, TlsError> {
        if !settings.enabled() {
            return Ok(None);
        }
        for (key, value) in [
            ("ca_file", &settings.ca_file),
            ("cert_file", &settings.cert_file),
            ("key_file", &settings.key_file),
        ] {
            if value.is_empty() {
                return Err(TlsError::Partial(key));
            }
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let files = Files::read(settings)?;
        let material = Material::parse(files.clone(), settings, service, &provider)?;
        for outcome in ["loaded", "rejected"] {
            metrics::counter!(RELOADS_METRIC, "service" => service.to_owned(), "outcome" => outcome)
                .absolute(0);
        }
        metrics::gauge!(EXPIRY_METRIC, "service" => service.to_owned()).set(material.not_after as f64);
        Ok(Some(Self {
            shared: Arc::new(Shared {
                service: service.to_owned(),
                settings: settings.clone(),
                provider,
                current: RwLock::new(Arc::new(material)),
                seen: Mutex::new(Seen { settled: files, unsettled: None }),
            }),
        }))
    }

    pub fn service(&self) -> &str {
        &self.shared.service
    }

    pub fn trust_domain(&self) -> &str {
        &self.shared.settings.trust_domain
    }

    pub(crate) fn provider(&self) -> &Arc<CryptoProvider> {
        &self.shared.provider
    }

    /// What handshakes use now.
    pub(crate) fn current(&self) -> Arc<Material> {
        Arc::clone(&self.shared.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The serial number (hex) of the certificate in use.
    pub fn serial(&self) -> String {
        self.current().serial.clone()
    }

    /// Reads the files again. When any of them changed since they were last settled,
    /// parses them as [`Identity::load`] does: on success they are what the next
    /// handshake uses (`Ok(true)`). Unusable files are reported (logged and counted, the
    /// material in use stays: `Err`) only when the next call reads them unchanged: the
    /// first time they may be a rotation caught half written (`Ok(false)`). Unchanged
    /// files: `Ok(false)`.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let shared = &self.shared;
        let service = shared.service.clone();
        let result = Files::read(&shared.settings).and_then(|files| {
            let mut seen = shared.seen.lock().unwrap_or_else(|p| p.into_inner());
            if seen.settled == files {
                return Ok(None);
            }
            match Material::parse(files.clone(), &shared.settings, &service, &shared.provider) {
                Err(e) if seen.unsettled.as_ref() != Some(&files) => {
                    tracing::debug!(%service, error = %e, "tls: the changed certificate files are not usable yet; read again at the next poll");
                    seen.unsettled = Some(files);
                    Ok(None)
                }
                parsed => {
                    *seen = Seen { settled: files, unsettled: None };
                    parsed.map(Some)
                }
            }
        });
        match result {
            Ok(None) => Ok(false),
            Ok(Some(material)) => {
                tracing::info!(%service, serial = %material.serial, "tls: certificate files changed; new connections use them");
                metrics::gauge!(EXPIRY_METRIC, "service" => service.clone()).set(material.not_after as f64);
                metrics::counter!(RELOADS_METRIC, "service" => service, "outcome" => "loaded").increment(1);
                *shared.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(material);
                Ok(true)
            }
            Err(e) => {
                tracing::error!(%service, error = %e, "tls: the changed certificate files are not usable; the previous ones stay in use");
                metrics::counter!(RELOADS_METRIC, "service" => service, "outcome" => "rejected").increment(1);
                Err(e)
            }
        }
    }

    /// Runs [`Identity::reload`] every `reload_interval_ms` (on a blocking thread: it
    /// reads files), forever; never returns when the interval is 0 (no reloading).
    pub async fn watch(self) {
        let interval = self.shared.settings.reload_interval_ms;
        if interval == 0 {
            return std::future::pending().await;
        }
        let mut tick = tokio::time::interval(Duration::from_millis(interval));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let identity = self.clone();
            // The outcome is logged and counted by `reload`.
            let _ = tokio::task::spawn_blocking(move || identity.reload()).await;
        }
    }

    /// A TLS configuration of tonic's for a one-off client of `downstream` (a test, a
    /// tool), from the files as they are now: the server must show a certificate from
    /// the CA for the DNS name `downstream`, and this service shows its own. The
    /// services' own clients use [`Identity::connector`], which follows reloads.
    pub fn client_tls(&self, downstream: &str) -> ClientTlsConfig {
        let current = self.current();
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&current.files.ca))
            .identity(tonic::transport::Identity::from_pem(&current.files.cert, &current.files.key))
            .domain_name(downstream)
    }
}
