//! The events {{name}} publishes (topic `<topic_prefix>.{{name}}`, key = item
//! id), as typed, versioned [`Event`]s: producers write them with
//! `outbox.append`/`outbox.stage`, consumers read them with `event.decode()`.
//!
//! They live here while nothing else reads them. Once another service does,
//! move them to `libs/events` (catalog, committed JSON Schema, AsyncAPI), so
//! producer and consumer share one type: docs/design.md, "Adding an event".

use sagaworks_outbox::Event;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Aggregate type of this service's events: they go to `<topic_prefix>.{{name}}`.
pub const AGGREGATE: &str = "{{name}}";

/// An item was created; its claim saga starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemCreated {
    pub item_id: Uuid,
    pub product_id: Uuid,
    pub name: String,
}

/// The item's claim saga reserved its unit: the item is active.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemActivated {
    pub item_id: Uuid,
}

/// The item's claim saga failed and compensated: the item is rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemRejected {
    pub item_id: Uuid,
    /// Why, for people.
    pub reason: String,
}

macro_rules! item_event {
    ($($ty:ident),+) => {$(
        impl Event for $ty {
            const TYPE: &'static str = stringify!($ty);
            const AGGREGATE: &'static str = AGGREGATE;
            const VERSION: i32 = 1;

            fn aggregate_id(&self) -> String {
                self.item_id.to_string()
            }
        }
    )+};
}
item_event!(ItemCreated, ItemActivated, ItemRejected);
