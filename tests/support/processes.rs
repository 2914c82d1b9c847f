//! The whole system as real processes: the four service binaries, each with
//! its own database and configuration file, against one broker.
//!
//! In-process services share one global `tracing` subscriber, so they cannot
//! export spans under their own `service.name`; a process each can. The
//! binaries are built next to the test before the first one starts
//! ([`binary`]), so a test never runs a stale one.
//!
//! ```ignore
//! let receiver = OtlpReceiver::start().await;
//! let system = ProcessStack::start(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint())]).await;
//! // ... call system.url("/v1/orders") ...
//! system.stop().await; // SIGTERM: every service flushes its spans
//! ```

use crate::auth::{TEST_JWT_SECRET, admin_token};
use crate::services::workspace_root;
use sagaworks_config::KafkaSettings;
use sagaworks_test_support::{Broker, TestDatabase, eventually, free_port};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a service may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a service may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// `target/<profile>/<name>`, next to the test binary's `deps` directory,
/// built first: a test never runs a service binary older than its sources
/// (nothing else builds the binaries when only the tests are run).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps/<test>");
    build_services(dir);
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing after building the services", path.display());
    path
}

/// The build of the stack the scripts run (`sw_build_stack` in
/// `scripts/lib/services.sh`: every service of `services.toml` with its
/// feature `test-hooks`, the operator CLI and sagaworks-tools, in one cargo
/// invocation) into the test's own target directory and profile, once per
/// test process; a no-op (about a second) when they are up to date. The
/// same invocation as dev-up's and scripts/test's, so one feature resolution
/// and one build serve them all.
fn build_services(dir: &Path) {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let profile = match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(other) => other,
            None => panic!("no profile directory in {}", dir.display()),
        };
        let target_dir = dir.parent().expect("target/<profile>");
        let status = Command::new("bash")
            .current_dir(workspace_root())
            .env("CARGO_TARGET_DIR", target_dir)
            .args(["-c", r#". scripts/lib/services.sh && sw_build_stack "$0" --quiet"#, profile])
            .status()
            .expect("bash runs");
        assert!(status.success(), "building the service binaries failed ({status})");
    });
}

/// One service binary running as a child process; killed (SIGKILL) on drop
/// unless it was stopped.
pub struct ServiceProcess {
    pub name: &'static str,
    pub http_port: u16,
    pub grpc_port: u16,
    child: Option<Child>,
    /// Holds the configuration file; removed on drop.
    config_dir: PathBuf,
}

impl ServiceProcess {
    /// Starts `name` with a TOML configuration file (`APP_CONFIG_FILE`) and
    /// extra environment variables (`APP_ENVIRONMENT=development` unless they set
    /// it); nothing else of the test's environment but `PATH` is passed on.
    pub fn spawn(
        name: &'static str,
        http_port: u16,
        grpc_port: u16,
        config: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let dir = std::env::temp_dir().join(format!("sw-{name}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a temporary config directory");
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(&file, config).expect("write the config file");
        let mut command = Command::new(binary(name));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("APP_CONFIG_FILE", &file)
            .env("APP_ENVIRONMENT", "development")
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()));
        // Every service under test speaks mutual TLS, with a certificate of the test CA.
        let tls = sagaworks_test_support::certs::tls(name);
        command
            .env("APP_TLS__CA_FILE", &tls.ca_file)
            .env("APP_TLS__CERT_FILE", &tls.cert_file)
            .env("APP_TLS__KEY_FILE", &tls.key_file);
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Self { name, http_port, grpc_port, child: Some(child), config_dir: dir }
    }

    pub fn grpc_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.grpc_port)
    }

    /// Waits until `/health/ready` answers 200; panics if the process exits first.
    pub async fn wait_ready(&mut self, http: &reqwest::Client) {
        let url = format!("http://127.0.0.1:{}/health/ready", self.http_port);
        let name = self.name;
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(exit)) = child.try_wait()
            {
                panic!("{name} exited before it was ready: {exit}");
            }
            if let Ok(res) = http.get(&url).send().await
                && res.status() == reqwest::StatusCode::OK
            {
                return;
            }
            assert!(started.elapsed() < READY_TIMEOUT, "{name} not ready within {READY_TIMEOUT:?} ({url})");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends SIGTERM and waits for a clean exit (a service flushes its spans
    /// on the way out); panics if it does not exit 0 in time.
    pub async fn terminate(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let name = self.name;
        let sent = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        assert!(sent.is_ok_and(|s| s.success()), "cannot send SIGTERM to {name}");
        let started = Instant::now();
        let exit = loop {
            if let Some(exit) = child.try_wait().expect("wait for the child") {
                break exit;
            }
            if started.elapsed() > STOP_TIMEOUT {
                let _ = child.kill();
                panic!("{name} did not exit within {STOP_TIMEOUT:?} of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(exit.success(), "{name} exits 0 after SIGTERM, got {exit}");
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.config_dir);
    }
}

/// Broker, databases and the four services as processes.
///
/// Fields drop in order: the services are killed before the broker and their
/// databases go.
pub struct ProcessStack {
    pub gateway: ServiceProcess,
    pub order: ServiceProcess,
    pub payment: ServiceProcess,
    pub inventory: ServiceProcess,
    pub broker: Broker,
    pub databases: Vec<TestDatabase>,
    /// Sends an admin token unless a request sets its own `Authorization`.
    pub http: reqwest::Client,
    /// What another order replica needs: its database, the broker, the participants.
    order_db_url: String,
    order_kafka: KafkaSettings,
    /// The stack's topic prefix, logged in as `admin` (the test's own clients).
    pub kafka: KafkaSettings,
    clients: String,
}

/// A backend service's configuration file.
fn backend_config(db_url: &str, kafka: &KafkaSettings, grpc: u16, http: u16, extra: &str) -> String {
    let kafka_login = format!(
        "security_protocol = \"sasl_ssl\"\nsasl_username = \"{}\"\nsasl_password = \"{}\"\nssl_ca_file = \"{}\"\n",
        kafka.sasl_username, kafka.sasl_password, kafka.ssl_ca_file
    );
    format!(
        "[grpc]\nhost = \"127.0.0.1\"\nport = {grpc}\n[http]\nhost = \"127.0.0.1\"\nport = {http}\n\
         [database]\nurl = \"{db_url}\"\n[kafka]\nbrokers = \"{}\"\ntopic_prefix = \"{}\"\n{kafka_login}{extra}",
        kafka.brokers, kafka.topic_prefix
    )
}

impl ProcessStack {
    /// Starts everything and waits until every service is ready. `env` goes
    /// to every service (e.g. `OTEL_*`). The gateway verifies HS256 tokens
    /// signed with [`TEST_JWT_SECRET`] (see [`crate::auth`]).
    pub async fn start(env: &[(&str, &str)]) -> Self {
        let (order_db, inventory_db, payment_db) = tokio::join!(
            TestDatabase::create("proc_order"),
            TestDatabase::create("proc_inventory"),
            TestDatabase::create("proc_payment")
        );
        let broker = Broker::start().await;
        let kafka = broker.kafka_settings();
        // Each service logs in to Kafka as its own user.
        let backend = |name: &str, db: &TestDatabase, grpc: u16, http: u16, extra: &str| {
            backend_config(&db.url, &broker.login(&kafka, name), grpc, http, extra)
        };
        let ports = || (free_port(), free_port());
        let (grpc, http) = ports();
        let inventory = ServiceProcess::spawn(
            "inventory",
            http,
            grpc,
            &backend("inventory", &inventory_db, grpc, http, ""),
            env,
        );
        let (grpc, http) = ports();
        let payment = ServiceProcess::spawn(
            "payment",
            http,
            grpc,
            &backend("payment", &payment_db, grpc, http, ""),
            env,
        );
        let (grpc, http) = ports();
        let clients = format!(
            "[inventory]\nurl = \"{}\"\n[payment]\nurl = \"{}\"\n",
            inventory.grpc_url(),
            payment.grpc_url()
        );
        let order = ServiceProcess::spawn(
            "order",
            http,
            grpc,
            &backend("order", &order_db, grpc, http, &clients),
            env,
        );
        let http = free_port();
        let gateway_config = format!(
            "[http]\nhost = \"127.0.0.1\"\nport = {http}\n[order]\nurl = \"{}\"\n[order.routes]\nCreateOrder = 15000\n\
             {clients}[auth]\njwt_secret = \"{TEST_JWT_SECRET}\"\n",
            order.grpc_url()
        );
        let gateway = ServiceProcess::spawn("gateway", http, 0, &gateway_config, env);

        let mut headers = reqwest::header::HeaderMap::new();
        let bearer = format!("Bearer {}", admin_token());
        headers.insert(reqwest::header::AUTHORIZATION, bearer.parse().expect("header value"));
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .default_headers(headers)
            .build()
            .expect("an HTTP client");
        let order_db_url = order_db.url.clone();
        let order_kafka = broker.login(&kafka, "order");
        let mut stack = Self {
            order_db_url,
            order_kafka,
            kafka,
            clients,
            broker,
            databases: vec![order_db, inventory_db, payment_db],
            inventory,
            payment,
            order,
            gateway,
            http: client,
        };
        for service in [&mut stack.inventory, &mut stack.payment, &mut stack.order, &mut stack.gateway] {
            service.wait_ready(&stack.http).await;
        }
        stack
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.gateway.http_port)
    }

    /// Starts another order replica (its own ports; the stack's database,
    /// broker and participants) with `env`, and waits until it is ready.
    pub async fn start_order_replica(&self, env: &[(&str, &str)]) -> ServiceProcess {
        let (grpc, http) = (free_port(), free_port());
        let config = backend_config(&self.order_db_url, &self.order_kafka, grpc, http, &self.clients);
        let mut replica = ServiceProcess::spawn("order", http, grpc, &config, env);
        replica.wait_ready(&self.http).await;
        replica
    }

    /// SIGTERM to every service, gateway first, each waited for (so every
    /// span a service recorded has been exported when this returns). A
    /// broker of the stack's own stops when it is dropped, after them (a
    /// consumer whose broker is gone hangs in librdkafka's close).
    pub async fn stop(mut self) {
        for service in [&mut self.gateway, &mut self.order, &mut self.payment, &mut self.inventory] {
            service.terminate().await;
        }
    }

    /// Polls `GET path` until `done` holds for the JSON body; returns it.
    pub async fn get_until(
        &self,
        path: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let url = self.url(path);
        eventually(&format!("GET {path} to settle"), Duration::from_secs(40), || async {
            let body: serde_json::Value = self.http.get(&url).send().await.ok()?.json().await.ok()?;
            done(&body).then_some(body)
        })
        .await
    }
}
