//! Whether a chaos run tested anything: the invariants hold vacuously on a
//! run that accepted no orders, took no compensation path, or killed
//! processes while nothing ran. A run fails below stated minimums of
//!
//! * orders the API accepted, and of those that ended CONFIRMED and CANCELLED;
//! * sagas resumed after a kill of the order service: in flight when it died
//!   (created before the kill) and finished after it, so a later process took
//!   them over (the order service is the only writer of its sagas, and a
//!   transaction of the dead process that had not committed by then never
//!   will: a finish's `finished_at`, its transaction's start, is earlier);
//! * kills that landed under load: the load generator was running, and the
//!   API had accepted an order in the [`LOAD_WINDOW`] before the kill.
//!
//! The kills come from the chaos script, one line each (see [`Kill::parse`]).

use super::{Verdict, first};
use crate::ToolError;
use crate::check::orders::SAGA_TYPE;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::collections::HashSet;
use std::fmt;
use uuid::Uuid;

/// How recent an accepted order must be for a kill to count as under load.
pub const LOAD_WINDOW: chrono::TimeDelta = chrono::TimeDelta::seconds(3);

/// [`Kill::how`] of a process that exited on its own during the run.
pub const CRASH: &str = "crash";

/// One process death during the chaos run: a fault it injected, or a crash.
#[derive(Debug, Clone, PartialEq)]
pub struct Kill {
    /// The process: `order`, `inventory`, `payment`, `gateway`, `broker`.
    pub target: String,
    /// How it died: `kill-9`, the crash point that aborted it, or [`CRASH`]
    /// (it exited on its own: no fault of the run's, so not counted as one).
    pub how: String,
    /// When it was dead (gone after the kill, or its death was seen).
    pub killed_at: DateTime<Utc>,
    /// When its successor was up (dev-up returned).
    pub restarted_at: DateTime<Utc>,
    /// Whether the load generator was still running at `killed_at`.
    pub load_running: bool,
}

impl Kill {
    /// Parses `target how killed_at restarted_at load_running` (whitespace
    /// separated; RFC 3339 times; `1`/`0`), one kill per line; blank lines
    /// and `#` comments are skipped.
    pub fn parse(text: &str) -> Result<Vec<Kill>, ToolError> {
        let bad = |line: &str, why: &str| ToolError::Usage(format!("kills: {why} in {line:?}"));
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let [target, how, killed, restarted, load] = f[..] else {
                    return Err(bad(line, "expected 5 fields"));
                };
                let time = |s: &str| {
                    DateTime::parse_from_rfc3339(s)
                        .map(|t| t.with_timezone(&Utc))
                        .map_err(|_| bad(line, "not an RFC 3339 time"))
                };
                Ok(Kill {
                    target: target.to_string(),
                    how: how.to_string(),
                    killed_at: time(killed)?,
                    restarted_at: time(restarted)?,
                    load_running: match load {
                        "1" => true,
                        "0" => false,
                        _ => return Err(bad(line, "load_running must be 1 or 0")),
                    },
                })
            })
            .collect()
    }
}

/// The least a run must have done; see the module docs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Minimums {
    pub accepted: u64,
    pub confirmed: u64,
    pub cancelled: u64,
    pub resumed: u64,
    pub kills_under_load: u64,
}

/// What a run did, measured against [`Minimums`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measured {
    pub accepted: u64,
    pub confirmed: u64,
    pub cancelled: u64,
    pub resumed: u64,
    pub kills_under_load: u64,
    pub kills: u64,
}

impl fmt::Display for Measured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "accepted {}, CONFIRMED {}, CANCELLED {}, sagas resumed after an order kill {}, kills under load {} of {}",
            self.accepted, self.confirmed, self.cancelled, self.resumed, self.kills_under_load, self.kills
        )
    }
}

/// Measures the run (`accepted`: the orders the API accepted; `kills`: the
/// chaos script's) and fails it below `min`, naming each shortfall and each
/// kill that did not land under load.
pub async fn minimums(
    order_db: &PgPool,
    accepted: &[Uuid],
    kills: &[Kill],
    min: &Minimums,
) -> Result<Verdict, ToolError> {
    let orders: Vec<(String, DateTime<Utc>)> =
        sqlx::query_as("SELECT status, created_at FROM orders WHERE id = ANY($1)")
            .bind(accepted)
            .fetch_all(order_db)
            .await?;
    let count = |s: &str| orders.iter().filter(|(status, _)| status == s).count() as u64;
    let mut resumed: HashSet<Uuid> = HashSet::new();
    let mut idle = Vec::new();
    let mut under_load = 0;
    let kills: Vec<&Kill> = kills.iter().filter(|k| k.how != CRASH).collect();
    for kill in &kills {
        let accepting =
            orders.iter().any(|(_, at)| *at <= kill.killed_at && *at > kill.killed_at - LOAD_WINDOW);
        if kill.load_running && accepting {
            under_load += 1;
        } else {
            idle.push(format!(
                "{} ({}) at {} landed {}",
                kill.target,
                kill.how,
                kill.killed_at.to_rfc3339(),
                if kill.load_running {
                    "with no order accepted just before"
                } else {
                    "after the load stopped"
                }
            ));
        }
        if kill.target == "order" {
            let ids: Vec<Uuid> = sqlx::query_scalar(
                "SELECT id FROM saga_instances
                  WHERE saga_type = $1 AND created_at < $2 AND finished_at > $2",
            )
            .bind(SAGA_TYPE)
            .bind(kill.killed_at)
            .fetch_all(order_db)
            .await?;
            resumed.extend(ids);
        }
    }
    let measured = Measured {
        accepted: accepted.len() as u64,
        confirmed: count("CONFIRMED"),
        cancelled: count("CANCELLED"),
        resumed: resumed.len() as u64,
        kills_under_load: under_load,
        kills: kills.len() as u64,
    };
    let mut short: Vec<String> = [
        ("accepted", measured.accepted, min.accepted),
        ("CONFIRMED", measured.confirmed, min.confirmed),
        ("CANCELLED", measured.cancelled, min.cancelled),
        ("sagas resumed after an order kill", measured.resumed, min.resumed),
        ("kills under load", measured.kills_under_load, min.kills_under_load),
    ]
    .into_iter()
    .filter(|(_, got, want)| got < want)
    .map(|(what, got, want)| format!("{what} {got} < minimum {want}"))
    .collect();
    let ok = short.is_empty();
    short.extend(idle);
    let mut detail = format!(
        "{measured}; minimums: accepted {}, CONFIRMED {}, CANCELLED {}, resumed {}, kills under load {}",
        min.accepted, min.confirmed, min.cancelled, min.resumed, min.kills_under_load
    );
    if !short.is_empty() {
        detail.push_str(&format!(": {}", first(&short)));
    }
    Ok(Verdict { name: "run coverage", ok, detail })
}
