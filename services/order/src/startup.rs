//! Builds and runs the order service: database, saga orchestrator and
//! worker, gRPC API, health.

use crate::config::Settings;
use crate::dead_letters::DeadLetterApi;
use crate::grpc::Orders;
use crate::saga::{self, PlaceOrder};
use crate::timeline::Timeline;
use sagaworks_outbox::{DeadLetters, service};
use sagaworks_proto::deadletter::v1::dead_letter_service_server::DeadLetterServiceServer;
use sagaworks_proto::order::v1::order_service_server::OrderServiceServer;
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

/// A bound, migrated, not yet serving order service.
pub struct Application {
    settings: Settings,
    host: ServiceHost,
    saga: Engine<PlaceOrder>,
}

/// The service's migrations: the saga library's tables first (an order
/// migration moves the sagas of an older release into them), its own, the
/// outbox library's.
pub fn migrators() -> Vec<sqlx::migrate::Migrator> {
    vec![sagaworks_saga::migrator(), sqlx::migrate!("../../migrations/order"), sagaworks_outbox::migrator()]
}

/// `order migrate`: applies [`migrators`] and returns.
pub async fn migrate(settings: &Settings) -> Result<(), StartupError> {
    Ok(sagaworks_runtime::migrate_only(&settings.database, migrators()).await?)
}

impl Application {
    /// Connects, migrates and binds both ports (0 = any free port).
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let migrations = migrators();
        let host = ServiceHost::build("order", settings.host(), migrations).await?;
        let inventory = sagaworks_resilience::channel("inventory", &settings.inventory, host.identity())?;
        let payment = sagaworks_resilience::channel("payment", &settings.payment, host.identity())?;
        let saga =
            Engine::new(host.pool().clone(), saga::versions(inventory, payment), settings.saga.clone())?;
        // Refuses to start when it would strand or misread an instance in flight.
        saga.register().await?;
        Ok(Self { settings, host, saga })
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
        let pool = self.host.pool().clone();
        let orders = Orders::new(pool.clone(), self.saga.clone(), shutdown.clone());
        let s = &self.settings;
        let dead_letters = DeadLetters::new(pool.clone(), &s.kafka, s.dead_letters.clone())?;
        let routes = tonic::service::Routes::new(OrderServiceServer::new(orders))
            .add_service(DeadLetterServiceServer::new(DeadLetterApi::new(dead_letters.clone())));
        let shutdown_gauges = shutdown.clone();
        let readiness = service::readiness(Readiness::new(), &pool, &s.kafka, &s.outbox)?;
        let mut tasks = service::relay_task(&pool, &s.kafka, &s.outbox, &shutdown)?;
        tasks.push(service::consumer_task(&pool, &s.kafka, &s.consumer, Timeline, &shutdown)?);
        tasks.push(self.saga.worker_task(&shutdown));
        tasks.push((
            "dead-letter gauges",
            Box::pin(async move {
                dead_letters.run_gauges(shutdown_gauges).await;
                Ok(())
            }),
        ));
        self.host.run(routes, readiness, tasks, shutdown).await?;
        Ok(())
    }
}
