//! Builds and runs the {{name}} service: database, gRPC API, saga engine and
//! worker, outbox relay, event consumer, health.

use crate::config::Settings;
use crate::events::OrderEvents;
use crate::grpc::Items;
use crate::saga::{self, ClaimUnit};
use crate::pb::{{name}}_service_server::{{Name}}ServiceServer;
use sagaworks_outbox::service;
use sagaworks_resilience::ResilientChannel;
use sagaworks_runtime::Readiness;
use sagaworks_runtime::{HostError, ServiceHost};
use sagaworks_saga::Engine;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("invalid client settings: {0}")]
    Client(#[from] sagaworks_resilience::ResilienceError),
    #[error(transparent)]
    Saga(#[from] sagaworks_saga::SettingsError),
    /// The database holds instances this binary's saga versions cannot drive.
    #[error(transparent)]
    SagaVersions(#[from] sagaworks_saga::VersionError),
    #[error(transparent)]
    Messaging(#[from] sagaworks_outbox::OutboxError),
}

/// A bound, migrated, not yet serving {{name}} service.
pub struct Application {
    settings: Settings,
    host: ServiceHost,
    inventory: ResilientChannel,
    saga: Engine<ClaimUnit>,
}

/// The service's migrations: its own tables, the outbox and saga libraries'.
pub fn migrators() -> Vec<sqlx::migrate::Migrator> {
    vec![sqlx::migrate!("../../migrations/{{name}}"), sagaworks_outbox::migrator(), sagaworks_saga::migrator()]
}

/// `{{name}} migrate`: applies [`migrators`] and returns.
pub async fn migrate(settings: &Settings) -> Result<(), StartupError> {
    Ok(sagaworks_runtime::migrate_only(&settings.database, migrators()).await?)
}

impl Application {
    /// Connects, migrates and binds both ports (0 = any free port).
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let migrations = migrators();
        let host = ServiceHost::build("{{name}}", settings.host(), migrations).await?;
        let inventory = sagaworks_resilience::channel("inventory", &settings.inventory, host.identity())?;
        let saga = Engine::new(host.pool().clone(), saga::versions(inventory.clone()), settings.saga.clone())?;
        // Refuses to start when it would strand or misread an instance in flight.
        saga.register().await?;
        Ok(Self { settings, host, inventory, saga })
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
        let items = Items::new(pool.clone(), self.inventory, self.saga.clone(), shutdown.clone());
        let routes = tonic::service::Routes::new({{Name}}ServiceServer::new(items));
        let readiness = service::readiness(Readiness::new(), &pool, &s.kafka, &s.outbox)?;
        let mut tasks = service::relay_task(&pool, &s.kafka, &s.outbox, &shutdown)?;
        tasks.push(service::consumer_task(&pool, &s.kafka, &s.consumer, OrderEvents, &shutdown)?);
        // Resumes sagas whose driver stopped (a crash, a restart, a retry).
        tasks.push(self.saga.worker_task(&shutdown));
        Ok(self.host.run(routes, readiness, tasks, shutdown).await?)
    }
}
