//! gRPC status conventions between sagaworks services.
//!
//! | code | meaning | retried by the resilience stack |
//! |---|---|---|
//! | `INVALID_ARGUMENT` | the request itself is wrong; names the field | no |
//! | `NOT_FOUND` | an id does not exist | no |
//! | `FAILED_PRECONDITION` | a business rule refused it (stock, balance) | no |
//! | `ABORTED` | refused because it was compensated already | no |
//! | `ALREADY_EXISTS` | a unique key is taken | no |
//! | `UNAVAILABLE` | try again later (DB down, overloaded) | yes |
//! | `DEADLINE_EXCEEDED` | no answer in time | yes |
//! | `INTERNAL` | a bug; details are logged, not sent | no |

use tonic::{Code, Status};

/// Metadata key naming the invalid field of an `INVALID_ARGUMENT` status.
const FIELD_METADATA: &str = "x-field";

/// `INVALID_ARGUMENT` naming the offending field (also in metadata `x-field`).
pub fn invalid_argument(field: &str, message: impl std::fmt::Display) -> Status {
    let mut s = Status::invalid_argument(format!("{field}: {message}"));
    if let Ok(v) = field.parse() {
        s.metadata_mut().insert(FIELD_METADATA, v);
    }
    s
}

/// The field an `INVALID_ARGUMENT` status names, if any.
pub fn invalid_field(status: &Status) -> Option<&str> {
    status.metadata().get(FIELD_METADATA).and_then(|v| v.to_str().ok())
}

/// Maps a database error to a status without leaking SQL: connection
/// problems are `UNAVAILABLE` (retryable), everything else `INTERNAL`.
pub fn db_status(err: sqlx::Error) -> Status {
    match &err {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_) => {
            tracing::warn!(error = %err, "database unavailable");
            Status::unavailable("database unavailable")
        }
        sqlx::Error::RowNotFound => Status::not_found("not found"),
        _ => {
            tracing::error!(error = %err, "database error");
            Status::internal("internal error")
        }
    }
}

/// True for the codes a caller may retry with the same idempotency key.
pub fn is_retryable(code: Code) -> bool {
    matches!(code, Code::Unavailable | Code::DeadlineExceeded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_argument_carries_the_field() {
        let s = invalid_argument("items[1].quantity", "must be positive");
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(invalid_field(&s), Some("items[1].quantity"));
    }

    #[test]
    fn pool_timeouts_are_retryable_but_sql_errors_are_not() {
        assert!(is_retryable(db_status(sqlx::Error::PoolTimedOut).code()));
        assert!(!is_retryable(db_status(sqlx::Error::Protocol("x".into())).code()));
    }
}
