//! The service's own PostgreSQL database.

use sagaworks_config::DatabaseSettings;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use std::str::FromStr;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("invalid database url: {0}")]
    Url(#[source] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database unreachable: {0}")]
    Connect(#[source] sqlx::Error),
}

/// A lazily connecting pool: the service starts (and reports not-ready) even
/// when its database is down, and recovers when it comes back.
pub(crate) fn pool(settings: &DatabaseSettings) -> Result<PgPool, DbError> {
    let mut options = PgConnectOptions::from_str(&settings.url).map_err(DbError::Url)?;
    if !settings.plan_cache_mode.is_empty() {
        options = options.options([("plan_cache_mode", settings.plan_cache_mode.as_str())]);
    }
    Ok(PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(Duration::from_millis(settings.acquire_timeout_ms))
        .test_before_acquire(settings.test_before_acquire)
        .connect_lazy_with(options))
}

/// Applies `migrators` as the database's owner (`owner_url`; `url` when empty) on a
/// connection of their own, closed afterwards: the service's pool keeps the runtime role.
pub async fn migrate_as_owner(
    settings: &DatabaseSettings,
    migrators: &mut [Migrator],
) -> Result<(), DbError> {
    let url = if settings.owner_url.is_empty() { &settings.url } else { &settings.owner_url };
    let owner = DatabaseSettings { url: url.clone(), max_connections: 1, ..settings.clone() };
    let pool = pool(&owner)?;
    let result = migrate(&pool, migrators).await;
    pool.close().await;
    result
}

/// Applies `migrators` in order. Each may share the `_sqlx_migrations` table
/// with the others (versions must not collide), so a shared library (the
/// outbox) can ship its own tables next to the service's.
pub async fn migrate(pool: &PgPool, migrators: &mut [Migrator]) -> Result<(), DbError> {
    for m in migrators.iter_mut() {
        m.set_ignore_missing(true);
        m.run(pool).await?;
    }
    Ok(())
}

/// A FROM item (`..., {NO_FLUSH_WAIT}`) that lets the statement's transaction
/// commit without waiting for its WAL flush: `synchronous_commit = off` for
/// that transaction only, set inside the statement (PostgreSQL reads the
/// setting at commit), so it costs no round trip. Use it only for a commit
/// whose loss in a database crash is harmless; any later synchronous commit
/// on the server flushes it too.
pub const NO_FLUSH_WAIT: &str = "(SELECT set_config('synchronous_commit', 'off', true)) no_flush_wait";

/// `SELECT 1` within `timeout`.
pub(crate) async fn ping(pool: &PgPool, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, sqlx::query("SELECT 1").execute(pool)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sagaworks_test_support::TestDatabase;

    #[tokio::test]
    async fn connections_use_the_configured_plan_cache_mode() {
        let db = TestDatabase::create("db_plan_cache_mode").await;
        for (setting, expected) in [("force_generic_plan", "force_generic_plan"), ("", "auto")] {
            let settings = DatabaseSettings {
                url: db.url.clone(),
                plan_cache_mode: setting.into(),
                ..Default::default()
            };
            let pool = pool(&settings).unwrap();
            let mode: String = sqlx::query_scalar("SHOW plan_cache_mode").fetch_one(&pool).await.unwrap();
            assert_eq!(mode, expected, "setting {setting:?}");
            pool.close().await;
        }
    }
}
