//! Spans for Kafka: `send {topic}` in the outbox relay, `process {topic}` in consumers.
//!
//! ```ignore
//! // relay: one producer span per outbox row, child of the business operation
//! let parent = context_from_traceparent(&row.traceparent, row.tracestate.as_deref());
//! let span = producer_span(&KafkaMessage::new(&topic).with_key(&key), parent);
//! let headers = headers_for(&span.context()); // -> Kafka headers; then send inside `span`
//!
//! // consumer: a new trace per message, linked to the producer span
//! let producer = context_from_pairs(headers.iter().map(|h| (h.key, h.value.unwrap_or_default())));
//! let span = consumer_span(&KafkaMessage::new(topic).with_key(key).with_partition(p).with_offset(o), &producer);
//! handle(message).instrument(span).await;
//! ```
//!
//! A consumer span starts its own trace and carries a span *link* to the producer
//! (messaging conventions: processing is not part of the sending operation, and one
//! long-running consumer must not glue all its messages into a single trace).

use opentelemetry::Context;
use opentelemetry::trace::TraceContextExt;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// What the spans record about one Kafka record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KafkaMessage<'a> {
    /// `messaging.destination.name`.
    pub topic: &'a str,
    /// `messaging.kafka.message.key` (only when it is text).
    pub key: Option<&'a str>,
    /// `messaging.destination.partition.id`.
    pub partition: Option<i32>,
    /// `messaging.kafka.offset`.
    pub offset: Option<i64>,
    /// `messaging.consumer.group.name`.
    pub consumer_group: Option<&'a str>,
}

impl<'a> KafkaMessage<'a> {
    pub fn new(topic: &'a str) -> Self {
        Self { topic, key: None, partition: None, offset: None, consumer_group: None }
    }

    pub fn with_key(self, key: &'a str) -> Self {
        Self { key: Some(key), ..self }
    }

    pub fn with_partition(self, partition: i32) -> Self {
        Self { partition: Some(partition), ..self }
    }

    pub fn with_offset(self, offset: i64) -> Self {
        Self { offset: Some(offset), ..self }
    }

    pub fn with_consumer_group(self, group: &'a str) -> Self {
        Self { consumer_group: Some(group), ..self }
    }
}

/// A `process {topic}` span (kind consumer) that starts a new trace and links to the
/// `producer` context (from the message headers; no link when it is empty).
pub fn consumer_span(message: &KafkaMessage<'_>, producer: &Context) -> Span {
    let span = tracing::info_span!(
        parent: None,
        "kafka.process",
        otel.name = %format!("process {}", message.topic),
        otel.kind = "consumer",
        messaging.system = "kafka",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = %message.topic,
        messaging.kafka.message.key = Empty,
        messaging.destination.partition.id = Empty,
        messaging.kafka.offset = Empty,
        messaging.consumer.group.name = Empty,
    );
    record_message(&span, message);
    let producer = producer.span().span_context().clone();
    if producer.is_valid() {
        span.add_link(producer);
    }
    span
}

/// A `send {topic}` span (kind producer) whose parent is `parent`, typically the
/// context stored in the outbox row ([`context_from_traceparent`](crate::propagation::context_from_traceparent));
/// an empty `parent` makes it the root of a new trace.
pub fn producer_span(message: &KafkaMessage<'_>, parent: Context) -> Span {
    let span = tracing::info_span!(
        parent: None,
        "kafka.send",
        otel.name = %format!("send {}", message.topic),
        otel.kind = "producer",
        messaging.system = "kafka",
        messaging.operation.type = "send",
        messaging.operation.name = "send",
        messaging.destination.name = %message.topic,
        messaging.kafka.message.key = Empty,
        messaging.destination.partition.id = Empty,
        messaging.kafka.offset = Empty,
        messaging.consumer.group.name = Empty,
    );
    record_message(&span, message);
    let _ = span.set_parent(parent);
    span
}

fn record_message(span: &Span, message: &KafkaMessage<'_>) {
    if let Some(key) = message.key {
        span.record("messaging.kafka.message.key", key);
    }
    if let Some(partition) = message.partition {
        span.record("messaging.destination.partition.id", partition.to_string());
    }
    if let Some(offset) = message.offset {
        span.record("messaging.kafka.offset", offset);
    }
    if let Some(group) = message.consumer_group {
        span.record("messaging.consumer.group.name", group);
    }
}
