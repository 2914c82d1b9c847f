//! Idempotency keys for mutating gRPC calls.
//!
//! Every mutating call between services carries a key (the saga uses
//! `<saga_id>:<step>`). [`run_once`] makes the call's effect happen at most once
//! per key, optimistically: it does the work on a transaction and then claims
//! the key, storing the outcome (the encoded response) in `idempotency_keys`
//! on the same transaction; when the work is a business rejection, it rolls
//! the work back and then stores the rejection. If the key is taken already
//! (an earlier call, or a concurrent duplicate, which the claim waits for),
//! this call's work is rolled back and the first outcome is returned: a
//! repeated call changes nothing. A first call, the common case, thus costs
//! no extra round trip to look the key up; a repeat does its work once more
//! before it is undone. Reusing a key for a different request is an
//! `INVALID_ARGUMENT`.
//!
//! The table (in each participant's migrations):
//!
//! ```sql
//! CREATE TABLE idempotency_keys (
//!     key TEXT PRIMARY KEY, request_hash BYTEA NOT NULL,
//!     status_code INT, message TEXT, response BYTEA,
//!     created_at TIMESTAMPTZ NOT NULL DEFAULT now());
//! ```

use futures::future::BoxFuture;
use sagaworks_errors::status::invalid_argument;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool, Row};
use tonic::{Code, Status};

/// A failure of the work inside [`run_once`].
pub trait Outcome: Into<Status> {
    /// `true` for a business rejection (out of stock, insufficient funds): it is
    /// recorded and replayed like a success. `false` for a transient failure
    /// (database down): nothing is recorded, so a retry does the work again.
    fn is_final(&self) -> bool;
}

/// Runs `work` at most once per `key`; see the module docs.
pub async fn run_once<Req, Res, E, F>(pool: &PgPool, key: &str, request: &Req, work: F) -> Result<Res, Status>
where
    Req: prost::Message,
    Res: prost::Message + Default,
    E: Outcome + From<sqlx::Error>,
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<Res, E>>,
{
    if key.contains('\0') || key.trim().is_empty() || key.len() > 200 {
        return Err(invalid_argument("idempotency_key", "must be 1 to 200 characters, without NUL"));
    }
    let hash = Sha256::digest(request.encode_to_vec()).to_vec();
    let inner = async {
        let mut tx = pool.begin().await?;
        match work(&mut tx).await {
            Ok(res) => {
                let claimed = sqlx::query(
                    "INSERT INTO idempotency_keys (key, request_hash, status_code, response) VALUES ($1, $2, 0, $3)
                     ON CONFLICT (key) DO NOTHING",
                )
                .bind(key)
                .bind(&hash)
                .bind(res.encode_to_vec())
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if claimed == 1 {
                    tx.commit().await?;
                    return Ok(Ok(res));
                }
                // Used before: undo this call's work and answer what the first one did.
                tx.rollback().await?;
                stored(&mut *pool.acquire().await?, key, &hash).await
            }
            Err(e) if e.is_final() => {
                // Undo the work, then record the rejection on its own.
                tx.rollback().await?;
                let status: Status = e.into();
                let recorded = sqlx::query(
                    "INSERT INTO idempotency_keys (key, request_hash, status_code, message) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (key) DO NOTHING",
                )
                .bind(key)
                .bind(&hash)
                .bind(status.code() as i32)
                .bind(status.message())
                .execute(pool)
                .await?
                .rows_affected();
                if recorded == 0 {
                    // Used before: its outcome is the outcome.
                    return stored(&mut *pool.acquire().await?, key, &hash).await;
                }
                Ok(Err(status))
            }
            Err(e) => Err(e),
        }
    };
    match inner.await {
        Ok(result) => result,
        Err(e) => Err(e.into()),
    }
}

/// The outcome recorded for `key`, or `INVALID_ARGUMENT` if it was recorded
/// for a different request.
async fn stored<Res, E>(conn: &mut PgConnection, key: &str, hash: &[u8]) -> Result<Result<Res, Status>, E>
where
    Res: prost::Message + Default,
    E: From<sqlx::Error>,
{
    let row = sqlx::query(
        "SELECT request_hash, status_code, message, response FROM idempotency_keys WHERE key = $1",
    )
    .bind(key)
    .fetch_one(conn)
    .await?;
    let stored: Vec<u8> = row.get("request_hash");
    if stored != hash {
        return Ok(Err(invalid_argument("idempotency_key", "was already used for a different request")));
    }
    Ok(replay(row.get("status_code"), row.get("message"), row.get("response")))
}

fn replay<Res: prost::Message + Default>(
    code: Option<i32>,
    message: Option<String>,
    response: Option<Vec<u8>>,
) -> Result<Res, Status> {
    match (code, response) {
        (Some(0), Some(bytes)) => {
            Res::decode(bytes.as_slice()).map_err(|_| Status::internal("stored response is unreadable"))
        }
        (Some(code), _) => Err(Status::new(Code::from_i32(code), message.unwrap_or_default())),
        // The first call's transaction always stores an outcome before commit.
        (None, _) => Err(Status::internal("idempotency record without outcome")),
    }
}
