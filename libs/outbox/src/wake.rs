//! How writers wake the relay: `NOTIFY`, but only while a relay sleeps.
//!
//! # Why not notify on every commit
//!
//! A `NOTIFY` is not free. PostgreSQL serialises the commits of every
//! notifying transaction on the whole server with one lock, held through the
//! commit's WAL flush (`PreCommit_Notify`), so such commits can never share a
//! flush (group commit). Under `scripts/load` on the 2-core machine, most
//! active backends were waiting on that lock (`wait_event_type = Lock`,
//! `object`); with this protocol none do (the README has the samples and the
//! pairs). Yet a busy relay needs no wake-up: it starts its next batch
//! `min_batch_interval_ms` after the last one anyway. Only a sleeping relay
//! does.
//!
//! # The protocol
//!
//! * A relay whose batch found nothing *parks*: on its `LISTEN` connection it
//!   takes the session-level advisory lock [`WAKE_LOCK`] exclusively, runs one
//!   more batch and, if that finds nothing either, sleeps until a
//!   notification or the polling fallback (`poll_interval_ms`). It unparks
//!   (releases the lock) as soon as a batch sends something.
//! * Each event row a writer inserts tries the same lock in shared mode
//!   (`pg_try_advisory_xact_lock_shared`, held to the end of the writer's
//!   transaction) and `NOTIFY`s only when that fails: when a relay is parked,
//!   or waiting to park.
//!
//! No wake-up is lost. A writer whose try succeeded holds the shared lock
//! until its transaction ends, so a relay gets the exclusive lock only after
//! that writer committed (or rolled back), and the batch it runs after parking
//! sees the row. A writer that tries later fails: the lock is held, or an
//! exclusive request is queued for it (PostgreSQL does not let a new shared
//! request overtake it). Its `NOTIFY` reaches the parked relay after the
//! commit, and the relay's next batch sees the row.
//!
//! A relay waits at most [`PARK_WAIT`] for the lock. If it does not get it,
//! either another relay of the same database is parked (the *sentinel*; it is
//! in `pg_locks`): the writers notify, every listener hears it, and this relay
//! sleeps too; or writers hold the lock (a writer transaction that is still
//! open after writing its event): this relay stays busy, and tries again
//! after its next batch.
//!
//! If a parked relay dies, its lock goes with its session. Until a relay
//! parks again, writers do not notify, and the other relays find the events
//! at their polling interval.

use sqlx::postgres::PgListener;
use sqlx::{Acquire, PgConnection, PgPool};
use std::sync::LazyLock;
use std::time::Duration;

/// The channel the writer NOTIFYs (while a relay sleeps); the relay LISTENs on it.
pub const NOTIFY_CHANNEL: &str = "sagaworks_outbox";

/// The advisory lock of the protocol (one per database), as the `bigint` key
/// of PostgreSQL's advisory lock functions. In `pg_locks` it shows as
/// `locktype = 'advisory'`, `classid = 1396786753`, `objid = 1329748017`,
/// `objsubid = 1`.
pub const WAKE_LOCK: i64 = 0x5341_4741_4F42_5831; // "SAGAOBX1"

/// How long a relay waits for [`WAKE_LOCK`] when it parks: writers hold it
/// in shared mode from their event's insert to their commit.
pub(crate) const PARK_WAIT: Duration = Duration::from_millis(100);

/// The SQL expression an outbox insert returns per row: the writer's side of
/// the protocol.
pub(crate) static NOTIFY_IF_PARKED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "CASE WHEN pg_try_advisory_xact_lock_shared({WAKE_LOCK}) THEN NULL
              ELSE pg_notify('{NOTIFY_CHANNEL}', '')::text END"
    )
});

/// What a relay does after a batch that found nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parking {
    /// Parked just now: one more batch must look before it may sleep.
    Parked,
    /// Parked already, or another relay is, or there is no `LISTEN`
    /// connection: sleep until a notification or the polling fallback.
    Sleep,
    /// Writers in flight hold the lock (they will not notify): keep batching.
    Busy,
}

/// The relay's side: its `LISTEN` connection and whether it holds the lock.
#[derive(Default)]
pub(crate) struct Wake {
    listener: Option<PgListener>,
    parked: bool,
}

impl Wake {
    /// Opens the `LISTEN` connection if there is none (it stays out of the
    /// pool's rotation while the relay lives).
    pub(crate) async fn connect(&mut self, pool: &PgPool) {
        if self.listener.is_some() {
            return;
        }
        self.parked = false;
        let mut l = match PgListener::connect_with(pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "cannot LISTEN yet; polling");
                return;
            }
        };
        match l.listen(NOTIFY_CHANNEL).await {
            Ok(()) => self.listener = Some(l),
            Err(e) => tracing::debug!(error = %e, "cannot LISTEN yet; polling"),
        }
    }

    /// Parks after an empty batch; see the module docs.
    pub(crate) async fn park(&mut self) -> Parking {
        if self.parked {
            return Parking::Sleep;
        }
        let Some(l) = self.listener.as_mut() else {
            return Parking::Sleep;
        };
        // `SET LOCAL`: the two statements are one implicit transaction, so the
        // timeout ends with it (the connection goes back to the pool one day);
        // the session-level lock outlives it.
        let park = format!(
            "SET LOCAL lock_timeout = {}; SELECT pg_advisory_lock({WAKE_LOCK})",
            PARK_WAIT.as_millis()
        );
        let conn = match l.acquire().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(error = %e, "cannot park the relay; polling");
                self.lost();
                return Parking::Sleep;
            }
        };
        // Without parameters: the simple protocol, which takes two statements.
        let err = match sqlx::raw_sql(sqlx::AssertSqlSafe(park)).execute(&mut *conn).await {
            Ok(_) => {
                self.parked = true;
                return Parking::Parked;
            }
            Err(e) => e,
        };
        if err.as_database_error().and_then(|e| e.code()).as_deref() != Some("55P03") {
            tracing::debug!(error = %err, "cannot park the relay; polling");
            self.lost();
            return Parking::Sleep;
        }
        match sentinel_exists(conn).await {
            Ok(true) => Parking::Sleep,
            Ok(false) => Parking::Busy,
            Err(e) => {
                tracing::debug!(error = %e, "cannot look for a parked relay; polling");
                self.lost();
                Parking::Sleep
            }
        }
    }

    /// Releases the lock, if held: writers stop notifying.
    pub(crate) async fn unpark(&mut self) {
        if !std::mem::take(&mut self.parked) {
            return;
        }
        let Some(l) = self.listener.as_mut() else { return };
        let unlocked = match l.acquire().await {
            Ok(conn) => sqlx::query("SELECT pg_advisory_unlock($1)").bind(WAKE_LOCK).execute(conn).await,
            Err(e) => Err(e),
        };
        if let Err(e) = unlocked {
            // Whatever state the session is in, a new one holds no lock.
            tracing::debug!(error = %e, "cannot unpark the relay; reconnecting");
            self.lost();
        }
    }

    /// Waits for a notification (pending for ever without a `LISTEN`
    /// connection), then consumes those that arrived already: one wake-up is
    /// enough, the next batch takes every committed row. A lost connection
    /// (its lock went with it) ends the wait too.
    pub(crate) async fn notified(&mut self) {
        let Some(l) = self.listener.as_mut() else {
            return std::future::pending().await;
        };
        // Wait for the first, then take what is readable now (`try_recv` is
        // cancel-safe: polled once, it returns what has arrived).
        let mut next = Some(l.try_recv().await);
        while let Some(received) = next {
            match received {
                Ok(Some(_)) => {}
                // The connection dropped and sqlx reconnected it: a new session, without the lock.
                Ok(None) => {
                    self.parked = false;
                    return;
                }
                Err(_) => {
                    self.lost();
                    return;
                }
            }
            next = tokio::time::timeout(Duration::ZERO, l.try_recv()).await.ok();
        }
    }

    fn lost(&mut self) {
        self.listener = None;
        self.parked = false;
    }

    /// Releases the lock and closes the connection (which goes back to the
    /// pool: it must not keep the lock there).
    pub(crate) async fn close(mut self) {
        self.unpark().await;
    }
}

/// Is another relay of this database parked?
async fn sentinel_exists(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (
             SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database
             WHERE d.datname = current_database() AND l.locktype = 'advisory'
               AND l.classid = ($1 >> 32)::oid AND l.objid = ($1 & 4294967295)::oid AND l.objsubid = 1
               AND l.mode = 'ExclusiveLock' AND l.granted)",
    )
    .bind(WAKE_LOCK)
    .fetch_one(conn)
    .await
}
