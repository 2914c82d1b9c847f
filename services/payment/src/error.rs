//! Payment's errors and their one mapping to gRPC status codes.

use sagaworks_errors::status::db_status;
use tonic::Status;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Invalid(#[from] sagaworks_errors::InvalidField),
    #[error("customer {0} not found")]
    CustomerNotFound(Uuid),
    #[error("customer {0} already exists")]
    DuplicateCustomer(Uuid),
    #[error("insufficient funds for customer {customer_id}: balance {balance_cents}, charge {amount_cents}")]
    InsufficientFunds { customer_id: Uuid, balance_cents: i64, amount_cents: i64 },
    #[error("payment {0} was already refunded")]
    AlreadyRefunded(Uuid),
    #[error("payment {0} belongs to another order or customer")]
    Mismatch(Uuid),
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
            Error::CustomerNotFound(_) => Status::not_found(e.to_string()),
            Error::DuplicateCustomer(_) => Status::already_exists(e.to_string()),
            Error::InsufficientFunds { .. } | Error::Mismatch(_) => {
                Status::failed_precondition(e.to_string())
            }
            Error::AlreadyRefunded(_) => Status::aborted(e.to_string()),
            Error::Outbox(e) => e.into(),
            Error::Db(db) => db_status(db),
        }
    }
}

impl sagaworks_runtime::idempotency::Outcome for Error {
    /// Business rejections are recorded and replayed; database trouble is not.
    fn is_final(&self) -> bool {
        !matches!(self, Error::Db(_) | Error::Outbox(_))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
