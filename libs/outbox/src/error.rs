//! The crate's one error type.

/// Everything the outbox writer, relay and consumer can fail with.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("event {event_type} payload is {size} bytes, over the {max} byte limit")]
    PayloadTooLarge { event_type: String, size: usize, max: usize },
    #[error("event payload does not serialize: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("outbox database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("kafka client error: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("cannot create topic {topic}: {reason}")]
    CreateTopic { topic: String, reason: String },
    #[error(
        "consumer.sources names no publisher for topic {topic}: add `{topic} = \"/sagaworks/<service>\"`"
    )]
    NoSource { topic: String },
    #[error("consumer.types names no event types for topic {topic}")]
    NoTypes { topic: String },
}

/// How services answer an outbox failure over gRPC: database trouble as
/// `sagaworks_errors::db_status` does, anything else as INTERNAL (logged).
impl From<OutboxError> for tonic::Status {
    fn from(e: OutboxError) -> Self {
        match e {
            OutboxError::Db(db) => sagaworks_errors::db_status(db),
            other => {
                tracing::error!(error = %other, "outbox write failed");
                tonic::Status::internal("internal error")
            }
        }
    }
}
