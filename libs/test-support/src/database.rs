use sagaworks_config::DatabaseSettings;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Executor, PgConnection};
use std::str::FromStr;

const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A fresh database, dropped (with `FORCE`) when this value is dropped.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
    admin_url: String,
}

impl TestDatabase {
    /// The admin connection string (`SW_TEST_PG_URL`).
    pub fn admin_url() -> String {
        std::env::var("SW_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_string())
    }

    /// Creates `sw_<prefix>_<random>` on the local server.
    pub async fn create(prefix: &str) -> Self {
        let admin_url = Self::admin_url();
        let name = format!("sw_{}_{}", prefix, uuid::Uuid::new_v4().simple()).to_lowercase();
        let mut conn = PgConnection::connect(&admin_url).await.unwrap_or_else(|e| {
            panic!("PostgreSQL must run at {admin_url} for the tests (set SW_TEST_PG_URL): {e}")
        });
        // The name is ours (a prefix and a uuid), quoted.
        let create = format!(r#"CREATE DATABASE "{name}""#);
        conn.execute(AssertSqlSafe(create)).await.expect("create test database");
        let url = PgConnectOptions::from_str(&admin_url)
            .expect("valid SW_TEST_PG_URL")
            .database(&name)
            .to_url_lossy()
            .to_string();
        Self { name, url, admin_url }
    }

    /// Settings pointing a service at this database.
    pub fn settings(&self) -> DatabaseSettings {
        DatabaseSettings { url: self.url.clone(), ..Default::default() }
    }

    /// A small pool for the test's own queries.
    pub async fn pool(&self) -> PgPool {
        PgPoolOptions::new().max_connections(4).connect(&self.url).await.expect("connect to test database")
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop may run inside or outside a runtime: use a thread of our own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async {
                let mut conn = PgConnection::connect(&admin_url).await.ok()?;
                let drop = format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#);
                conn.execute(AssertSqlSafe(drop)).await.ok()
            })
        })
        .join();
    }
}
