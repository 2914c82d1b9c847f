//! A ledger of every event written to an outbox, for verification runs and
//! tests: not for production.
//!
//! The relay deletes a row once the broker acked it ([`Relay`](crate::Relay),
//! "Published means deleted"), so after a run the outbox no longer says what
//! was written. Whoever must compare what was committed with what reached
//! Kafka (the `check` tool after a chaos run, a test asserting an event's
//! content) installs the ledger first: a trigger that copies each inserted
//! outbox row, in the writer's transaction, into `outbox_ledger` (the outbox's
//! columns). A row is in the ledger if and only if its business transaction
//! committed, whatever the relay did to it afterwards.
//!
//! It costs every writer a second insert, which is why services never install
//! it themselves.

use sqlx::PgPool;

/// Installs the ledger on `pool`'s database (idempotent; it records what is
/// written from now on). Needs a role that may create tables, functions and
/// triggers on `outbox` (the owner of the schema, or the server's admin); the
/// trigger's function runs with that role's rights (`SECURITY DEFINER`), so
/// the services' runtime roles need no grant on the ledger.
pub async fn install(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS outbox_ledger (LIKE outbox);
         CREATE INDEX IF NOT EXISTS outbox_ledger_aggregate ON outbox_ledger (aggregate_id, seq);
         CREATE OR REPLACE FUNCTION outbox_ledger_record() RETURNS trigger
             LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
             BEGIN
                 INSERT INTO outbox_ledger SELECT * FROM written;
                 RETURN NULL;
             END $$;
         CREATE OR REPLACE TRIGGER outbox_ledger AFTER INSERT ON outbox REFERENCING NEW TABLE AS written
             FOR EACH STATEMENT EXECUTE FUNCTION outbox_ledger_record();",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Whether the ledger is installed on `pool`'s database.
pub async fn installed(pool: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                        WHERE t.tgname = 'outbox_ledger' AND c.oid = to_regclass('outbox'))",
    )
    .fetch_one(pool)
    .await
}
