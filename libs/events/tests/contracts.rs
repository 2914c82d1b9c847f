//! The committed contracts (`proto/events/`) are what the Rust types
//! generate, and every change to them is backward compatible.
//!
//! A contract change shows up in review as a diff of these files. To accept
//! one, regenerate them:
//!
//! ```text
//! UPDATE_CONTRACTS=1 cargo nextest run -p sagaworks-events --test contracts
//! ```
//!
//! which refuses to write a schema that breaks the committed version of the
//! same event (see `sagaworks_events::compat`): that needs a new version.

use sagaworks_events::catalog::{AnyEvent, Contract, contracts};
use sagaworks_events::{asyncapi, compat};
use sagaworks_outbox::ReceivedEvent;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto/events")
}

fn update() -> bool {
    std::env::var_os("UPDATE_CONTRACTS").is_some_and(|v| v == "1")
}

fn pretty(v: &Value) -> String {
    let mut text = serde_json::to_string_pretty(v).unwrap();
    text.push('\n');
    text
}

/// What is wrong with `committed` (the file's text, if any) as the contract
/// `c` generates; empty when it matches.
fn verify(c: &Contract, committed: Option<&str>) -> Vec<String> {
    let file = format!("proto/events/{}.json", c.id());
    let Some(committed) = committed else {
        return vec![format!("{file} is missing: a new contract (regenerate to add it)")];
    };
    let old: Value = match serde_json::from_str(committed) {
        Ok(v) => v,
        Err(e) => return vec![format!("{file} is not JSON: {e}")],
    };
    let breaks = compat::check(&old, &c.schema);
    if !breaks.is_empty() {
        return breaks
            .iter()
            .map(|b| {
                format!(
                    "{} v{}: {b}. That breaks the published version: add version {} instead (keep this \
                     type as v{} with an upcast; see docs/design.md, \"Changing an event\")",
                    c.event_type,
                    c.version,
                    c.version + 1,
                    c.version
                )
            })
            .collect();
    }
    if committed != pretty(&c.schema) {
        return vec![format!(
            "{file} differs from what the type generates (a compatible change: regenerate it)"
        )];
    }
    Vec::new()
}

#[test]
fn the_committed_schemas_are_the_types_and_every_change_is_compatible() {
    let dir = dir();
    let mut problems = Vec::new();
    for c in contracts() {
        let path = dir.join(format!("{}.json", c.id()));
        let committed = std::fs::read_to_string(&path).ok();
        let found = verify(&c, committed.as_deref());
        let breaking = found.iter().any(|p| p.contains("breaks the published version"));
        if update() && !found.is_empty() && !breaking {
            std::fs::write(&path, pretty(&c.schema)).unwrap();
            eprintln!("wrote {}", path.display());
        } else {
            problems.extend(found);
        }
    }
    // No schema file outlives its type: versions are removed on purpose.
    let expected: BTreeSet<String> =
        contracts().iter().map(|c| format!("{}.json", c.id())).chain(["asyncapi.json".into()]).collect();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if !expected.contains(&name) {
            problems.push(format!("proto/events/{name} is no contract's: delete it or restore its type"));
        }
    }
    assert!(
        problems.is_empty(),
        "event contracts:\n  {}\n(regenerate: UPDATE_CONTRACTS=1 cargo nextest run -p sagaworks-events --test contracts)",
        problems.join("\n  ")
    );
}

#[test]
fn the_committed_asyncapi_document_is_generated() {
    let path = dir().join("asyncapi.json");
    let generated = asyncapi::document_text();
    if update() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(committed, asyncapi::COMMITTED, "the gateway serves the file as it is (rebuild)");
    assert!(
        committed == generated,
        "proto/events/asyncapi.json differs from the catalog (regenerate: UPDATE_CONTRACTS=1 cargo nextest run -p \
         sagaworks-events --test contracts)"
    );
}

#[test]
fn a_breaking_change_to_a_committed_schema_fails_naming_the_field() {
    // A scratch change: OrderConfirmed v2 as if `total_cents` had been
    // renamed, checked against the committed file like the test above.
    let mut c = contracts().into_iter().find(|c| c.id() == "OrderConfirmed.v2").unwrap();
    let committed = std::fs::read_to_string(dir().join("OrderConfirmed.v2.json")).unwrap();
    let props = c.schema["properties"].as_object_mut().unwrap();
    let total = props.remove("total_cents").unwrap();
    props.insert("amount_cents".into(), total);
    let required = c.schema["required"].as_array_mut().unwrap();
    required.retain(|r| r != "total_cents");
    required.push("amount_cents".into());

    let problems = verify(&c, Some(&committed));
    assert_eq!(
        problems,
        [
            "OrderConfirmed v2: field `total_cents` was removed, but it is required: consumers built with the old \
             type need it. That breaks the published version: add version 3 instead (keep this type as v2 with an \
             upcast; see docs/design.md, \"Changing an event\")",
            "OrderConfirmed v2: field `amount_cents` is new and required: events written before it lack it (make it \
             an Option or #[serde(default)]). That breaks the published version: add version 3 instead (keep this \
             type as v2 with an upcast; see docs/design.md, \"Changing an event\")",
        ]
    );
    // And a compatible one only asks for the file to be regenerated.
    let mut c = contracts().into_iter().find(|c| c.id() == "OrderConfirmed.v2").unwrap();
    c.schema["properties"]["currency"] = serde_json::json!({ "type": ["string", "null"] });
    assert_eq!(
        verify(&c, Some(&committed)),
        [
            "proto/events/OrderConfirmed.v2.json differs from what the type generates (a compatible change: regenerate it)"
        ]
    );
}

#[test]
fn every_version_of_every_event_is_read_by_a_consumer_built_today() {
    let current: BTreeSet<&str> = AnyEvent::TYPES.iter().copied().collect();
    let listed: BTreeSet<&str> = contracts().iter().map(|c| c.event_type).collect();
    assert_eq!(current, listed, "AnyEvent lists every event type of the catalog");
    for c in contracts() {
        let event = received(&c);
        let decoded = AnyEvent::decode(&event).unwrap_or_else(|e| panic!("{}: {e}", c.id()));
        let decoded = decoded.unwrap_or_else(|| panic!("{} is not read", c.id()));
        if c.current {
            // The current version reads back as the example it was written from.
            let value = match &decoded {
                AnyEvent::OrderCreated(e) => serde_json::to_value(e),
                AnyEvent::OrderConfirmed(e) => serde_json::to_value(e),
                AnyEvent::OrderCancelled(e) => serde_json::to_value(e),
                AnyEvent::ProductCreated(e) => serde_json::to_value(e),
                AnyEvent::StockAdded(e) => serde_json::to_value(e),
                AnyEvent::StockReserved(e) => serde_json::to_value(e),
                AnyEvent::StockReleased(e) => serde_json::to_value(e),
                AnyEvent::StockCommitted(e) => serde_json::to_value(e),
                AnyEvent::AccountOpened(e) => serde_json::to_value(e),
                AnyEvent::AccountCredited(e) => serde_json::to_value(e),
                AnyEvent::PaymentCharged(e) => serde_json::to_value(e),
                AnyEvent::PaymentRefunded(e) => serde_json::to_value(e),
            };
            assert_eq!(value.unwrap(), c.example, "{}", c.id());
        }
    }
}

#[test]
fn a_version_newer_than_the_types_is_refused_not_guessed_at() {
    for c in contracts().into_iter().filter(|c| c.current) {
        let mut event = received(&c);
        event.schema_version += 1;
        let err = AnyEvent::decode(&event).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{} schema version {} is newer than version {}, the newest this consumer reads",
                c.event_type,
                c.version + 1,
                c.version
            )
        );
    }
}

fn received(c: &Contract) -> ReceivedEvent {
    ReceivedEvent {
        id: uuid::Uuid::now_v7(),
        event_type: c.event_type.into(),
        source: String::new(),
        schema_version: c.version,
        data_schema: Some(c.data_schema.clone()),
        aggregate_id: String::new(),
        time: None,
        payload: serde_json::to_vec(&c.example).unwrap(),
        traceparent: None,
        tracestate: None,
        topic: c.aggregate.into(),
        partition: 0,
        offset: 0,
        headers: vec![],
    }
}
