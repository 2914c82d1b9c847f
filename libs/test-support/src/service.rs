//! A service under test on a Tokio runtime of its own, as in a process of its
//! own: [`Running::kill`] ends everything it started (its tasks, connections
//! and pool) at once, as `kill -9` ends a process, and the service can be
//! started again on the same database and port. [`Running::stop`] is the
//! graceful shutdown. Each runtime has a metrics recorder of its own
//! ([`sagaworks_runtime::metrics::isolate`]): a service's `/metrics` shows what
//! it recorded, not what the other services in the test process did.
//!
//! A test harness implements [`App`] for each service's application type
//! (a newtype of its own where the orphan rule requires it) and starts it with
//! [`Running::start`].

use std::future::Future;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What [`Running`] needs of a service's application (its `startup::Application`).
pub trait App: Sized + Send + 'static {
    type Settings: Clone + Send + 'static;
    type Error: std::fmt::Debug + Send + 'static;
    /// Connects, migrates and binds its ports.
    fn build(settings: Self::Settings) -> impl Future<Output = Result<Self, Self::Error>> + Send + 'static;
    /// gRPC and HTTP ports (a service without gRPC: 0).
    fn ports(&self) -> (u16, u16);
    /// Serves until `stop` is cancelled.
    fn run(self, stop: CancellationToken) -> impl Future<Output = ()> + Send + 'static;
}

/// A service running on a Tokio runtime of its own.
pub struct Running {
    token: CancellationToken,
    task: Option<JoinHandle<()>>,
    runtime: Option<tokio::runtime::Runtime>,
    pub grpc_port: u16,
    pub http_port: u16,
}

impl Running {
    /// Builds (connects, migrates, binds) and runs `A` on a runtime of its own.
    pub async fn start<A: App>(settings: A::Settings) -> Result<Self, A::Error> {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        sagaworks_runtime::metrics::isolate(&mut builder);
        let runtime = builder
            .worker_threads(2)
            .thread_name("service")
            .enable_all()
            .build()
            .expect("a runtime for the service");
        let app = match runtime.spawn(A::build(settings)).await.expect("start-up does not panic") {
            Ok(app) => app,
            Err(e) => {
                runtime.shutdown_background();
                return Err(e);
            }
        };
        let (grpc_port, http_port) = app.ports();
        let token = CancellationToken::new();
        let task = runtime.spawn(app.run(token.clone()));
        Ok(Self { token, task: Some(task), runtime: Some(runtime), grpc_port, http_port })
    }

    /// Like [`Running::start`], retrying while the port of a service that was
    /// just killed is still taken.
    pub async fn start_on_same_port<A: App>(what: &str, settings: A::Settings) -> Self {
        let mut last = None;
        for _ in 0..50 {
            match Self::start::<A>(settings.clone()).await {
                Ok(running) => return running,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what} did not start again on its port: {last:?}");
    }

    /// Stops dead, like `kill -9`: the service's runtime goes, and with it
    /// every task it spawned (saga drivers, connections, its pool): no
    /// draining, leases stay held, open transactions roll back.
    pub fn kill(&mut self) {
        self.task.take();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Graceful shutdown: cancels the service's token and waits (up to 10 s)
    /// for it to finish, then ends its runtime.
    pub async fn stop(&mut self) {
        self.token.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        self.kill();
    }

    /// The gRPC URL of a service started with TLS ([`crate::certs::tls`]), as every
    /// service under test is.
    pub fn grpc_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.grpc_port)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}
