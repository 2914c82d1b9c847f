//! Connections to the services' databases. The checker is an operator tool:
//! it reads every service's database with the admin role, which no service
//! may do.

use crate::ToolError;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::str::FromStr;

/// The three service databases, `<prefix>_order`, `<prefix>_inventory`, `<prefix>_payment`.
#[derive(Debug, Clone)]
pub struct Databases {
    pub order: PgPool,
    pub inventory: PgPool,
    pub payment: PgPool,
}

/// A small pool on database `db` of the server at `admin_url`.
pub async fn connect(admin_url: &str, db: &str) -> Result<PgPool, ToolError> {
    let options = PgConnectOptions::from_str(admin_url)?.database(db);
    Ok(PgPoolOptions::new().max_connections(2).connect_with(options).await?)
}

impl Databases {
    pub async fn connect(admin_url: &str, prefix: &str) -> Result<Self, ToolError> {
        Ok(Self {
            order: connect(admin_url, &format!("{prefix}_order")).await?,
            inventory: connect(admin_url, &format!("{prefix}_inventory")).await?,
            payment: connect(admin_url, &format!("{prefix}_payment")).await?,
        })
    }

    /// Each database with its service name.
    pub fn all(&self) -> [(&'static str, &PgPool); 3] {
        [("order", &self.order), ("inventory", &self.inventory), ("payment", &self.payment)]
    }
}

/// Transactions committed on the whole server so far (`pg_stat_database`),
/// to count commits per saga over a run. The statistics are flushed about
/// once a second, so take deltas over runs of many seconds.
pub async fn server_commits(pool: &PgPool) -> Result<i64, ToolError> {
    Ok(sqlx::query_scalar("SELECT COALESCE(sum(xact_commit), 0)::BIGINT FROM pg_stat_database")
        .fetch_one(pool)
        .await?)
}

/// Transactions committed so far per database of the server (`pg_stat_database`).
pub async fn commits_by_database(
    pool: &PgPool,
) -> Result<std::collections::BTreeMap<String, i64>, ToolError> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT datname::text, xact_commit FROM pg_stat_database WHERE datname IS NOT NULL")
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().collect())
}
