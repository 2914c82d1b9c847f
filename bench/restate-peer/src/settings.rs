//! The peer's settings, from its environment (the names the Temporal peer reads too).

use sagaworks_mtls::TlsSettings;
use std::net::SocketAddr;

/// Why the environment does not make settings.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{name}: {value:?} is not {what}")]
    Invalid { name: &'static str, value: String, what: &'static str },
    #[error("{0} is set without {1}")]
    Missing(&'static str, &'static str),
}

/// Kafka as a SCRAM-SHA-512 user over TLS (the dev stack's SASL_SSL listener).
#[derive(Clone)]
pub struct SaslSsl {
    pub username: String,
    pub password: String,
    /// The CA of the Kafka nodes (`kafka-ca.pem`), not the services' CA.
    pub ca_file: String,
}

impl std::fmt::Debug for SaslSsl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslSsl")
            .field("username", &self.username)
            .field("password", &"[redacted]")
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// Where the events go: `brokers` (empty: publish nothing) and the topic.
#[derive(Debug, Clone)]
pub struct KafkaTarget {
    pub brokers: String,
    pub topic: String,
    /// None: plaintext (development only).
    pub sasl_ssl: Option<SaslSsl>,
}

#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the Restate service endpoint listens (Restate's server connects to it).
    pub listen: SocketAddr,
    /// `host:port` of each participant's gRPC server.
    pub inventory: String,
    pub payment: String,
    /// The certificate the peer shows the participants: the order service's (their
    /// allow-lists admit order's SPIFFE id). Off when none of the three files is named.
    pub tls: TlsSettings,
    pub kafka: KafkaTarget,
}

impl Settings {
    /// PEER_PORT (9080), INVENTORY_URL (127.0.0.1:7082), PAYMENT_URL (127.0.0.1:7083),
    /// TLS_CA_FILE / TLS_CERT_FILE / TLS_KEY_FILE, KAFKA_BROKERS (127.0.0.1:9092; empty:
    /// no events), TOPIC_PREFIX (sagaworks), KAFKA_SASL_USERNAME / KAFKA_SASL_PASSWORD /
    /// KAFKA_CA_FILE.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let get = |name: &str, fallback: &str| env(name).unwrap_or_else(|| fallback.to_owned());
        let port = get("PEER_PORT", "9080");
        let port: u16 = port.parse().map_err(|_| SettingsError::Invalid {
            name: "PEER_PORT",
            value: port.clone(),
            what: "a port number",
        })?;
        let tls = TlsSettings {
            ca_file: get("TLS_CA_FILE", ""),
            cert_file: get("TLS_CERT_FILE", ""),
            key_file: get("TLS_KEY_FILE", ""),
            ..TlsSettings::default()
        };
        Ok(Self {
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            inventory: get("INVENTORY_URL", "127.0.0.1:7082"),
            payment: get("PAYMENT_URL", "127.0.0.1:7083"),
            tls,
            kafka: KafkaTarget {
                brokers: get("KAFKA_BROKERS", "127.0.0.1:9092"),
                topic: format!("{}.order", get("TOPIC_PREFIX", "sagaworks")),
                sasl_ssl: sasl_ssl(&get)?,
            },
        })
    }
}

fn sasl_ssl(get: &impl Fn(&str, &str) -> String) -> Result<Option<SaslSsl>, SettingsError> {
    let username = get("KAFKA_SASL_USERNAME", "");
    if username.is_empty() {
        return Ok(None);
    }
    let password = get("KAFKA_SASL_PASSWORD", "");
    if password.is_empty() {
        return Err(SettingsError::Missing("KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"));
    }
    Ok(Some(SaslSsl { username, password, ca_file: get("KAFKA_CA_FILE", "") }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let vars: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::from_env(|name| vars.get(name).cloned())
    }

    #[test]
    fn defaults_are_the_dev_stacks_ports_in_plaintext() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.listen.port(), 9080);
        assert_eq!((s.inventory.as_str(), s.payment.as_str()), ("127.0.0.1:7082", "127.0.0.1:7083"));
        assert!(!s.tls.enabled());
        assert_eq!(s.kafka.topic, "sagaworks.order");
        assert!(s.kafka.sasl_ssl.is_none());
    }

    #[test]
    fn a_kafka_user_without_a_password_is_refused() {
        let err = settings(&[("KAFKA_SASL_USERNAME", "order")]).unwrap_err();
        assert!(matches!(err, SettingsError::Missing("KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD")));
    }

    #[test]
    fn a_port_that_is_no_number_is_refused() {
        let err = settings(&[("PEER_PORT", "x")]).unwrap_err();
        assert!(err.to_string().contains("PEER_PORT"), "{err}");
    }

    #[test]
    fn the_password_is_not_in_debug_output() {
        let s = settings(&[("KAFKA_SASL_USERNAME", "order"), ("KAFKA_SASL_PASSWORD", "s3cret")]).unwrap();
        assert!(!format!("{s:?}").contains("s3cret"));
    }
}
