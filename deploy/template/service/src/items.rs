//! Items in {{name}}'s own database. Every change writes its event to the
//! outbox in the same transaction, so the event exists iff the change committed;
//! a new item's saga ([`crate::saga`]) starts in that transaction too.

use crate::error::{Error, Result};
use crate::saga::{ClaimInput, ClaimUnit};
use chrono::{DateTime, Utc};
use crate::contract::ItemCreated;
use sagaworks_outbox::OutboxWriter;
use sagaworks_saga::{Engine, Started};
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

/// A new item and its claim saga, created (not yet driven: [`Started::run`]).
pub struct Created {
    pub item: Item,
    pub saga: Started<ClaimUnit>,
}

const ITEM_COLUMNS: &str = "id, product_id, name, status, created_at";

/// Inserts the item, its `ItemCreated` event and its claim saga (see
/// [`Engine::start`]) in the caller's transaction.
pub async fn create(
    conn: &mut PgConnection,
    outbox: &OutboxWriter,
    engine: &Engine<ClaimUnit>,
    new: NewItem,
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

    // The instance's rows, in the same transaction as the item.
    let input = ClaimInput { item_id: item.id, product_id: item.product_id };
    let saga = engine.start(conn, item.id.to_string(), input).await?;
    Ok(Created { item, saga })
}

pub async fn get(conn: &mut PgConnection, id: Uuid) -> Result<Item> {
    Ok(sqlx::query_as::<_, Item>(AssertSqlSafe(format!("SELECT {ITEM_COLUMNS} FROM items WHERE id = $1")))
        .bind(id)
        .fetch_one(conn)
        .await?)
}
