//! Kafka naming and client plumbing shared by the relay, the consumer and the
//! broker health check.
//!
//! * Topic names: [`topic_name`] (`<prefix>.<aggregate_type>`) and
//!   [`dlq_topic`] (`<topic>.dlq`); consumer groups: `<prefix>.<group>`.
//! * Header names of the CloudEvents binary-mode envelope: [`headers`] (the
//!   dead-letter ones are the consumer's own).
//! * [`client_config`] — `bootstrap.servers` plus the extra librdkafka
//!   properties from [`KafkaSettings::properties`] (security settings etc.).
//! * [`ensure_topics`] — creates missing topics, because a real cluster usually
//!   runs with `auto.create.topics.enable=false`.
//! * [`close`] — drops a client on a thread of its own, never on the runtime
//!   (the crate's own clients do the same when dropped without `close`).

use crate::OutboxError;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use sagaworks_config::KafkaSettings;
use std::time::{Duration, Instant};

/// Gauge: Kafka clients being closed right now. One that stays above zero is
/// a close that hangs (on its own thread, where it harms nobody).
pub(crate) const KAFKA_CLIENTS_CLOSING: &str = "kafka_clients_closing";

/// Header names (see docs/design.md, "Events").
pub mod headers {
    pub const CE_ID: &str = "ce_id";
    pub const CE_TYPE: &str = "ce_type";
    pub const CE_SOURCE: &str = "ce_source";
    pub const CE_SPECVERSION: &str = "ce_specversion";
    pub const CE_TIME: &str = "ce_time";
    pub const CE_SCHEMAVERSION: &str = "ce_schemaversion";
    pub const CE_AGGREGATEID: &str = "ce_aggregateid";
    pub const CE_DATASCHEMA: &str = "ce_dataschema";
    pub const CONTENT_TYPE: &str = "content-type";
    pub const TRACEPARENT: &str = "traceparent";
    pub const TRACESTATE: &str = "tracestate";
    /// The CloudEvents version written into `ce_specversion`.
    pub const SPECVERSION: &str = "1.0";
}

/// How new topics are created (partitions, replication factor).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TopicSettings {
    pub partitions: i32,
    /// 1 suits a single local broker; use 3 on a real cluster.
    pub replication_factor: i32,
}

impl Default for TopicSettings {
    fn default() -> Self {
        Self { partitions: 3, replication_factor: 1 }
    }
}

/// `<prefix>.<aggregate_type>`, e.g. `sagaworks.order`.
pub fn topic_name(kafka: &KafkaSettings, aggregate_type: &str) -> String {
    format!("{}.{}", kafka.topic_prefix, aggregate_type)
}

/// The Kafka consumer group of the logical group `group`: `<prefix>.<group>`,
/// e.g. `sagaworks.inventory`. Like the topics, the groups of environments
/// that share a cluster (or of tests that share a broker) are then apart.
/// The inbox, the metrics and the dead-letter headers keep the logical name.
pub(crate) fn group_name(kafka: &KafkaSettings, group: &str) -> String {
    format!("{}.{}", kafka.topic_prefix, group)
}

/// The dead-letter topic of `topic`.
pub fn dlq_topic(topic: &str) -> String {
    format!("{topic}.dlq")
}

/// A librdkafka config: the brokers, the security settings, then `defaults`, then
/// the extra properties from the settings (which may override a default).
pub fn client_config(kafka: &KafkaSettings, defaults: &[(&str, &str)]) -> ClientConfig {
    // OpenSSL initialised before librdkafka first uses it, without the exit handler that
    // it registers otherwise: that handler frees OpenSSL's state at process exit while
    // librdkafka's threads of a client not yet closed may still be in a TLS read, and
    // the process can die of SIGSEGV after its work is done.
    openssl_sys::init();
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.brokers);
    for (key, value) in kafka.security_properties() {
        config.set(key, value);
    }
    for (key, value) in defaults {
        config.set(*key, *value);
    }
    for (key, value) in &kafka.properties {
        config.set(key, value);
    }
    config
}

/// Creates every topic in `topics` that does not exist yet.
///
/// Only the missing ones are asked for: where the topics are created beforehand (the
/// deployments' init step, scripts/kafka with ACLs), a client without Create on them
/// finds them in the metadata and sends no CreateTopics at all.
pub async fn ensure_topics(
    kafka: &KafkaSettings,
    topics: &[String],
    settings: TopicSettings,
) -> Result<(), OutboxError> {
    if topics.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = client_config(kafka, &[]).create()?;
    let admin = std::sync::Arc::new(OffRuntimeDrop::new(admin, "admin"));
    let missing = missing_topics(&admin, topics).await?;
    if missing.is_empty() {
        return Ok(());
    }
    let new: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|t| NewTopic::new(t, settings.partitions, TopicReplication::Fixed(settings.replication_factor)))
        .collect();
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(5)))
        .request_timeout(Some(Duration::from_secs(5)));
    let created = admin.create_topics(&new, &opts).await;
    drop(admin);
    for result in created? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(OutboxError::CreateTopic { topic, reason: code.to_string() }),
        }
    }
    Ok(())
}

/// Those of `topics` that the broker's metadata does not list (a topic the client may
/// not describe counts as missing). A listed topic with an error of its own, such as a
/// partition without a leader yet, exists: creating it would only be refused.
async fn missing_topics(
    admin: &std::sync::Arc<OffRuntimeDrop<AdminClient<DefaultClientContext>>>,
    topics: &[String],
) -> Result<Vec<String>, OutboxError> {
    let admin = std::sync::Arc::clone(admin);
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || {
        let metadata = admin.inner().fetch_metadata(None, Duration::from_secs(5))?;
        let present: std::collections::HashSet<&str> =
            metadata.topics().iter().filter(|t| !topic_is_unknown(t.error())).map(|t| t.name()).collect();
        Ok(topics.into_iter().filter(|t| !present.contains(t.as_str())).collect())
    })
    .await
    .expect("the metadata task does not panic")
}

fn topic_is_unknown(error: Option<rdkafka::types::RDKafkaRespErr>) -> bool {
    use rdkafka::types::RDKafkaRespErr::{
        RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
    };
    matches!(
        error,
        Some(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART | RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)
    )
}

/// Drops `client` (a producer, consumer or admin client) on a thread of its
/// own and waits for that at most `wait`.
///
/// Dropping an rdkafka client runs `rd_kafka_destroy`, which blocks until the
/// client's internal threads have stopped: up to the producer's flush, a
/// consumer's leaving its group (seconds), and after a broker
/// restart sometimes for ever (librdkafka issues #4131, #4674). On a runtime
/// worker thread that stalls every task scheduled there — with two workers,
/// two such drops (after a broker kill in `scripts/chaos`, say) silence the
/// whole process. On its own thread a hung destroy costs one parked thread and
/// shows in the `kafka_clients_closing` gauge.
pub async fn close<T: Send + 'static>(client: T, what: &'static str, wait: Duration) {
    let Some(closed) = close_on_own_thread(client, what) else { return };
    if !wait.is_zero() && tokio::time::timeout(wait, closed).await.is_err() {
        tracing::warn!(client = what, ?wait, "a kafka client is still closing; not waiting for it");
    }
}

/// Starts dropping `client` on a new thread; the receiver fires when it is
/// gone. `None`: no thread could be started, and `client` was dropped here.
fn close_on_own_thread<T: Send + 'static>(
    client: T,
    what: &'static str,
) -> Option<tokio::sync::oneshot::Receiver<()>> {
    let (done, closed) = tokio::sync::oneshot::channel::<()>();
    metrics::gauge!(KAFKA_CLIENTS_CLOSING).increment(1.0);
    let spawned = std::thread::Builder::new().name(format!("kafka-close-{what}")).spawn(move || {
        let started = Instant::now();
        drop(client);
        metrics::gauge!(KAFKA_CLIENTS_CLOSING).decrement(1.0);
        let took = started.elapsed();
        if took > Duration::from_secs(5) {
            tracing::warn!(client = what, ?took, "closing a kafka client took long");
        }
        let _ = done.send(());
    });
    match spawned {
        Ok(_) => Some(closed),
        // No thread: the closure, and the client with it, was dropped here.
        Err(e) => {
            metrics::gauge!(KAFKA_CLIENTS_CLOSING).decrement(1.0);
            tracing::error!(error = %e, client = what, "cannot start a thread to close a kafka client");
            None
        }
    }
}

/// An rdkafka client that is never destroyed on a runtime thread.
///
/// [`close`] covers an orderly stop. This covers every other way a client
/// goes: the task that owns it is aborted, a `select!` or `try_join!` drops
/// the future holding it, or a service is killed inside a test process.
/// Dropped where a Tokio runtime is current, the client is handed to
/// [`close`]'s thread without waiting; elsewhere (on that thread, say) it is
/// dropped in place.
pub(crate) struct OffRuntimeDrop<T: Send + 'static> {
    client: Option<T>,
    what: &'static str,
}

impl<T: Send + 'static> OffRuntimeDrop<T> {
    /// Wraps `client`; `what` names its closing thread (`kafka-close-{what}`).
    pub(crate) fn new(client: T, what: &'static str) -> Self {
        Self { client: Some(client), what }
    }
}

impl<T: Send + 'static> std::ops::Deref for OffRuntimeDrop<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.client.as_ref().expect("the client is only taken in drop")
    }
}

impl<T: Send + 'static> Drop for OffRuntimeDrop<T> {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else { return };
        if tokio::runtime::Handle::try_current().is_ok() {
            let _ = close_on_own_thread(client, self.what);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, mpsc};

    #[test]
    fn a_listed_topic_without_a_leader_yet_exists() {
        use rdkafka::types::RDKafkaRespErr::*;
        assert!(!topic_is_unknown(None));
        assert!(!topic_is_unknown(Some(RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE)));
        assert!(topic_is_unknown(Some(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)));
        assert!(topic_is_unknown(Some(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)));
    }

    /// A client whose destroy hangs until released (as `rd_kafka_destroy` can),
    /// and then says so. The 30 s only turn a test that waits for it on the
    /// runtime into a failure instead of a hang.
    struct Hangs(mpsc::Receiver<()>, Arc<AtomicBool>);
    impl Drop for Hangs {
        fn drop(&mut self) {
            let _ = self.0.recv_timeout(Duration::from_secs(30));
            self.1.store(true, Ordering::SeqCst);
        }
    }

    /// On a single-threaded runtime an inline drop would block the test itself
    /// until the destroy is released, which happens only after `close` returned.
    #[tokio::test(flavor = "current_thread")]
    async fn a_close_that_hangs_does_not_stall_the_runtime() {
        let (release, hung) = mpsc::channel();
        let destroyed = Arc::new(AtomicBool::new(false));
        close(Hangs(hung, Arc::clone(&destroyed)), "test", Duration::from_millis(100)).await;
        // The runtime still runs timers, and the destroy still hangs: close gave up
        // waiting for it instead of blocking the runtime until it was done.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!destroyed.load(Ordering::SeqCst), "close waited for the hanging destroy on the runtime");
        let _ = release.send(());
    }

    /// What an aborted task does to the client it owns: drops it in place,
    /// on the runtime. Wrapped, the drop does not stall the runtime.
    #[tokio::test(flavor = "current_thread")]
    async fn a_wrapped_client_dropped_on_the_runtime_does_not_stall_it() {
        let (release, hung) = mpsc::channel();
        let destroyed = Arc::new(AtomicBool::new(false));
        let client = Hangs(hung, Arc::clone(&destroyed));
        let owner = tokio::spawn(async move {
            let _client = OffRuntimeDrop::new(client, "test");
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
        owner.abort();
        let _ = owner.await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!destroyed.load(Ordering::SeqCst), "the drop waited for the hanging destroy on the runtime");
        let _ = release.send(());
    }

    #[test]
    fn a_wrapped_client_dropped_off_any_runtime_is_dropped_in_place() {
        let (tx, rx) = mpsc::channel();
        let me = std::thread::current().name().unwrap_or_default().to_string();
        drop(OffRuntimeDrop::new(Reports(tx), "probe"));
        assert_eq!(rx.try_recv(), Ok(me), "dropped elsewhere, or not yet");
    }

    #[tokio::test]
    async fn a_wrapped_client_dropped_on_the_runtime_goes_to_a_closing_thread() {
        let (tx, rx) = mpsc::channel();
        drop(OffRuntimeDrop::new(Reports(tx), "probe"));
        let name = rx.recv_timeout(Duration::from_secs(5)).expect("dropped");
        assert_eq!(name, "kafka-close-probe");
    }

    struct Reports(mpsc::Sender<String>);
    impl Drop for Reports {
        fn drop(&mut self) {
            let _ = self.0.send(std::thread::current().name().unwrap_or_default().to_string());
        }
    }

    #[tokio::test]
    async fn close_drops_on_a_thread_of_its_own_and_waits_when_asked() {
        let (tx, rx) = mpsc::channel();
        close(Reports(tx), "probe", Duration::from_secs(5)).await;
        assert_eq!(
            rx.try_recv().as_deref(),
            Ok("kafka-close-probe"),
            "dropped, before close returned, elsewhere"
        );
    }
}
