//! The one error type of the tools.

/// What can go wrong running a tool; every variant names its cause.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// Bad input the command line pointed at (a fixture without products or
    /// customers, a malformed kills line, an order id that is not a UUID);
    /// clap rejects bad flags before a command runs.
    #[error("{0}")]
    Usage(String),
    #[error("HTTP: {0}")]
    Http(#[from] reqwest::Error),
    /// The load target answered an order with a body that is not an order.
    #[error("{0}")]
    Answer(String),
    /// The gateway answered a setup call with an error.
    #[error("{what}: HTTP {status}: {body}")]
    Api { what: String, status: u16, body: String },
    #[error("token: {0}")]
    Token(#[from] jsonwebtoken::errors::Error),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("Kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Json { path: String, source: serde_json::Error },
    /// A task of the tool (a load worker, the topic reader) panicked.
    #[error("task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A wait (sagas settling, outbox draining, topic reading) ran out of time.
    #[error("timed out: {0}")]
    Timeout(String),
}

impl ToolError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        Self::Io { path: path.display().to_string(), source }
    }
}
