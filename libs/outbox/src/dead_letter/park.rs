//! Parking: the write side of the dead-letter topics. A message a consumer
//! could not handle goes to `<topic>.dlq` as it came (key, payload, headers),
//! plus the `dlq_*` headers that say why ([`Parked`]).

use super::headers::Parked;
use crate::backoff::Backoff;
use crate::kafka;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long one send to a dead-letter topic may take before it is tried again.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// `shutdown` came before the broker acked the dead letter.
#[derive(Debug)]
pub(crate) struct NotParked;

/// Sends `msg` to `<topic>.dlq` with `parked`'s headers added and waits for
/// the ack; a failed send is tried again after `backoff`'s next delay, until
/// one is acked or `shutdown` is cancelled.
pub(crate) async fn park(
    producer: &FutureProducer,
    msg: &OwnedMessage,
    parked: &Parked<'_>,
    mut backoff: Backoff,
    shutdown: &CancellationToken,
) -> Result<(), NotParked> {
    let topic = kafka::dlq_topic(msg.topic());
    loop {
        let headers = parked.add_to(msg.headers().cloned().unwrap_or_default());
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic).headers(headers);
        if let Some(k) = msg.key() {
            record = record.key(k);
        }
        if let Some(p) = msg.payload() {
            record = record.payload(p);
        }
        match producer.send(record, SEND_TIMEOUT).await {
            Ok(_) => return Ok(()),
            Err((e, _)) => {
                let delay = backoff.next_delay();
                tracing::error!(error = %e, dlq = %topic, retry_in = ?delay, "dead-letter send failed");
                tokio::select! {
                    _ = shutdown.cancelled() => return Err(NotParked),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}
