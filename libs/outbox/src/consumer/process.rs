//! Handling a message, or a batch of them: the inbox row and the handler in
//! one transaction, inside the message's consumer span; a message that fails
//! is tried again with backoff, and one that cannot be handled is parked on
//! its dead-letter topic.

#[cfg(doc)]
use super::ConsumerSettings;
use super::inbox;
use super::outcome::Outcome;
use super::worker::Interrupted;
use super::{Consumer, Handler, HandlerError, ReceivedEvent, UnsupportedVersionPolicy};
use crate::backoff::Backoff;
use crate::dead_letter::headers::Parked;
use crate::dead_letter::{DlqReason, NotParked, park};
use crate::metrics as m;
use opentelemetry::trace::Status;
use rdkafka::message::{Headers, Message, OwnedMessage};
use sagaworks_telemetry::messaging::{KafkaMessage, consumer_span};
use sagaworks_telemetry::propagation::context_from_pairs;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

impl<H: Handler> Consumer<H> {
    /// Why `event` is not believed, if it is not: the reason it is parked under and the
    /// error (see [`ConsumerSettings::sources`] and [`ConsumerSettings::types`]).
    fn distrusted(&self, event: &ReceivedEvent) -> Option<(DlqReason, String)> {
        let aggregate = (event.topic.strip_prefix(self.kafka.topic_prefix.as_str()))
            .and_then(|rest| rest.strip_prefix('.'))
            .unwrap_or(&event.topic);
        let untrusted = |why| Some((DlqReason::UntrustedSource, why));
        if !self.settings.sources.is_empty() {
            match self.settings.sources.get(aggregate) {
                Some(expected) if *expected == event.source => {}
                Some(expected) => {
                    return untrusted(format!(
                        "ce_source {:?} is not {expected:?}, the publisher of topic {}",
                        event.source, event.topic
                    ));
                }
                None => return untrusted(format!("topic {} has no known publisher", event.topic)),
            }
        }
        if !self.settings.types.is_empty()
            && !self.settings.types.get(aggregate).is_some_and(|types| types.contains(&event.event_type))
        {
            return Some((
                DlqReason::UnexpectedType,
                format!("ce_type {:?} is not an event of topic {}", event.event_type, event.topic),
            ));
        }
        None
    }

    /// Handles one message inside its `process {topic}` span: a new trace,
    /// linked to the producer's span named by the message's trace headers.
    pub(super) async fn process(
        &self,
        msg: &OwnedMessage,
        shutdown: &CancellationToken,
    ) -> Result<(), Interrupted> {
        let span = process_span(msg, &self.settings.group_id);
        self.process_in_span(msg, shutdown, &span).instrument(span.clone()).await
    }

    async fn process_in_span(
        &self,
        msg: &OwnedMessage,
        shutdown: &CancellationToken,
        span: &tracing::Span,
    ) -> Result<(), Interrupted> {
        let outcome = match ReceivedEvent::from_message(msg) {
            Err(e) => {
                tracing::warn!(error = %e, topic = msg.topic(), offset = msg.offset(), "poison message");
                self.dead_letter(msg, DlqReason::InvalidEnvelope, &e.to_string(), 1, shutdown).await?
            }
            Ok(event) => match self.distrusted(&event) {
                Some((reason, why)) => {
                    tracing::warn!(%why, topic = msg.topic(), offset = msg.offset(), reason = reason.label(),
                        "event not believed");
                    self.dead_letter(msg, reason, &why, 1, shutdown).await?
                }
                None if !self.handler.wants(&event) => Outcome::Ignored,
                None => self.handle_with_retries(msg, &event, shutdown).await?,
            },
        };
        if let Outcome::DeadLettered = outcome {
            span.set_status(Status::error("dead-lettered"));
        }
        self.count(msg, &outcome);
        self.mark(std::slice::from_ref(msg));
        Ok(())
    }

    /// Handles `msgs` (one worker's, in partition order) in one transaction;
    /// see the module docs.
    pub(super) async fn process_batch(
        &self,
        msgs: &[OwnedMessage],
        shutdown: &CancellationToken,
    ) -> Result<(), Interrupted> {
        let Ok(events) = msgs.iter().map(ReceivedEvent::from_message).collect::<Result<Vec<_>, _>>() else {
            // A poison message: the one-at-a-time path dead-letters it.
            return self.one_by_one(msgs, shutdown).await;
        };
        if events.iter().any(|e| self.distrusted(e).is_some()) {
            // So is one from an untrusted source or of a type its topic does not carry.
            return self.one_by_one(msgs, shutdown).await;
        }
        let group = &self.settings.group_id;
        let spans: Vec<tracing::Span> = msgs.iter().map(|msg| process_span(msg, group)).collect();
        match self.handle_batch(&events, &spans).await {
            Ok(outcomes) => {
                for (msg, outcome) in msgs.iter().zip(&outcomes) {
                    self.count(msg, outcome);
                }
                self.mark(msgs);
                Ok(())
            }
            Err(e) => {
                tracing::debug!(error = %e, messages = msgs.len(), "batch failed; handling its messages one at a time");
                for span in spans {
                    span.set_status(Status::error(
                        "batch rolled back; the message is handled again on its own",
                    ));
                }
                self.one_by_one(msgs, shutdown).await
            }
        }
    }

    async fn one_by_one(
        &self,
        msgs: &[OwnedMessage],
        shutdown: &CancellationToken,
    ) -> Result<(), Interrupted> {
        for msg in msgs {
            self.process(msg, shutdown).await?;
        }
        Ok(())
    }

    /// Inbox rows and handlers of `events` in one transaction: one statement
    /// records every wanted event in the inbox and says which are new; the
    /// handler then gets the new ones ([`Handler::handle_many`]).
    async fn handle_batch(
        &self,
        events: &[ReceivedEvent],
        spans: &[tracing::Span],
    ) -> Result<Vec<Outcome>, HandlerError> {
        let db = |e: sqlx::Error| HandlerError::Retryable(format!("database: {e}"));
        let wanted: Vec<&ReceivedEvent> = events.iter().filter(|e| self.handler.wants(e)).collect();
        if wanted.is_empty() {
            return Ok(vec![Outcome::Ignored; events.len()]);
        }
        let mut tx = self.pool.begin().await.map_err(db)?;
        let new = inbox::record(&mut tx, &self.settings.group_id, &wanted).await.map_err(db)?;
        let mut outcomes = Vec::with_capacity(events.len());
        let mut seen = std::collections::HashSet::with_capacity(events.len());
        let mut fresh = Vec::with_capacity(events.len());
        let mut fresh_spans = Vec::with_capacity(events.len());
        for (event, span) in events.iter().zip(spans) {
            let outcome = if !self.handler.wants(event) {
                Outcome::Ignored
            } else if !new.contains(&event.id) || !seen.insert(event.id) {
                // In the inbox before, or twice in this batch (a redelivery).
                Outcome::Duplicate
            } else {
                fresh.push(event);
                fresh_spans.push(span.clone());
                Outcome::Processed
            };
            outcomes.push(outcome);
        }
        if !fresh.is_empty() {
            self.handler.handle_many(&mut tx, &fresh, &fresh_spans).await?;
        }
        tx.commit().await.map_err(db)?;
        #[cfg(feature = "test-hooks")]
        if self.settings.crash_point == crate::crash::ConsumerCrashPoint::BeforeOffsetCommit
            && !fresh.is_empty()
        {
            crate::crash::abort(&format!(
                "consumer group {}: {} events handled and committed, offsets not committed",
                self.settings.group_id,
                fresh.len()
            ));
        }
        Ok(outcomes)
    }

    fn count(&self, msg: &OwnedMessage, outcome: &Outcome) {
        metrics::counter!(m::CONSUMER_PROCESSED_TOTAL, "group" => self.settings.group_id.clone(),
            "topic" => msg.topic().to_string(), "outcome" => outcome.label())
        .increment(1);
    }

    /// Inbox row + handler in one transaction (a batch of one, in the
    /// current span: the message's).
    async fn handle_once(&self, event: &ReceivedEvent) -> Result<Outcome, HandlerError> {
        let span = tracing::Span::current();
        let outcomes = self.handle_batch(std::slice::from_ref(event), std::slice::from_ref(&span)).await?;
        Ok(outcomes[0])
    }

    /// [`Self::handle_once`], tried again with backoff while the handler's error is
    /// retryable and attempts are left ([`ConsumerSettings::max_attempts`]); then, or
    /// at once for a permanent error, the message is parked on its dead-letter topic.
    async fn handle_with_retries(
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

    /// Parks `msg` on `<topic>.dlq` with why ([`park`]: until the broker acks it or
    /// shutdown arrives) and counts it.
    async fn dead_letter(
        &self,
        msg: &OwnedMessage,
        reason: DlqReason,
        error: &str,
        attempts: u32,
        shutdown: &CancellationToken,
    ) -> Result<Outcome, Interrupted> {
        let parked = Parked {
            reason,
            error,
            attempts,
            topic: msg.topic(),
            partition: msg.partition(),
            offset: msg.offset(),
            group: &self.settings.group_id,
        };
        let backoff = Backoff::new(self.settings.retry_base_ms, self.settings.retry_max_ms.max(1_000));
        park(&self.dlq, msg, &parked, backoff, shutdown).await.map_err(|NotParked| Interrupted)?;
        metrics::counter!(m::CONSUMER_DLQ_TOTAL, "group" => self.settings.group_id.clone(),
            "topic" => msg.topic().to_string())
        .increment(1);
        Ok(Outcome::DeadLettered)
    }
}

/// The consumer span of `msg` (see [`consumer_span`]).
fn process_span(msg: &OwnedMessage, group: &str) -> tracing::Span {
    let producer = context_from_pairs(
        msg.headers().into_iter().flat_map(|h| h.iter()).map(|h| (h.key, h.value.unwrap_or_default())),
    );
    let mut message = KafkaMessage::new(msg.topic())
        .with_partition(msg.partition())
        .with_offset(msg.offset())
        .with_consumer_group(group);
    if let Some(key) = msg.key().and_then(|k| std::str::from_utf8(k).ok()) {
        message = message.with_key(key);
    }
    consumer_span(&message, &producer)
}
