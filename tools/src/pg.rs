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

/// The server of one service's database when it is not the default one
/// (`--pg-server SERVICE=URL`): each service has a server of its own in the
/// Kubernetes dev overlay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgServer {
    pub service: String,
    pub url: String,
}

impl Databases {
    pub const SERVICES: [&'static str; 3] = ["order", "inventory", "payment"];

    /// Connects to `<prefix>_<service>` of each service, on the server `servers`
    /// names for it, else on `admin_url`'s.
    pub async fn connect(admin_url: &str, prefix: &str, servers: &[PgServer]) -> Result<Self, ToolError> {
        let server = |service: &str| server_of(admin_url, servers, service);
        Ok(Self {
            order: connect(server("order"), &format!("{prefix}_order")).await?,
            inventory: connect(server("inventory"), &format!("{prefix}_inventory")).await?,
            payment: connect(server("payment"), &format!("{prefix}_payment")).await?,
        })
    }

    /// Each database with its service name.
    pub fn all(&self) -> [(&'static str, &PgPool); 3] {
        [("order", &self.order), ("inventory", &self.inventory), ("payment", &self.payment)]
    }
}

/// The server of `service`'s database: the last of `servers` naming it, else `admin_url`.
pub fn server_of<'a>(admin_url: &'a str, servers: &'a [PgServer], service: &str) -> &'a str {
    servers.iter().rev().find(|s| s.service == service).map_or(admin_url, |s| s.url.as_str())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_uses_its_own_server_when_one_is_named() {
        let servers = [
            PgServer { service: "order".into(), url: "postgres://o1".into() },
            PgServer { service: "payment".into(), url: "postgres://p".into() },
            PgServer { service: "order".into(), url: "postgres://o2".into() },
        ];
        assert_eq!(server_of("postgres://admin", &servers, "order"), "postgres://o2");
        assert_eq!(server_of("postgres://admin", &servers, "payment"), "postgres://p");
        assert_eq!(server_of("postgres://admin", &servers, "inventory"), "postgres://admin");
        assert_eq!(server_of("postgres://admin", &[], "order"), "postgres://admin");
    }
}
