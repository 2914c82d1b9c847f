//! {{Name}}'s errors and their one mapping to gRPC status codes.

use sagaworks_errors::status::db_status;
use tonic::{Code, Status};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Invalid(#[from] sagaworks_errors::InvalidField),
    #[error("product {0} does not exist")]
    UnknownProduct(Uuid),
    #[error("item {0} already exists")]
    DuplicateItem(Uuid),
    /// A downstream answered with something other than a business answer.
    #[error("{downstream}: {}", status.message())]
    Downstream { downstream: &'static str, status: Status },
    /// The saga could not be started.
    #[error(transparent)]
    Saga(#[from] sagaworks_saga::StartError),
    #[error(transparent)]
    Outbox(#[from] sagaworks_outbox::OutboxError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl Error {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::Invalid(sagaworks_errors::InvalidField::new(field, message))
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(e) => e.into(),
            Error::UnknownProduct(_) => Status::failed_precondition(e.to_string()),
            Error::DuplicateItem(_) => Status::already_exists(e.to_string()),
            // Transient trouble downstream (including the resilience stack's own
            // timeout, open circuit and full bulkhead) is retryable for our caller too.
            Error::Downstream { ref status, .. }
                if matches!(
                    status.code(),
                    Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted
                ) =>
            {
                Status::unavailable(e.to_string())
            }
            Error::Downstream { .. } => {
                tracing::error!(error = %e, "unexpected downstream answer");
                Status::internal("internal error")
            }
            Error::Outbox(sagaworks_outbox::OutboxError::Db(db))
            | Error::Saga(sagaworks_saga::StartError::Db(db))
            | Error::Db(db) => db_status(db),
            Error::Saga(_) => {
                tracing::error!(error = %e, "saga not started");
                Status::internal("internal error")
            }
            Error::Outbox(other) => {
                tracing::error!(error = %other, "outbox write failed");
                Status::internal("internal error")
            }
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
