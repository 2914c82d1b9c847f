//! Inventory's errors and their one mapping to gRPC status codes.

use sagaworks_errors::status::db_status;
use tonic::Status;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Invalid(#[from] sagaworks_errors::InvalidField),
    #[error("product {0} not found")]
    ProductNotFound(Uuid),
    #[error("reservation {0} not found")]
    ReservationNotFound(Uuid),
    #[error("sku {0} already exists")]
    DuplicateSku(String),
    #[error("insufficient stock for product {product_id}: requested {requested}, available {available}")]
    InsufficientStock { product_id: Uuid, requested: i64, available: i64 },
    #[error("reservation {0} was already released")]
    AlreadyReleased(Uuid),
    #[error("reservation {0} is committed and cannot be released")]
    AlreadyCommitted(Uuid),
    #[error("reservation {reservation_id} does not belong to order {order_id}")]
    OtherOrder { reservation_id: Uuid, order_id: Uuid },
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
            Error::ProductNotFound(_) | Error::ReservationNotFound(_) => Status::not_found(e.to_string()),
            Error::DuplicateSku(_) => Status::already_exists(e.to_string()),
            Error::InsufficientStock { .. } | Error::AlreadyCommitted(_) | Error::OtherOrder { .. } => {
                Status::failed_precondition(e.to_string())
            }
            Error::AlreadyReleased(_) => Status::aborted(e.to_string()),
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

pub type Result<T> = std::result::Result<T, Error>;
