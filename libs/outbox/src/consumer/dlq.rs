//! Retries and the dead-letter topic: what happens to a message that was not
//! handled.

#[cfg(doc)]
use super::ConsumerSettings;
use super::outcome::Outcome;
use super::worker::Interrupted;
use super::{Consumer, Handler, HandlerError, ReceivedEvent, UnsupportedVersionPolicy};
use crate::backoff::Backoff;
use crate::dead_letter::DlqReason;
use crate::dead_letter::headers::Parked;
use crate::kafka;
use crate::metrics as m;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureRecord;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

impl<H: Handler> Consumer<H> {
    pub(super) async fn handle_with_retries(
        &self,
        msg: &OwnedMessage,
        event: &ReceivedEvent,
        shutdown: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let mut backoff = Backoff::new(self.settings.retry_base_ms, self.settings.retry_max_ms);
        let max = self.settings.max_attempts.max(1);
        let mut attempt = 1;
        loop {
            // What went wrong, the reason it is parked under, and whether another try may help.
            let (error, reason, retry) = match self.handle_once(event).await {
                Ok(outcome) => return Ok(outcome),
                Err(HandlerError::Permanent(e)) => (e, DlqReason::Rejected, false),
                Err(HandlerError::UnsupportedSchemaVersion(e)) => (
                    e,
                    DlqReason::UnsupportedSchemaVersion,
                    self.settings.unsupported_schema_version == UnsupportedVersionPolicy::Retry,
                ),
                Err(HandlerError::Retryable(e)) => (e, DlqReason::RetriesExhausted, true),
            };
            metrics::counter!(m::CONSUMER_ERRORS_TOTAL, "group" => self.settings.group_id.clone(),
                "topic" => event.topic.clone())
            .increment(1);
            if !retry || attempt >= max {
                tracing::warn!(error = %error, event_id = %event.id, attempt, reason = reason.label(), "dead-lettering event");
                return self.dead_letter(msg, reason, &error, attempt, shutdown).await;
            }
            let delay = backoff.next_delay();
            tracing::info!(error = %error, event_id = %event.id, attempt, retry_in = ?delay, "retrying event");
            tokio::select! {
                _ = shutdown.cancelled() => return Err(Interrupted),
                _ = tokio::time::sleep(delay) => {}
            }
            attempt += 1;
        }
    }

    /// Sends `msg` to `<topic>.dlq` and waits for the ack, retrying until it
    /// is acked or shutdown arrives.
    pub(super) async fn dead_letter(
        &self,
        msg: &OwnedMessage,
        reason: DlqReason,
        error: &str,
        attempts: u32,
        shutdown: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let topic = kafka::dlq_topic(msg.topic());
        let parked = Parked {
            reason,
            error,
            attempts,
            topic: msg.topic(),
            partition: msg.partition(),
            offset: msg.offset(),
            group: &self.settings.group_id,
        };
        let mut backoff = Backoff::new(self.settings.retry_base_ms, self.settings.retry_max_ms.max(1_000));
        loop {
            let h = parked.add_to(msg.headers().cloned().unwrap_or_default());
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic).headers(h);
            if let Some(k) = msg.key() {
                record = record.key(k);
            }
            if let Some(p) = msg.payload() {
                record = record.payload(p);
            }
            match self.dlq.send(record, Duration::from_secs(5)).await {
                Ok(_) => break,
                Err((e, _)) => {
                    let delay = backoff.next_delay();
                    tracing::error!(error = %e, dlq = %topic, retry_in = ?delay, "dead-letter send failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Err(Interrupted),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        metrics::counter!(m::CONSUMER_DLQ_TOTAL, "group" => self.settings.group_id.clone(),
            "topic" => msg.topic().to_string())
        .increment(1);
        Ok(Outcome::DeadLettered)
    }
}
