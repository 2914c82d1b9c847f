//! Items in {{name}}'s own database. Every change writes its event to the
//! outbox in the same transaction, so the event exists iff the change committed;
//! a new item's saga ([`crate::saga`]) starts in that transaction too.

use crate::error::{Error, Result};
use crate::saga::{ClaimInput, ClaimUnit};
use chrono::{DateTime, Utc};
use crate::contract::ItemCreated;
use sagaworks_outbox::OutboxWriter;
use sagaworks_saga::{Engine, NEW_INSTANCE, NewInstance, Statement};
use sqlx::{AssertSqlSafe, FromRow, PgConnection};
use uuid::Uuid;

#[derive(Debug, Clone, FromRow)]
pub struct Item {
    pub id: Uuid,
    pub product_id: Uuid,
    pub name: String,
    /// `PENDING` while its claim saga runs, then `ACTIVE` or `REJECTED`.
    pub status: String,
    pub created_at: DateTime<Utc>,
}

pub struct NewItem {
    pub id: Uuid,
    pub product_id: Uuid,
    pub name: String,
}

/// A new item and its claim saga, created (not yet driven).
pub struct Created {
    pub item: Item,
    pub saga: NewInstance<ClaimUnit>,
    pub saga_created_at: DateTime<Utc>,
}

const ITEM_COLUMNS: &str = "id, product_id, name, status, created_at";

/// Inserts the item, its `ItemCreated` event and its claim saga (see
/// [`Engine::insert`]; `first_attempt`: the caller holds a permit and drives
/// the saga at once).
pub async fn create(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    engine: &Engine<ClaimUnit>,
    new: NewItem,
    first_attempt: bool,
) -> Result<Created> {
    let item = sqlx::query_as::<_, Item>(AssertSqlSafe(format!(
        "INSERT INTO items (id, product_id, name) VALUES ($1, $2, $3)
         ON CONFLICT DO NOTHING RETURNING {ITEM_COLUMNS}"
    )))
    .bind(new.id)
    .bind(new.product_id)
    .bind(&new.name)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(Error::DuplicateItem(new.id))?;
    let event = ItemCreated { item_id: item.id, product_id: item.product_id, name: item.name.clone() };
    outbox.append(conn, &event).await?;

    let saga = NewInstance {
        id: Uuid::now_v7(),
        key: item.id.to_string(),
        input: ClaimInput { item_id: item.id, product_id: item.product_id },
        traceparent: sagaworks_telemetry::propagation::current_traceparent(),
    };
    // The instance's rows, in the same transaction as the item.
    let mut w = Statement::new("one");
    w.with("one", "SELECT 1");
    engine.insert(&mut w, &saga, first_attempt).map_err(|e| Error::Saga(e.to_string()))?;
    let (sql, args) = w.finish(&format!("SELECT created_at FROM {NEW_INSTANCE}"))?;
    let saga_created_at = sqlx::query_scalar_with(AssertSqlSafe(sql), args).fetch_one(&mut *conn).await?;
    Ok(Created { item, saga, saga_created_at })
}

pub async fn get(conn: &mut PgConnection, id: Uuid) -> Result<Item> {
    Ok(sqlx::query_as::<_, Item>(AssertSqlSafe(format!("SELECT {ITEM_COLUMNS} FROM items WHERE id = $1")))
        .bind(id)
        .fetch_one(conn)
        .await?)
}
