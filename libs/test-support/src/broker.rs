//! Apache Kafka for tests, started through `scripts/kafka` (the one helper that
//! scripts/dev-up and scripts/chaos use too). Every broker a test gets has a SASL_SSL
//! listener, as dev-up's has: [`Broker::kafka_settings`] logs in as `admin`,
//! [`Broker::login`] as a service's own SCRAM user (services.toml's backends).
//!
//! * [`Broker::start`] — the test run's shared broker when `SW_TEST_KAFKA` names its
//!   directory (scripts/test starts a single node there and sets it); otherwise a
//!   private one. Tests on the shared broker are kept apart by their topic prefix
//!   ([`Broker::kafka_settings`]) and their consumer group names; it has no ACLs.
//! * [`Broker::private`] — a single node of the test's own, which it may stop,
//!   kill and restart: its log survives a restart, as a real broker's does.
//! * [`Broker::cluster`] — a cluster of its own (replication factor = nodes,
//!   `min.insync.replicas` 2), whose nodes the test may kill, stop (SIGSTOP) and
//!   restart one by one.
//! * [`Broker::secured`] — a single node of its own whose authorizer enforces the ACLs
//!   of services.toml for one topic prefix (the one [`Broker::kafka_settings`] gives),
//!   with the topics of services.toml and their `.dlq` created beforehand, as a
//!   deployment's init step does (no service may create one).
//!
//! The nodes' certificate (CN=kafka, a super user of the controller listener) comes from a
//! Kafka CA apart from the services' one: a private broker's from the test process's
//! ([`crate::certs::kafka_dir`]), the shared one's from the one scripts/test made for it
//! (`kafka-ca.pem`). The controller listener trusts that CA only
//! ([`Broker::controller_address`]). A private broker lives under
//! `<target dir>/kafka-test/<id>/` and is stopped and removed when the value is dropped;
//! scripts/test stops any left behind by a test process that died.

use sagaworks_config::KafkaSettings;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The environment variable naming the shared broker's directory (`scripts/kafka up
/// <dir> --secure ...`).
const SHARED_BROKER_ENV: &str = "SW_TEST_KAFKA";

pub struct Broker {
    bootstrap: String,
    /// The cluster's directory: `users/<user>.password` and `cluster.env`.
    dir: PathBuf,
    /// The Kafka CA file that issued the nodes' certificate.
    ca_file: String,
    /// The first node's controller listener port (node k's: this + k - 1).
    controller_port: u16,
    /// With ACLs: the topic prefix they name.
    acl_prefix: Option<String>,
    /// `None` for the shared broker, which no test may stop.
    own: Option<Own>,
}

struct Own {
    nodes: u8,
    /// `scripts/kafka up`'s arguments after the directory (a restart repeats them).
    args: Vec<String>,
}

impl Broker {
    /// The shared broker (`SW_TEST_KAFKA`), or a private single node when none is set.
    pub async fn start() -> Self {
        match std::env::var_os(SHARED_BROKER_ENV) {
            Some(dir) if !dir.is_empty() => Self::shared(PathBuf::from(dir)),
            _ => Self::private().await,
        }
    }

    fn shared(dir: PathBuf) -> Self {
        let env = std::fs::read_to_string(dir.join("cluster.env")).unwrap_or_else(|e| {
            panic!("{SHARED_BROKER_ENV}={}: no cluster.env there ({e}); scripts/test sets it", dir.display())
        });
        let value = |key: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(key).and_then(|l| l.strip_prefix('=')))
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(value("SECURE"), "1", "{SHARED_BROKER_ENV}: the shared broker must be a --secure one");
        let nodes: u16 = value("NODES").parse().expect("NODES in cluster.env");
        let port: u16 = value("PORT").parse().expect("PORT in cluster.env");
        let bootstrap = (0..nodes).map(|k| format!("127.0.0.1:{}", port + k)).collect::<Vec<_>>().join(",");
        let ca_file = Path::new(&value("CERTS")).join("kafka-ca.pem").display().to_string();
        Self { bootstrap, dir, ca_file, controller_port: port + nodes, acl_prefix: None, own: None }
    }

    /// A single Kafka node of this test's own.
    pub async fn private() -> Self {
        Self::cluster(1).await
    }

    /// A cluster of `nodes` (1 to 9) of this test's own.
    pub async fn cluster(nodes: u8) -> Self {
        assert!((1..=9).contains(&nodes), "a cluster has 1 to 9 nodes");
        Self::start_own(nodes, None).await
    }

    /// A single node of this test's own whose authorizer denies what the ACLs of
    /// services.toml, for topics `<prefix>.<aggregate>`, do not allow. The prefix is its
    /// own; [`Broker::kafka_settings`] uses it.
    pub async fn secured() -> Self {
        Self::start_own(1, Some(format!("s{}", &uuid::Uuid::new_v4().simple().to_string()[..8]))).await
    }

    async fn start_own(nodes: u8, acl_prefix: Option<String>) -> Self {
        let dir = target_dir().join("kafka-test").join(uuid::Uuid::new_v4().simple().to_string());
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let port = crate::free_ports(2 * u16::from(nodes));
        let certs_dir = crate::certs::kafka_dir();
        let mut args = vec![
            "--nodes".to_string(),
            nodes.to_string(),
            "--port".into(),
            port.to_string(),
            "--secure".into(),
            certs_dir.display().to_string(),
        ];
        if let Some(prefix) = &acl_prefix {
            args.extend(["--topic-prefix".to_string(), prefix.clone()]);
        }
        let mut b = Self {
            bootstrap: String::new(),
            dir,
            ca_file: certs_dir.join("kafka-ca.pem").display().to_string(),
            controller_port: port + u16::from(nodes),
            acl_prefix,
            own: Some(Own { nodes, args: args.clone() }),
        };
        b.bootstrap = b.kafka_script("up", &args).await;
        b
    }

    /// Settings for a client of this broker logged in as `admin` (who may do anything),
    /// with a topic prefix of its own (on a [`Broker::secured`] one, the prefix its ACLs
    /// name).
    pub fn kafka_settings(&self) -> KafkaSettings {
        let prefix = self
            .acl_prefix
            .clone()
            .unwrap_or_else(|| format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..8]));
        self.login(
            &KafkaSettings {
                brokers: self.address(),
                topic_prefix: prefix,
                security_protocol: sagaworks_config::KafkaSecurity::SaslSsl,
                ssl_ca_file: self.ca_file.clone(),
                ..Default::default()
            },
            "admin",
        )
    }

    /// `settings` logged in as `user` instead: a backend of services.toml (its own SCRAM
    /// user) or `admin`.
    pub fn login(&self, settings: &KafkaSettings, user: &str) -> KafkaSettings {
        let file = self.dir.join("users").join(format!("{user}.password"));
        let password = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("no Kafka user {user} ({}: {e})", file.display()));
        KafkaSettings {
            sasl_username: user.into(),
            sasl_password: password.trim().into(),
            ..settings.clone()
        }
    }

    /// [`Broker::kafka_settings`] logged in as `user`.
    pub fn kafka_settings_as(&self, user: &str) -> KafkaSettings {
        self.login(&self.kafka_settings(), user)
    }

    /// The bootstrap servers (`host:port`, comma-separated for a cluster).
    pub fn address(&self) -> String {
        self.bootstrap.clone()
    }

    /// Node `k`'s (1-based) controller listener, `host:port`: SSL with client certificates
    /// of the Kafka CA ([`Broker::kafka_ca_file`]) required.
    pub fn controller_address(&self, k: u8) -> String {
        assert!(k >= 1 && self.bootstrap.split(',').count() >= usize::from(k), "no node {k}");
        format!("127.0.0.1:{}", self.controller_port + u16::from(k) - 1)
    }

    /// The Kafka CA's certificate file: what issued the nodes' certificate, what Kafka's
    /// clients verify the broker with and what the controller listener trusts.
    pub fn kafka_ca_file(&self) -> &str {
        &self.ca_file
    }

    /// How many nodes it has.
    pub fn nodes(&self) -> u8 {
        self.own().nodes
    }

    /// Stops every node (SIGTERM, as an operator would; the logs stay).
    pub fn stop(&mut self) {
        self.own();
        run_script(&["down", &self.dir.to_string_lossy()]);
    }

    /// Starts every stopped or killed node again, on its ports and its log, and
    /// waits until each runs.
    pub async fn restart(&mut self) {
        // `up` on an existing cluster checks its shape against these and starts what is down.
        let args = self.own().args.clone();
        self.bootstrap = self.kafka_script("up", &args).await;
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`) to node `k` (1-based).
    pub fn signal(&self, k: u8, signal: &str) {
        let own = self.own();
        assert!((1..=own.nodes).contains(&k), "no node {k}");
        run_script(&["signal", &self.dir.to_string_lossy(), &k.to_string(), signal]);
    }

    /// Node `k`'s client address.
    pub fn node_address(&self, k: u8) -> String {
        self.bootstrap.split(',').nth(usize::from(k) - 1).unwrap_or_else(|| panic!("no node {k}")).to_string()
    }

    fn own(&self) -> &Own {
        self.own.as_ref().expect(
            "the shared test broker cannot be stopped or signalled: use Broker::private() or Broker::cluster(n)",
        )
    }

    async fn kafka_script(&self, cmd: &str, args: &[String]) -> String {
        let out = tokio::process::Command::new(script())
            .arg(cmd)
            .arg(&self.dir)
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .await
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
        assert!(
            out.status.success(),
            "scripts/kafka {cmd} {} failed (its output is above)",
            self.dir.display()
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout.lines().last().unwrap_or_default().trim().to_string()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if self.own.is_some() {
            run_script(&["down", &self.dir.to_string_lossy()]);
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kafka")
}

fn run_script(args: &[&str]) {
    let status = Command::new(script())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
    assert!(status.success(), "scripts/kafka {} failed", args.join(" "));
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}
