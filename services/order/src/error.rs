//! Order's errors and their one mapping to gRPC status codes.

use sagaworks_errors::status::db_status;
use tonic::Status;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Invalid(#[from] sagaworks_errors::InvalidField),
    #[error("order {0} not found")]
    OrderNotFound(Uuid),
    #[error("saga {0} not found")]
    SagaNotFound(Uuid),
    #[error("idempotency key was already used for a different order request")]
    KeyReused,
    /// The saga's input could not be stored.
    #[error("saga: {0}")]
    Saga(String),
    /// An operator's action on a saga was refused.
    #[error(transparent)]
    Action(#[from] sagaworks_saga::admin::ActionError),
    /// An operator's call on a dead-letter topic failed.
    #[error(transparent)]
    DeadLetter(#[from] sagaworks_outbox::DeadLetterError),
    #[error(transparent)]
    Outbox(#[from] sagaworks_outbox::OutboxError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(e) => e.into(),
            Error::OrderNotFound(_) | Error::SagaNotFound(_) => Status::not_found(e.to_string()),
            Error::KeyReused => sagaworks_errors::status::invalid_argument("idempotency_key", e.to_string()),
            Error::Outbox(e) => e.into(),
            Error::Saga(e) => Status::internal(e),
            Error::Action(e) => {
                use sagaworks_saga::admin::ActionError;
                match e {
                    ActionError::NotFound(_) => Status::not_found(e.to_string()),
                    ActionError::Conflict(_) | ActionError::Busy { .. } => {
                        Status::failed_precondition(e.to_string())
                    }
                    ActionError::Invalid(_) => {
                        sagaworks_errors::status::invalid_argument("output", e.to_string())
                    }
                    ActionError::Db(db) => db_status(db),
                    ActionError::Host(_) => Status::internal(e.to_string()),
                }
            }
            Error::DeadLetter(e) => {
                use sagaworks_outbox::DeadLetterError;
                match e {
                    DeadLetterError::UnknownTopic(_) | DeadLetterError::NotFound(_) => {
                        Status::not_found(e.to_string())
                    }
                    DeadLetterError::NotPending { .. } | DeadLetterError::Refused(_) => {
                        Status::failed_precondition(e.to_string())
                    }
                    DeadLetterError::KeyReused => {
                        sagaworks_errors::status::invalid_argument("idempotency_key", e.to_string())
                    }
                    DeadLetterError::Invalid(_) => {
                        sagaworks_errors::status::invalid_argument("body", e.to_string())
                    }
                    DeadLetterError::Kafka(_) => {
                        tracing::warn!(error = %e, "dead-letter operation: broker unavailable");
                        Status::unavailable("the broker is unavailable")
                    }
                    DeadLetterError::Db(db) => db_status(db),
                }
            }
            Error::Db(db) => db_status(db),
        }
    }
}

impl From<sagaworks_saga::StartError> for Error {
    fn from(e: sagaworks_saga::StartError) -> Self {
        match e {
            sagaworks_saga::StartError::Db(db) => Error::Db(db),
            input @ sagaworks_saga::StartError::Input { .. } => Error::Saga(input.to_string()),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
