//! Step 3 of a batch: every claimed row enqueued on the idempotent producer, in
//! order, each in a producer span of its own, and the acks awaited.

use super::claim::Row;
use super::settings::RelaySettings;
use crate::OutboxError;
use crate::kafka::{self, headers};
use crate::metrics as m;
use chrono::{SecondsFormat, Utc};
use futures::FutureExt;
use opentelemetry::trace::Status;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use sagaworks_config::KafkaSettings;
use sagaworks_telemetry::messaging::{KafkaMessage, producer_span};
use sagaworks_telemetry::propagation::{context_from_traceparent, headers_for};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Enqueues every row in order and awaits the acks; `true` = acked. Once
/// one event of an aggregate cannot be enqueued, its later events are not
/// enqueued either. Each row is sent inside its own producer span, which
/// ends when the broker acked (or refused) it. Once `shutdown` is
/// cancelled, acks still outstanding are waited for `stop_wait` more at
/// most; those that have not come by then count as not acked (`false`).
pub(super) async fn send_all(
    producer: &FutureProducer,
    kafka: &KafkaSettings,
    service: &str,
    rows: &[Row],
    shutdown: &CancellationToken,
    stop_wait: Duration,
) -> Vec<bool> {
    let mut pending: Vec<Option<DeliveryFuture>> = Vec::with_capacity(rows.len());
    let mut spans: Vec<tracing::Span> = Vec::with_capacity(rows.len());
    let mut blocked: HashSet<&str> = HashSet::new();
    let mut topics: HashMap<&str, String> = HashMap::new();
    for row in rows {
        let topic = topics
            .entry(row.aggregate_type.as_str())
            .or_insert_with(|| kafka::topic_name(kafka, &row.aggregate_type));
        let span = send_span(topic, row);
        if blocked.contains(row.aggregate_id.as_str()) {
            span.set_status(Status::error("not sent: an earlier event of the aggregate failed"));
            spans.push(span);
            pending.push(None);
            continue;
        }
        match enqueue(producer, topic, row, &span).instrument(span.clone()).await {
            Ok(f) => pending.push(Some(f)),
            Err(e) => {
                span.in_scope(
                    || tracing::warn!(error = %e, event_id = %row.id, "cannot enqueue outbox event"),
                );
                span.set_status(Status::error(e.to_string()));
                blocked.insert(row.aggregate_id.as_str());
                pending.push(None);
            }
        }
        spans.push(span);
    }
    // `None`: the relay stopped and the ack did not come within `stop_wait`.
    let given_up = async {
        shutdown.cancelled().await;
        tokio::time::sleep(stop_wait).await;
    }
    .shared();
    let results = futures::future::join_all(pending.into_iter().map(|f| {
        let given_up = given_up.clone();
        async move {
            match f {
                Some(f) => tokio::select! {
                    biased;
                    r = f => Some(r),
                    _ = given_up => None,
                },
                None => Some(Err(futures::channel::oneshot::Canceled)),
            }
        }
    }))
    .await;
    rows.iter()
        .zip(results)
        .zip(spans)
        .map(|((row, r), span)| match r {
            Some(Ok(Ok(delivery))) => {
                span.record("messaging.destination.partition.id", delivery.partition.to_string());
                span.record("messaging.kafka.offset", delivery.offset);
                let age = (Utc::now() - row.created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
                metrics::histogram!(m::OUTBOX_PUBLISH_LATENCY_SECONDS, "service" => service.to_owned())
                    .record(age.max(0.0));
                true
            }
            Some(Ok(Err((e, _)))) => {
                span.in_scope(|| tracing::debug!(error = %e, event_id = %row.id, "outbox event not acked"));
                span.set_status(Status::error(e.to_string()));
                false
            }
            Some(Err(_)) => false,
            None => {
                span.set_status(Status::error("not acked before the relay stopped"));
                false
            }
        })
        .collect()
}

/// Enqueues one row, waiting while librdkafka's queue is full. `span` is
/// the row's producer span: its context goes into the trace headers.
async fn enqueue(
    producer: &FutureProducer,
    topic: &str,
    row: &Row,
    span: &tracing::Span,
) -> Result<DeliveryFuture, KafkaError> {
    let time = row.created_at.to_rfc3339_opts(SecondsFormat::Micros, true);
    let id = row.id.to_string();
    let schema_version = row.schema_version.to_string();
    let mut h = OwnedHeaders::new_with_capacity(11)
        .insert(Header { key: headers::CE_ID, value: Some(id.as_str()) })
        .insert(Header { key: headers::CE_TYPE, value: Some(row.event_type.as_str()) })
        .insert(Header { key: headers::CE_SOURCE, value: Some(row.source.as_str()) })
        .insert(Header { key: headers::CE_SPECVERSION, value: Some(headers::SPECVERSION) })
        .insert(Header { key: headers::CE_TIME, value: Some(time.as_str()) })
        .insert(Header { key: headers::CE_SCHEMAVERSION, value: Some(schema_version.as_str()) })
        .insert(Header { key: headers::CE_AGGREGATEID, value: Some(row.aggregate_id.as_str()) })
        .insert(Header { key: headers::CONTENT_TYPE, value: Some(row.content_type.as_str()) });
    if let Some(schema) = &row.data_schema {
        h = h.insert(Header { key: headers::CE_DATASCHEMA, value: Some(schema.as_str()) });
    }
    for (key, value) in trace_headers(row, span) {
        h = h.insert(Header { key: key.as_str(), value: Some(value.as_str()) });
    }
    let mut record = FutureRecord::to(topic).key(row.aggregate_id.as_str()).payload(&row.payload).headers(h);
    loop {
        match producer.send_result(record) {
            Ok(f) => return Ok(f),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// The `send {topic}` span of one row: a child of the context the writer
/// stored with the row (a new root when it stored none).
fn send_span(topic: &str, row: &Row) -> tracing::Span {
    let parent = row
        .traceparent
        .as_deref()
        .map(|tp| context_from_traceparent(tp, row.tracestate.as_deref()))
        .unwrap_or_default();
    producer_span(&KafkaMessage::new(topic).with_key(&row.aggregate_id), parent)
}

/// The `traceparent`/`tracestate` headers of a row: the producer span's
/// context, so a consumer links to the send; without OpenTelemetry installed
/// (the span has no context) the writer's stored values, passed through.
fn trace_headers(row: &Row, span: &tracing::Span) -> Vec<(String, String)> {
    let from_span = headers_for(&span.context());
    if !from_span.is_empty() {
        return from_span;
    }
    [(headers::TRACEPARENT, &row.traceparent), (headers::TRACESTATE, &row.tracestate)]
        .into_iter()
        .filter_map(|(key, value)| Some((key.to_owned(), value.clone()?)))
        .collect()
}

/// The relay's idempotent producer (`acks=all`).
pub(super) fn producer(
    kafka: &KafkaSettings,
    settings: &RelaySettings,
) -> Result<kafka::OffRuntimeDrop<FutureProducer>, OutboxError> {
    let timeout = settings.message_timeout_ms.to_string();
    let linger = settings.linger_ms.to_string();
    let config = kafka::client_config(
        kafka,
        &[
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("linger.ms", &linger),
            ("message.timeout.ms", &timeout),
        ],
    );
    Ok(kafka::OffRuntimeDrop::new(config.create()?, "producer"))
}
