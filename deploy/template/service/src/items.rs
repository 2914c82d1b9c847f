//! Items in {{name}}'s own database. Every change writes its event to the
//! outbox in the same transaction, so the event exists iff the change committed.

use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use sagaworks_outbox::{NewEvent, OutboxWriter};
use sqlx::{FromRow, PgConnection};
use uuid::Uuid;

/// Aggregate type of this service's events: they go to `<topic_prefix>.{{name}}`.
pub const AGGREGATE: &str = "{{name}}";

#[derive(Debug, Clone, FromRow)]
pub struct Item {
    pub id: Uuid,
    pub product_id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

pub struct NewItem {
    pub id: Uuid,
    pub product_id: Uuid,
    pub name: String,
}

/// Inserts the item and its `ItemCreated` event.
pub async fn create(conn: &mut PgConnection, outbox: &OutboxWriter, new: NewItem) -> Result<Item> {
    let item = sqlx::query_as::<_, Item>(
        "INSERT INTO items (id, product_id, name) VALUES ($1, $2, $3)
         ON CONFLICT DO NOTHING RETURNING id, product_id, name, created_at",
    )
    .bind(new.id)
    .bind(new.product_id)
    .bind(&new.name)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(Error::DuplicateItem(new.id))?;
    let event = serde_json::json!({ "item_id": item.id, "product_id": item.product_id, "name": item.name });
    outbox.write(conn, NewEvent::new(AGGREGATE, item.id, "ItemCreated", event)?).await?;
    Ok(item)
}
