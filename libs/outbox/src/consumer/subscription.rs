//! The group subscription: the consumer subscribes once its own client's
//! metadata lists every topic.
//!
//! A topic that [`kafka::ensure_topics`] has just created may not be listed
//! yet: CreateTopics returns once the controller has the topic, and a broker
//! can answer a metadata request before its own view has caught up. A
//! consumer that subscribed then would join its group with the topics the
//! broker listed, report the others as consume errors ("Subscribed topic not
//! available"), and take them up only at librdkafka's next periodic metadata
//! refresh (`topic.metadata.refresh.interval.ms`, five minutes by default):
//! their messages would wait that long. Once the client's metadata cache
//! lists every topic, the subscription's join reads the cache and asks the
//! broker nothing.
//!
//! [`kafka::ensure_topics`]: crate::kafka::ensure_topics

use crate::backoff::Backoff;
use crate::kafka::OffRuntimeDrop;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The consumer's Kafka client, shared with its metadata requests' blocking tasks.
pub(super) type Client = Arc<OffRuntimeDrop<StreamConsumer>>;

/// How long one metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// Every this many requests without every topic listed, the wait is logged
/// as a warning, so that an operator sees why a consumer does not start; the
/// requests between are logged at debug.
const WARN_EVERY: u32 = 10;

/// Waits until `client`'s metadata lists each of `topics` with its
/// partitions, asking the broker again with backoff; false if `shutdown`
/// comes first.
pub(super) async fn await_listed(client: &Client, topics: &[String], shutdown: &CancellationToken) -> bool {
    let mut backoff = Backoff::new(50, 2_000);
    let mut attempt: u32 = 0;
    loop {
        let (asked, wanted) = (Arc::clone(client), topics.to_vec());
        let unlisted = tokio::task::spawn_blocking(move || unlisted(&asked, &wanted))
            .await
            .expect("the metadata task does not panic");
        if unlisted.is_empty() {
            return true;
        }
        let delay = backoff.next_delay();
        attempt = attempt.wrapping_add(1);
        if attempt.is_multiple_of(WARN_EVERY) {
            tracing::warn!(?unlisted, attempt, retry_in = ?delay,
                "the broker does not list these topics (or lists them with an error): not subscribed yet");
        } else {
            tracing::debug!(?unlisted, retry_in = ?delay, "topics not listed by the broker yet");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// Those of `topics` that the broker does not list, or lists with an error
/// or without partitions. Each is asked for on its own: a consumer never
/// asks for every topic of the cluster. Blocks.
fn unlisted(client: &StreamConsumer, topics: &[String]) -> Vec<String> {
    topics
        .iter()
        .filter(|topic| {
            let listed = client.fetch_metadata(Some(topic), METADATA_TIMEOUT).is_ok_and(|metadata| {
                metadata
                    .topics()
                    .iter()
                    .any(|t| t.name() == topic.as_str() && t.error().is_none() && !t.partitions().is_empty())
            });
            !listed
        })
        .cloned()
        .collect()
}
