//! Builds and runs the payment service: database, gRPC API, health.

use crate::config::Settings;
use crate::grpc::Payments;
use sagaworks_outbox::service;
use sagaworks_proto::payment::v1::payment_service_server::PaymentServiceServer;
use sagaworks_runtime::Readiness;
use sagaworks_runtime::{HostError, ServiceHost};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Messaging(#[from] sagaworks_outbox::OutboxError),
}

/// A bound, migrated, not yet serving payment service.
pub struct Application {
    settings: Settings,
    host: ServiceHost,
}

/// The service's migrations: its own tables and the outbox library's.
pub fn migrators() -> Vec<sqlx::migrate::Migrator> {
    vec![sqlx::migrate!("../../migrations/payment"), sagaworks_outbox::migrator()]
}

/// `payment migrate`: applies [`migrators`] and returns.
pub async fn migrate(settings: &Settings) -> Result<(), StartupError> {
    Ok(sagaworks_runtime::migrate_only(&settings.database, migrators()).await?)
}

impl Application {
    /// Connects, migrates and binds both ports (0 = any free port).
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let migrations = migrators();
        let host = ServiceHost::build("payment", settings.host(), migrations).await?;
        Ok(Self { settings, host })
    }

    pub fn grpc_port(&self) -> u16 {
        self.host.grpc_port()
    }

    pub fn http_port(&self) -> u16 {
        self.host.http_port()
    }

    pub fn pool(&self) -> &PgPool {
        self.host.pool()
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Serves until `shutdown` is cancelled, then drains and returns.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), StartupError> {
        let s = &self.settings;
        let pool = self.host.pool().clone();
        let routes = tonic::service::Routes::new(PaymentServiceServer::new(Payments::new(pool.clone())));
        let readiness = service::readiness(Readiness::new(), &pool, &s.kafka, &s.outbox)?;
        let tasks = service::relay_task(&pool, &s.kafka, &s.outbox, &shutdown)?;
        Ok(self.host.run(routes, readiness, tasks, shutdown).await?)
    }
}
