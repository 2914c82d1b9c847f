//! Builds and runs the order service: database, saga orchestrator and
//! worker, gRPC API, health.

use crate::config::Settings;
use crate::grpc::Orders;
use crate::saga::{orchestrator::Orchestrator, worker};
use crate::timeline::Timeline;
use sagaworks_outbox::service;
use sagaworks_proto::order::v1::order_service_server::OrderServiceServer;
use sagaworks_runtime::health::Readiness;
use sagaworks_runtime::host::{HostError, ServiceHost, Task};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("invalid client settings: {0}")]
    Client(#[from] sagaworks_resilience::ResilienceError),
    #[error("invalid saga settings: {0}")]
    Saga(String),
    #[error(transparent)]
    Messaging(#[from] sagaworks_outbox::OutboxError),
}

/// A bound, migrated, not yet serving order service.
pub struct Application {
    settings: Settings,
    host: ServiceHost,
    orchestrator: Orchestrator,
}

impl Application {
    /// Connects, migrates and binds both ports (0 = any free port).
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let migrations = vec![sqlx::migrate!("../../migrations/order"), sagaworks_outbox::migrator()];
        let host = ServiceHost::build(&settings.database, migrations, &settings.grpc, &settings.http)
            .await?
            .with_faults(&settings.fault);
        let inventory = sagaworks_resilience::channel("inventory", &settings.inventory)?;
        let payment = sagaworks_resilience::channel("payment", &settings.payment)?;
        let orchestrator = Orchestrator::new(host.pool().clone(), inventory, payment, settings.saga.clone())
            .map_err(StartupError::Saga)?;
        Ok(Self { settings, host, orchestrator })
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
        let orders = Orders::new(pool.clone(), self.orchestrator.clone(), shutdown.clone());
        let routes = tonic::service::Routes::new(OrderServiceServer::new(orders));
        let saga_worker: Task = Box::pin({
            let (orchestrator, pool, shutdown) = (self.orchestrator.clone(), pool.clone(), shutdown.clone());
            async move {
                worker::run(orchestrator, pool, shutdown).await;
                Ok(())
            }
        });
        let s = &self.settings;
        let readiness = service::readiness(Readiness::new(), &pool, &s.kafka, &s.outbox)?;
        let mut tasks = service::relay_task(&pool, &s.kafka, &s.outbox, &shutdown)?;
        tasks.push(service::consumer_task(&pool, &s.kafka, &s.consumer, Timeline, &shutdown)?);
        tasks.push(("saga worker", saga_worker));
        self.host.run(routes, readiness, tasks, shutdown).await?;
        Ok(())
    }
}
