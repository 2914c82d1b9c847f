//! [`ServiceHost`]: what every gRPC service runs, in one place.
//!
//! A service's `startup` module builds a host (pool, migrations, both
//! listeners), then hands it its gRPC routes, readiness checks and background
//! tasks (outbox relay, consumers, saga workers). All of them stop on the
//! same shutdown token; the first one to fail stops the rest.
//! `fault.enabled` turns on fault injection (tests only, see [`crate::fault`]).

use crate::db::{self, DbError};
use crate::fault::{FaultInjector, FaultSettings};
use crate::health::{DbCheck, Readiness};
use futures::future::BoxFuture;
use sagaworks_config::{DatabaseSettings, Environment, KafkaSecurity, KafkaSettings, ListenSettings};
use sagaworks_mtls::{Identity, Policy, TlsSettings};
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A background task: runs until the token is cancelled.
pub type Task = BoxFuture<'static, Result<(), TaskError>>;
pub type TaskError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("cannot listen on {address}: {source}")]
    Bind { address: String, source: std::io::Error },
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("HTTP server failed: {0}")]
    Http(#[source] std::io::Error),
    #[error(transparent)]
    Unsafe(#[from] sagaworks_config::Unsafe),
    #[error(transparent)]
    Tls(#[from] sagaworks_mtls::TlsError),
    #[error(transparent)]
    Policy(#[from] sagaworks_mtls::PolicyError),
    #[error("background task {name} failed: {source}")]
    Task { name: &'static str, source: TaskError },
}

/// The settings [`ServiceHost::build`] reads, borrowed from a service's own
/// ([`host_settings!`](crate::host_settings) writes the borrowing).
#[derive(Debug, Clone, Copy)]
pub struct HostSettings<'a> {
    pub environment: Environment,
    pub database: &'a DatabaseSettings,
    pub grpc: &'a ListenSettings,
    pub http: &'a ListenSettings,
    pub tls: &'a TlsSettings,
    pub fault: &'a FaultSettings,
    /// Only checked here (production refuses plaintext); the relay and the consumers
    /// connect with it.
    pub kafka: &'a KafkaSettings,
}

/// `impl $settings { pub fn host(&self) -> HostSettings<'_> }`, for a service's settings
/// struct that has the fields of [`HostSettings`] under the same names.
#[macro_export]
macro_rules! host_settings {
    ($settings:ty) => {
        impl $settings {
            /// What the service host reads ([`ServiceHost::build`](sagaworks_runtime::host::ServiceHost::build)).
            pub fn host(&self) -> $crate::host::HostSettings<'_> {
                $crate::host::HostSettings {
                    environment: self.environment,
                    database: &self.database,
                    grpc: &self.grpc,
                    http: &self.http,
                    tls: &self.tls,
                    fault: &self.fault,
                    kafka: &self.kafka,
                }
            }
        }
    };
}

pub struct ServiceHost {
    pool: PgPool,
    grpc: TcpListener,
    http: TcpListener,
    faults: Option<FaultInjector>,
    identity: Option<Identity>,
    policy: Policy,
    name: &'static str,
}

/// Applies `migrators` to the database of `database` and closes the pool: the
/// `migrate` command of a service binary ([`crate::cli`]).
pub async fn migrate_only(
    database: &DatabaseSettings,
    mut migrators: Vec<Migrator>,
) -> Result<(), HostError> {
    Ok(db::migrate_as_owner(database, &mut migrators).await?)
}

impl ServiceHost {
    /// Refuses what `settings.environment` does not allow, loads the TLS identity
    /// (`tls`, see [`sagaworks_mtls`]), creates the pool, applies `migrators` (when
    /// `database.migrate`), binds both ports, and turns fault injection on when
    /// `fault.enabled` ([`crate::fault`]). `name` is the service's name in services.toml
    /// (its allow-list, its certificate's identity) and labels its request metrics.
    pub async fn build(
        name: &'static str,
        settings: HostSettings<'_>,
        mut migrators: Vec<Migrator>,
    ) -> Result<Self, HostError> {
        let HostSettings { environment, database, grpc, http, tls, fault, kafka } = settings;
        environment.refuse(&[
            (!tls.enabled(), "tls", "the gRPC port would be plaintext and admit any caller; set tls.ca_file, tls.cert_file and tls.key_file"),
            (fault.enabled, "fault.enabled", "/fault lets anyone who reaches the HTTP port fail or slow down every gRPC call"),
            (!kafka.is_encrypted(), "kafka.security_protocol", "plaintext Kafka lets anyone who reaches a broker read every event and forge any, past the consumers' source check; set sasl_ssl"),
            (kafka.security_protocol == KafkaSecurity::SaslSsl && (kafka.sasl_username.is_empty() || kafka.sasl_password.is_empty()), "kafka.sasl_password", "sasl_ssl needs the service's own user: set kafka.sasl_username and kafka.sasl_password"),
        ])?;
        // Before anything records a metric, so nothing recorded is lost.
        crate::metrics::handle();
        let identity = Identity::load(tls, name)?;
        if identity.is_none() {
            tracing::warn!("tls is off: the gRPC port is plaintext and admits any caller (development only)");
        }
        // Checked before anything else starts: a broken allow-list is a build error, in effect.
        let policy = Policy::for_service(name)?;
        if database.migrate {
            db::migrate_as_owner(database, &mut migrators).await?;
        }
        let pool = db::pool(database)?;
        let host = Self {
            pool,
            grpc: listen(grpc).await?,
            http: listen(http).await?,
            faults: None,
            identity,
            policy,
            name,
        };
        Ok(host.with_faults(fault))
    }

    /// This service's TLS identity, for its own gRPC clients; `None` when TLS is off.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// With `fault.enabled`, the gRPC routes get the fault layer and the HTTP port
    /// serves `/fault` ([`crate::fault`]); otherwise nothing changes. Test use only.
    fn with_faults(mut self, fault: &FaultSettings) -> Self {
        if fault.enabled {
            tracing::warn!("fault injection is enabled: PUT /fault can slow down or fail gRPC calls");
            self.faults = Some(FaultInjector::new());
        }
        self
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn grpc_port(&self) -> u16 {
        self.grpc.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    pub fn http_port(&self) -> u16 {
        self.http.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// Serves `routes` on the gRPC port and health/metrics (with the database
    /// check added to `readiness`) on the HTTP port, and runs `tasks`, until
    /// `shutdown` is cancelled or one of them fails.
    pub async fn run(
        self,
        routes: tonic::service::Routes,
        readiness: Readiness,
        tasks: Vec<(&'static str, Task)>,
        shutdown: CancellationToken,
    ) -> Result<(), HostError> {
        let readiness = readiness.with_check(DbCheck(self.pool.clone()));
        let (routes, router) = match &self.faults {
            Some(faults) => (
                tonic::service::Routes::from(routes.into_axum_router().layer(faults.layer())),
                readiness.router().merge(faults.router()),
            ),
            None => (routes, readiness.router()),
        };
        // Whatever ends first (error or not), everything else is told to stop.
        let stop_all = shutdown.clone();
        let guard = stop_all.clone().drop_guard();
        let servers = async {
            tokio::try_join!(
                async {
                    let tls = self.identity.as_ref().map(|identity| (identity, self.policy.clone()));
                    crate::serve::grpc(self.name, self.grpc, routes, tls, shutdown.clone())
                        .await
                        .map_err(HostError::from)
                },
                async {
                    crate::serve::http(self.http, router, shutdown.clone()).await.map_err(HostError::Http)
                },
            )
            .map(|_| ())
        };
        let background = futures::future::try_join_all(tasks.into_iter().map(|(name, task)| async move {
            task.await.map_err(|source| HostError::Task { name, source })
        }));
        let result = tokio::try_join!(servers, background).map(|_| ());
        if let Err(e) = &result {
            tracing::error!(error = %e, "service stopping after a failure");
        }
        drop(guard);
        result
    }
}

async fn listen(settings: &ListenSettings) -> Result<TcpListener, HostError> {
    crate::bind(settings).await.map_err(|source| HostError::Bind { address: settings.address(), source })
}
