//! The AsyncAPI 3.0 document of every topic, generated from [`crate::catalog`]:
//! a channel per topic and per dead-letter topic, a message per event
//! version (CloudEvents headers, JSON Schema payload, Kafka key, example),
//! and operations saying which service sends and which consumer group
//! receives what. Committed as `proto/events/asyncapi.json`, served by the
//! gateway at `/asyncapi.json`.

use crate::catalog::{Contract, Topic, contracts, topics};
use serde_json::{Map, Value, json};

/// The committed document (`proto/events/asyncapi.json`), as validated in CI
/// and served by the gateway; the `contracts` test keeps it equal to
/// [`document_text`].
pub const COMMITTED: &str = include_str!("../../../proto/events/asyncapi.json");

/// The schema format of the payloads (what [`crate::catalog::schema_of`] generates).
const SCHEMA_FORMAT: &str = "application/schema+json;version=draft-07";
const KAFKA_BINDING: &str = "0.5.0";

/// The document, as JSON.
pub fn document() -> Value {
    let contracts = contracts();
    let mut channels = Map::new();
    let mut operations = Map::new();
    let mut messages = Map::new();
    for topic in topics() {
        let on_topic: Vec<&Contract> = contracts.iter().filter(|c| c.aggregate == topic.aggregate).collect();
        for c in &on_topic {
            messages.insert(c.id(), message(topic, c));
        }
        messages.insert(dead_letter_id(topic), dead_letter_message(topic));
        channels.insert(topic.aggregate.to_string(), channel(topic, &on_topic));
        channels.insert(dlq_channel(topic), dead_letter_channel(topic));
        operations.insert(
            format!("{}.publish", topic.aggregate),
            json!({
                "action": "send",
                "channel": { "$ref": format!("#/channels/{}", topic.aggregate) },
                "title": format!("{} publishes", topic.producer),
                "summary": format!(
                    "The {} service's outbox relay publishes the events of its `{}` aggregates, in commit order per key.",
                    topic.producer, topic.aggregate
                ),
                "messages": message_refs(topic, on_topic.iter().filter(|c| c.current)),
            }),
        );
        for reader in topic.consumers {
            let reads = on_topic.iter().filter(|c| reader.reads.contains(&c.event_type));
            operations.insert(
                format!("{}.receive.{}", topic.aggregate, reader.group),
                json!({
                    "action": "receive",
                    "channel": { "$ref": format!("#/channels/{}", topic.aggregate) },
                    "title": format!("{} reads", reader.group),
                    "summary": format!(
                        "Consumer group `{}` of the {} service handles these (older versions upcast), each once \
                         (inbox), and acknowledges the topic's other events unhandled.",
                        reader.group, reader.service
                    ),
                    "messages": message_refs(topic, reads),
                }),
            );
        }
        if !topic.consumers.is_empty() {
            operations.insert(
                format!("{}.dead-letter", topic.aggregate),
                json!({
                    "action": "send",
                    "channel": { "$ref": format!("#/channels/{}", dlq_channel(topic)) },
                    "title": "consumers park poison messages",
                    "summary": "A consumer group parks a message it cannot handle here, with the dlq_* headers.",
                    "messages": [{ "$ref": format!("#/channels/{}/messages/{}", dlq_channel(topic), dead_letter_id(topic)) }],
                }),
            );
        }
    }
    json!({
        "asyncapi": "3.0.0",
        "id": "urn:sagaworks:events",
        "info": {
            "title": "sagaworks events",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Domain events of the order, inventory and payment services. Every event is a CloudEvent \
                in Kafka binary mode: the payload is JSON, the attributes are `ce_*` headers. The key is the \
                aggregate id, so an aggregate's events stay in order. `ce_schemaversion` is the payload's major \
                version; a consumer upcasts older versions and parks newer ones it does not know \
                (`dlq_reason=unsupported_schema_version`). Topics are `<prefix>.<aggregate>` (`kafka.topic_prefix`, \
                default `sagaworks`). Generated from libs/events; do not edit.",
            "license": { "name": "Apache-2.0", "url": "https://www.apache.org/licenses/LICENSE-2.0" },
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": "127.0.0.1:9092",
                "protocol": "kafka",
                "description": "scripts/dev-up's broker",
            },
            "compose": {
                "host": "kafka:9092",
                "protocol": "kafka",
                "description": "docker-compose.yml's Apache Kafka (KRaft)",
            },
        },
        "channels": channels,
        "operations": operations,
        "components": { "messages": messages },
    })
}

/// The document as committed: pretty JSON with a final newline.
pub fn document_text() -> String {
    let mut text = serde_json::to_string_pretty(&document()).expect("JSON values serialise");
    text.push('\n');
    text
}

/// References to `contracts`' messages in `topic`'s channel, as operations need them.
fn message_refs<'a>(topic: &Topic, contracts: impl Iterator<Item = &'a &'a Contract>) -> Vec<Value> {
    contracts
        .map(|c| json!({ "$ref": format!("#/channels/{}/messages/{}", topic.aggregate, c.id()) }))
        .collect()
}

fn prefix_parameter() -> Value {
    json!({ "prefix": { "default": "sagaworks", "description": "kafka.topic_prefix of the services' configuration." } })
}

fn channel(topic: &Topic, on_topic: &[&Contract]) -> Value {
    let messages: Map<String, Value> = on_topic
        .iter()
        .map(|c| (c.id(), json!({ "$ref": format!("#/components/messages/{}", c.id()) })))
        .collect();
    json!({
        "address": format!("{{prefix}}.{}", topic.aggregate),
        "title": format!("{} events", topic.aggregate),
        "description": format!(
            "Events of the `{}` aggregate, published by the {} service. Key: the {}.",
            topic.aggregate, topic.producer, topic.key
        ),
        "parameters": prefix_parameter(),
        "messages": messages,
    })
}

fn dlq_channel(topic: &Topic) -> String {
    format!("{}.dlq", topic.aggregate)
}

fn dead_letter_id(topic: &Topic) -> String {
    format!("{}.DeadLetter", topic.aggregate)
}

fn dead_letter_channel(topic: &Topic) -> Value {
    let mut messages = Map::new();
    messages.insert(
        dead_letter_id(topic),
        json!({ "$ref": format!("#/components/messages/{}", dead_letter_id(topic)) }),
    );
    json!({
        "address": format!("{{prefix}}.{}.dlq", topic.aggregate),
        "title": format!("{} dead letters", topic.aggregate),
        "description": format!(
            "Messages of `{}` that a consumer group could not handle, parked to be replayed or discarded \
             (`sagaworks-admin dlq`, `/v1/admin/dlq`).",
            topic.aggregate
        ),
        "parameters": prefix_parameter(),
        "messages": messages,
    })
}

fn string(description: &str) -> Value {
    json!({ "type": "string", "description": description })
}

fn constant(value: &str, description: &str) -> Value {
    json!({ "type": "string", "const": value, "description": description })
}

/// The CloudEvents binary-mode headers of `c`.
fn headers(topic: &Topic, c: &Contract) -> Value {
    json!({
        "type": "object",
        "required": ["ce_id", "ce_type", "ce_source", "ce_specversion", "ce_time", "ce_schemaversion",
                     "ce_aggregateid", "content-type"],
        "properties": {
            "ce_id": { "type": "string", "format": "uuid", "description": "The event's id (its outbox row); consumers deduplicate on it." },
            "ce_type": constant(c.event_type, "CloudEvents type."),
            "ce_source": constant(&format!("/sagaworks/{}", topic.producer), "The producing service."),
            "ce_specversion": constant("1.0", "CloudEvents version."),
            "ce_time": { "type": "string", "format": "date-time", "description": "When the business transaction wrote it." },
            "ce_schemaversion": constant(&c.version.to_string(), "The payload's major version."),
            "ce_dataschema": constant(&c.data_schema, "Names the payload's schema (proto/events/<type>.v<version>.json). Absent on events written before it was introduced."),
            "ce_aggregateid": string(&format!("The {}; also the Kafka key.", topic.key)),
            "content-type": constant("application/json", "The payload's media type."),
            "traceparent": string("W3C trace context of the span that wrote the event."),
            "tracestate": string("W3C trace state, when there is one."),
        },
    })
}

fn key(topic: &Topic) -> Value {
    json!({ "kafka": {
        "key": { "type": "string", "description": format!("The {}.", topic.key) },
        "bindingVersion": KAFKA_BINDING,
    } })
}

fn message(topic: &Topic, c: &Contract) -> Value {
    let mut payload = c.schema.clone();
    if let Some(o) = payload.as_object_mut() {
        // The schema stands alone in proto/events/; inside the document it is
        // an embedded payload.
        o.remove("$schema");
        o.remove("$id");
    }
    let kept =
        if c.current { String::new() } else { " Producers no longer write it; consumers upcast it.".into() };
    let example_headers = json!({
        "ce_id": "0193a5e0-0000-7000-8000-00000000e001",
        "ce_type": c.event_type,
        "ce_source": format!("/sagaworks/{}", topic.producer),
        "ce_specversion": "1.0",
        "ce_time": "2026-12-04T12:00:00.000000Z",
        "ce_schemaversion": c.version.to_string(),
        "ce_dataschema": c.data_schema,
        "ce_aggregateid": c.example_key,
        "content-type": "application/json",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    });
    json!({
        "name": c.event_type,
        "title": format!("{} v{}", c.event_type, c.version),
        "summary": first_sentence(c.description()),
        "description": format!("{}{kept}", c.description()),
        "contentType": "application/json",
        "headers": headers(topic, c),
        "payload": { "schemaFormat": SCHEMA_FORMAT, "schema": payload },
        "bindings": key(topic),
        "examples": [{ "name": format!("{}-v{}", c.event_type, c.version), "headers": example_headers, "payload": c.example }],
    })
}

fn dead_letter_message(topic: &Topic) -> Value {
    json!({
        "name": "DeadLetter",
        "title": format!("{} dead letter", topic.aggregate),
        "summary": "A message a consumer group parked: the original key, payload and headers, plus why.",
        "contentType": "application/json",
        "headers": {
            "type": "object",
            "required": ["dlq_reason", "dlq_error", "dlq_attempts", "dlq_original_topic",
                         "dlq_original_partition", "dlq_original_offset", "dlq_group"],
            "properties": {
                "dlq_reason": { "type": "string", "enum": ["invalid_envelope", "rejected", "retries_exhausted",
                                                           "unsupported_schema_version", "untrusted_source",
                                                           "unexpected_type"],
                                "description": "Why it was parked." },
                "dlq_error": string("The handler's last error."),
                "dlq_attempts": string("Handling attempts made."),
                "dlq_original_topic": string("Where it came from."),
                "dlq_original_partition": string("Its partition there."),
                "dlq_original_offset": string("Its offset there."),
                "dlq_group": string("The consumer group that parked it."),
                "dlq_replayed_from": string("On a replayed copy back on the original topic: the dead letter it came from."),
            },
            "additionalProperties": { "type": "string", "description": "The original message's headers (ce_*, traceparent, ...)." },
        },
        "payload": { "description": "The original payload, unchanged (possibly not JSON at all, when the envelope was invalid)." },
        "bindings": key(topic),
    })
}

fn first_sentence(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.find(". ") {
        Some(end) => line[..=end].to_string(),
        None => line.to_string(),
    }
}
