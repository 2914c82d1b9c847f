//! Apache Kafka for tests, started through `scripts/kafka` (the one helper that
//! scripts/dev-up and scripts/chaos use too).
//!
//! * [`Broker::start`] — the test run's shared broker when `SW_TEST_KAFKA` names
//!   one (scripts/test starts a single node and sets it); otherwise a private
//!   one. Tests on the shared broker are kept apart by their topic prefix
//!   ([`Broker::kafka_settings`]) and their consumer group names.
//! * [`Broker::private`] — a single node of the test's own, which it may stop,
//!   kill and restart: its log survives a restart, as a real broker's does.
//! * [`Broker::cluster`] — a cluster of its own (replication factor = nodes,
//!   `min.insync.replicas` 2), whose nodes the test may kill, stop (SIGSTOP) and
//!   restart one by one.
//! * [`Broker::secured`] — a single node of its own in `scripts/kafka`'s secure mode:
//!   SASL_SSL (the broker's certificate from [`crate::certs`]), a SCRAM user per
//!   service and the ACLs of services.toml for one topic prefix;
//!   [`Broker::kafka_settings_as`] connects as one of those users.
//!
//! A private broker lives under `<target dir>/kafka-test/<id>/` and is stopped
//! and removed when the value is dropped; scripts/test stops any left behind by
//! a test process that died.

use sagaworks_config::KafkaSettings;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The environment variable naming the shared broker's bootstrap servers.
pub const SHARED_BROKER_ENV: &str = "SW_TEST_KAFKA";

pub struct Broker {
    bootstrap: String,
    /// `None` for the shared broker, which no test may stop.
    own: Option<Own>,
}

struct Own {
    dir: PathBuf,
    nodes: u8,
    /// Secure mode: the topic prefix its ACLs name.
    secure_prefix: Option<String>,
}

impl Broker {
    /// The shared broker (`SW_TEST_KAFKA`), or a private single node when none is set.
    pub async fn start() -> Self {
        match std::env::var(SHARED_BROKER_ENV) {
            Ok(bootstrap) if !bootstrap.trim().is_empty() => Self { bootstrap, own: None },
            _ => Self::private().await,
        }
    }

    /// A single Kafka node of this test's own.
    pub async fn private() -> Self {
        Self::cluster(1).await
    }

    /// A cluster of `nodes` (1 to 9) of this test's own.
    pub async fn cluster(nodes: u8) -> Self {
        assert!((1..=9).contains(&nodes), "a cluster has 1 to 9 nodes");
        let dir = target_dir().join("kafka-test").join(uuid::Uuid::new_v4().simple().to_string());
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let port = free_ports(2 * u16::from(nodes));
        let args = ["--nodes".to_string(), nodes.to_string(), "--port".into(), port.to_string()];
        let mut b = Self { bootstrap: String::new(), own: Some(Own { dir, nodes, secure_prefix: None }) };
        b.bootstrap = b.kafka_script("up", &args).await;
        b
    }

    /// A single node of this test's own with a SASL_SSL listener, a SCRAM user per backend
    /// of services.toml and their ACLs for topics `<prefix>.<aggregate>` (a prefix of its own).
    pub async fn secured() -> Self {
        let dir = target_dir().join("kafka-test").join(uuid::Uuid::new_v4().simple().to_string());
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let port = free_ports(2);
        let certs = crate::certs::tls("kafka");
        let certs_dir = Path::new(&certs.ca_file).parent().expect("the certificates' directory").to_owned();
        let prefix = format!("s{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let args = [
            "--port".to_string(),
            port.to_string(),
            "--secure".into(),
            certs_dir.display().to_string(),
            "--topic-prefix".into(),
            prefix.clone(),
        ];
        let mut b =
            Self { bootstrap: String::new(), own: Some(Own { dir, nodes: 1, secure_prefix: Some(prefix) }) };
        b.bootstrap = b.kafka_script("up", &args).await;
        b
    }

    /// Settings for `user` (a backend's name, or `admin`) of a [`Broker::secured`] broker,
    /// with the topic prefix its ACLs name.
    pub fn kafka_settings_as(&self, user: &str) -> KafkaSettings {
        let own = self.own();
        let prefix = own.secure_prefix.clone().expect("Broker::secured() only");
        let password = std::fs::read_to_string(own.dir.join("users").join(format!("{user}.password")))
            .unwrap_or_else(|e| panic!("no Kafka user {user}: {e}"));
        KafkaSettings {
            brokers: self.address(),
            topic_prefix: prefix,
            security_protocol: "sasl_ssl".into(),
            sasl_username: user.into(),
            sasl_password: password.trim().into(),
            ssl_ca_file: crate::certs::ca_file(),
            ..Default::default()
        }
    }

    /// The bootstrap servers (`host:port`, comma-separated for a cluster).
    pub fn address(&self) -> String {
        self.bootstrap.clone()
    }

    /// Settings for a client of this broker, with a unique topic prefix.
    pub fn kafka_settings(&self) -> KafkaSettings {
        KafkaSettings {
            brokers: self.address(),
            topic_prefix: format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
            ..Default::default()
        }
    }

    /// How many nodes it has.
    pub fn nodes(&self) -> u8 {
        self.own().nodes
    }

    /// Stops every node (SIGTERM, as an operator would; the logs stay).
    pub fn stop(&mut self) {
        let own = self.own();
        run_script(&["down", &own.dir.to_string_lossy()]);
    }

    /// Starts every stopped or killed node again, on its ports and its log, and
    /// waits until each runs.
    pub async fn restart(&mut self) {
        let nodes = self.own().nodes.to_string();
        // `up` on an existing cluster checks its shape against these and starts what is down.
        let port = self.bootstrap.split(',').next().and_then(|a| a.rsplit(':').next()).unwrap().to_string();
        self.bootstrap = self.kafka_script("up", &["--nodes".into(), nodes, "--port".into(), port]).await;
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`) to node `k` (1-based).
    pub fn signal(&self, k: u8, signal: &str) {
        let own = self.own();
        assert!((1..=own.nodes).contains(&k), "no node {k}");
        run_script(&["signal", &own.dir.to_string_lossy(), &k.to_string(), signal]);
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
        let own = self.own();
        let out = tokio::process::Command::new(script())
            .arg(cmd)
            .arg(&own.dir)
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .await
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
        assert!(
            out.status.success(),
            "scripts/kafka {cmd} {} failed (its output is above)",
            own.dir.display()
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout.lines().last().unwrap_or_default().trim().to_string()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(own) = &self.own {
            run_script(&["down", &own.dir.to_string_lossy()]);
            let _ = std::fs::remove_dir_all(&own.dir);
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

/// The first of `n` consecutive ports that were all free a moment ago, below
/// Linux's ephemeral range (32768-60999): a port from that range, free while
/// a node is down, may become some client connection's local port meanwhile,
/// and the node could not restart on it.
fn free_ports(n: u16) -> u16 {
    const LOW: u16 = 20_000;
    const HIGH: u16 = 32_000;
    for _ in 0..200 {
        let span = u128::from(HIGH - LOW - n);
        let base = LOW + (uuid::Uuid::new_v4().as_u128() % span) as u16;
        if (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no {n} consecutive free ports found on 127.0.0.1 between {LOW} and {HIGH}");
}
