//! [`ServiceHost`]: what every gRPC service runs, in one place.
//!
//! A service's `startup` module builds a host (pool, migrations, both
//! listeners), then hands it its gRPC routes, readiness checks and background
//! tasks (outbox relay, consumers, saga workers). All of them stop on the
//! same shutdown token; the first one to fail stops the rest.
//! `fault.enabled` turns on fault injection (tests only, see [`crate::fault`]).
//! In production the host refuses to build with any test hook on or any setting only
//! safe on a developer's machine ([`HostSettings::check`]).

use crate::db::{self, DbError};
#[cfg(feature = "test-hooks")]
use crate::fault::FaultInjector;
use crate::fault::FaultSettings;
use crate::health::{DbCheck, Readiness};
use futures::future::BoxFuture;
use sagaworks_config::{DatabaseSettings, Environment, KafkaSettings, ListenSettings, Unsafe};
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
    NotBuiltIn(#[from] NotBuiltIn),
    #[error(transparent)]
    Tls(#[from] sagaworks_mtls::TlsError),
    #[error(transparent)]
    Policy(#[from] sagaworks_mtls::PolicyError),
    #[error("background task {name} failed: {source}")]
    Task { name: &'static str, source: TaskError },
}

/// Settings that hold test-only hooks (crash points, injected faults), which production
/// refuses: the libraries' settings implement it, and a service lists the fields that
/// hold them in [`host_settings!`](crate::host_settings).
pub trait TestHooks {
    /// The hooks switched on: each one's key below the settings (`crash_point`) and why
    /// production refuses it.
    fn hooks_on(&self) -> Vec<(&'static str, &'static str)>;

    /// Whether this binary holds the hooks' code: the cargo feature `test-hooks` of the
    /// library that implements them (`cfg!(feature = "test-hooks")` there). A hook that
    /// is on but not built in is refused in every environment: it would do nothing.
    fn built_in(&self) -> bool;
}

/// One test hook that is on, as [`HostSettings::check`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestHook {
    /// Its full key (`saga.crash_point`).
    pub key: String,
    /// Why production refuses it.
    pub why: &'static str,
    /// Whether its code is in this binary ([`TestHooks::built_in`]).
    pub built_in: bool,
}

/// A test hook switched on in a binary built without it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{setting} is on, but this binary is built without test hooks (the cargo feature `test-hooks`, \
     which release images leave out): it would do nothing"
)]
pub struct NotBuiltIn {
    pub setting: String,
}

/// The settings [`ServiceHost::build`] reads, borrowed from a service's own
/// ([`host_settings!`](crate::host_settings) writes the borrowing).
#[derive(Debug, Clone)]
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
    /// The service's test hooks that are on ([`TestHooks`]).
    pub test_hooks: Vec<TestHook>,
    /// services.toml as compiled into the service ([`services_toml!`](crate::services_toml)):
    /// its allow-list.
    pub services_toml: &'static str,
}

impl HostSettings<'_> {
    /// `Err` naming the first setting that is refused: in every environment a test hook
    /// (fault injection included) that this binary is built without ([`NotBuiltIn`]); in
    /// production TLS off, fault injection, any test hook, a plaintext or anonymous
    /// Kafka, a committed development password.
    pub fn check(&self) -> Result<(), HostError> {
        let fault = (self.fault.enabled, "fault.enabled".to_owned(), cfg!(feature = "test-hooks"));
        let hooks = self.test_hooks.iter().map(|h| (true, h.key.clone(), h.built_in));
        if let Some((_, setting, _)) =
            std::iter::once(fault).chain(hooks).find(|(on, _, built)| *on && !built)
        {
            return Err(NotBuiltIn { setting }.into());
        }
        Ok(self.check_environment()?)
    }

    fn check_environment(&self) -> Result<(), Unsafe> {
        let mut checks = vec![
            (
                !self.tls.enabled(),
                "tls",
                "the gRPC port would be plaintext and admit any caller; set tls.ca_file, tls.cert_file and tls.key_file",
            ),
            (
                self.fault.enabled,
                "fault.enabled",
                "/fault lets anyone who reaches the HTTP port fail or slow down every gRPC call",
            ),
        ];
        checks.extend(self.test_hooks.iter().map(|h| (true, h.key.as_str(), h.why)));
        checks.extend(self.kafka.production_checks());
        checks.extend(self.database.production_checks());
        self.environment.refuse(&checks)
    }
}

/// `impl $settings { pub fn host(&self) -> HostSettings<'_> }`, for a service's settings
/// struct that has the fields of [`HostSettings`] under the same names. `test_hooks:
/// [outbox, consumer, saga]` names the fields whose settings hold test hooks
/// ([`TestHooks`]), which production refuses: list every such field.
#[macro_export]
macro_rules! host_settings {
    ($settings:ty $(, test_hooks: [$($hooks:ident),* $(,)?])?) => {
        impl $settings {
            /// What the service host reads ([`ServiceHost::build`](sagaworks_runtime::ServiceHost::build)).
            pub fn host(&self) -> $crate::HostSettings<'_> {
                #[allow(unused_mut)]
                let mut test_hooks: Vec<$crate::TestHook> = Vec::new();
                $($(
                    for (key, why) in $crate::TestHooks::hooks_on(&self.$hooks) {
                        test_hooks.push($crate::TestHook {
                            key: format!("{}.{key}", stringify!($hooks)),
                            why,
                            built_in: $crate::TestHooks::built_in(&self.$hooks),
                        });
                    }
                )*)?
                $crate::HostSettings {
                    environment: self.environment,
                    database: &self.database,
                    grpc: &self.grpc,
                    http: &self.http,
                    tls: &self.tls,
                    fault: &self.fault,
                    kafka: &self.kafka,
                    test_hooks,
                    services_toml: $crate::services_toml!(),
                }
            }
        }
    };
}

/// services.toml, compiled into the crate that expands it: a service at
/// `services/<name>/` of the repository. The libraries read no deployment file; the
/// service hands this to them (its allow-list, its consumers' accepted sources).
#[macro_export]
macro_rules! services_toml {
    () => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../services.toml"))
    };
}

pub struct ServiceHost {
    pool: PgPool,
    grpc: TcpListener,
    http: TcpListener,
    #[cfg(feature = "test-hooks")]
    faults: Option<FaultInjector>,
    identity: Option<Identity>,
    policy: Policy,
    name: &'static str,
}

/// Applies `migrators` to the database of `database` and closes the pool: the
/// `migrate` command of a service binary ([`crate::ServiceCommand`]).
pub async fn migrate_only(
    database: &DatabaseSettings,
    mut migrators: Vec<Migrator>,
) -> Result<(), HostError> {
    Ok(db::migrate_as_owner(database, &mut migrators).await?)
}

impl ServiceHost {
    /// Refuses what `settings.environment` does not allow ([`HostSettings::check`]), loads the TLS identity
    /// (`tls`, see [`sagaworks_mtls`]), creates the pool, applies `migrators` (when
    /// `database.migrate`), binds both ports, and turns fault injection on when
    /// `fault.enabled` ([`crate::FaultSettings`]). `name` is the service's name in services.toml
    /// (its allow-list, its certificate's identity) and labels its request metrics.
    pub async fn build(
        name: &'static str,
        settings: HostSettings<'_>,
        mut migrators: Vec<Migrator>,
    ) -> Result<Self, HostError> {
        settings.check()?;
        let HostSettings { database, grpc, http, tls, fault, services_toml, .. } = settings;
        // Before anything records a metric, so nothing recorded is lost.
        crate::metrics::handle();
        let identity = Identity::load(tls, name)?;
        if identity.is_none() {
            tracing::warn!("tls is off: the gRPC port is plaintext and admits any caller (development only)");
        }
        // Checked before anything else starts: a broken allow-list is a build error, in effect.
        let policy = Policy::parse(services_toml, name)?;
        if database.migrate {
            db::migrate_as_owner(database, &mut migrators).await?;
        }
        let pool = db::pool(database)?;
        let host = Self {
            pool,
            grpc: listen(grpc).await?,
            http: listen(http).await?,
            #[cfg(feature = "test-hooks")]
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
    #[cfg(feature = "test-hooks")]
    fn with_faults(mut self, fault: &FaultSettings) -> Self {
        if fault.enabled {
            tracing::warn!("fault injection is enabled: PUT /fault can slow down or fail gRPC calls");
            self.faults = Some(FaultInjector::new());
        }
        self
    }

    /// Without the feature, `fault.enabled` was refused by [`HostSettings::check`].
    #[cfg(not(feature = "test-hooks"))]
    fn with_faults(self, _: &FaultSettings) -> Self {
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
    /// `shutdown` is cancelled or one of them fails. Meanwhile the TLS files are read
    /// again every `tls.reload_interval_ms` ([`Identity::watch`]).
    pub async fn run(
        self,
        routes: tonic::service::Routes,
        readiness: Readiness,
        tasks: Vec<(&'static str, Task)>,
        shutdown: CancellationToken,
    ) -> Result<(), HostError> {
        let readiness = readiness.with_check(DbCheck(self.pool.clone()));
        #[cfg(feature = "test-hooks")]
        let (routes, router) = match &self.faults {
            Some(faults) => (
                tonic::service::Routes::from(routes.into_axum_router().layer(faults.layer())),
                readiness.router().merge(faults.router()),
            ),
            None => (routes, readiness.router()),
        };
        #[cfg(not(feature = "test-hooks"))]
        let router = readiness.router();
        // The certificate files are read again while the service runs.
        let _watch = self.identity.clone().map(|identity| AbortOnDrop(tokio::spawn(identity.watch())));
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

/// Ends a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn listen(settings: &ListenSettings) -> Result<TcpListener, HostError> {
    crate::bind(settings).await.map_err(|source| HostError::Bind { address: settings.address(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(environment: Environment, hook: Option<TestHook>) -> Result<(), String> {
        let (database, listen, tls) =
            (DatabaseSettings::default(), ListenSettings::default(), TlsSettings::default());
        let (fault, kafka) = (FaultSettings::default(), KafkaSettings::default());
        HostSettings {
            environment,
            database: &database,
            grpc: &listen,
            http: &listen,
            tls: &tls,
            fault: &fault,
            kafka: &kafka,
            test_hooks: hook.into_iter().collect(),
            services_toml: "",
        }
        .check()
        .map_err(|e| e.to_string())
    }

    /// A hook this binary is built without is refused in development too, naming it and the
    /// feature; one that is built in is taken there (production refuses both).
    #[test]
    fn a_test_hook_not_built_in_is_refused_in_every_environment() {
        let hook = |built_in| TestHook { key: "saga.crash_point".into(), why: "a test hook", built_in };
        let refused = check(Environment::Development, Some(hook(false))).unwrap_err();
        assert!(refused.contains("saga.crash_point") && refused.contains("`test-hooks`"), "{refused}");
        assert_eq!(check(Environment::Development, Some(hook(true))), Ok(()));
        assert_eq!(check(Environment::Development, None), Ok(()));
        let production = check(Environment::Production, Some(hook(true))).unwrap_err();
        assert!(production.contains("APP_ENVIRONMENT"), "{production}");
    }
}
