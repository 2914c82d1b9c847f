//! The invariants a run must keep, checked on the services' databases and
//! the broker after the load stopped:
//!
//! * [`orders`]: every order of the fixture's customers (and every order the
//!   gateway accepted) ends `CONFIRMED` or `CANCELLED`, its saga finished to
//!   match (`COMPLETED` / `COMPENSATED`).
//! * [`stock`]: per product, available + reserved + sold = initial stock,
//!   reserved / sold match the RESERVED / COMMITTED reservation lines, and
//!   nothing stays reserved at rest; each order's reservation agrees with its
//!   status (COMMITTED for a confirmed order, RELEASED or none for a
//!   cancelled one).
//! * [`money`]: per customer, charges - refunds = the totals of its confirmed
//!   orders = initial credit - balance; per order, a confirmed order has
//!   exactly its total charged and a cancelled one nothing.
//! * [`events`]: every outbox row got published, and every event written
//!   (the outbox ledger, installed by `sagaworks-tools ledger` before the
//!   run) reached Kafka (at least once; exactly once after dedup by `ce_id`),
//!   with no event on Kafka that no outbox wrote and no business fact
//!   emitted twice.
//! * [`coverage`]: the run did enough for the others to mean something
//!   (orders accepted, confirmed and cancelled, sagas resumed after a kill,
//!   kills under load), against stated minimums.
//!
//! Each check yields a [`Verdict`]; the caller prints them and fails when one
//! is not ok.

pub mod coverage;
pub mod events;
pub mod money;
pub mod orders;
pub mod stock;

use crate::ToolError;
use std::fmt;
use uuid::Uuid;

/// One invariant's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub name: &'static str,
    pub ok: bool,
    /// What was counted, and the first offenders when not ok.
    pub detail: String,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {:<18} {}", if self.ok { " OK " } else { "FAIL" }, self.name, self.detail)
    }
}

/// Runs `check` until its verdict is ok or `settle` has passed, every 500 ms,
/// and returns the last verdict: for invariants the system reaches
/// asynchronously (sagas finishing, relays draining, consumers settling).
async fn settled<F, Fut>(settle: std::time::Duration, mut check: F) -> Result<Verdict, crate::ToolError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Verdict, crate::ToolError>>,
{
    let deadline = std::time::Instant::now() + settle;
    loop {
        let verdict = check().await?;
        if verdict.ok || std::time::Instant::now() >= deadline {
            return Ok(verdict);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// At most this many offenders are named in a verdict.
const SHOWN: usize = 5;

fn first<T: fmt::Display>(items: &[T]) -> String {
    let shown: Vec<String> = items.iter().take(SHOWN).map(ToString::to_string).collect();
    let more = items.len().saturating_sub(SHOWN);
    if more > 0 { format!("{} (+{more} more)", shown.join("; ")) } else { shown.join("; ") }
}

/// Parses ids from the fixture or the accepted-orders file.
pub fn uuids<'a>(what: &str, ids: impl IntoIterator<Item = &'a str>) -> Result<Vec<Uuid>, ToolError> {
    ids.into_iter()
        .map(|s| Uuid::parse_str(s).map_err(|_| ToolError::Usage(format!("{what}: {s:?} is not a UUID"))))
        .collect()
}
