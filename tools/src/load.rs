//! The load generator: a fixed number of closed-loop workers, each placing an
//! order (random customer, 1..=`lines` random products, quantity
//! 1..=`max_quantity`) and waiting for the answer before the next. `POST
//! /v1/orders` answers when the saga finished (or after the gateway's wait),
//! so a `CONFIRMED`/`CANCELLED` answer is a completed saga and its latency is
//! the saga's end-to-end latency. The open-loop generator ([`crate::open_loop`])
//! places the same orders ([`random_order`], [`place`]) at a fixed rate. Both send them to
//! the gateway or, for `scripts/bench-peer`, to the Restate peer ([`crate::target`]).

use crate::open_loop::Sample;
use crate::stats::Latencies;
use crate::{Fixture, Orders, PlaceOutcome, ToolError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct LoadPlan {
    pub concurrency: usize,
    pub duration: Duration,
    pub lines: usize,
    pub max_quantity: i64,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct LoadReport {
    pub elapsed: Duration,
    /// Orders the target accepted (the gateway: 201/200; Restate: 200), with the status it answered.
    pub accepted: Vec<(String, String)>,
    /// Other answers, by HTTP status.
    pub rejected: BTreeMap<u16, u64>,
    /// Transport failures (refused, reset, timed out), by kind.
    pub failed: BTreeMap<String, u64>,
    /// Latencies of completed sagas (accepted and CONFIRMED or CANCELLED).
    pub completed_latency: Latencies,
}

impl LoadReport {
    pub fn count(&self, status: &str) -> usize {
        self.accepted.iter().filter(|(_, s)| s == status).count()
    }

    pub fn completed(&self) -> usize {
        self.count("CONFIRMED") + self.count("CANCELLED")
    }

    pub fn sagas_per_sec(&self) -> f64 {
        self.completed() as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    fn merge(&mut self, other: LoadReport) {
        self.accepted.extend(other.accepted);
        for (k, v) in other.rejected {
            *self.rejected.entry(k).or_default() += v;
        }
        for (k, v) in other.failed {
            *self.failed.entry(k).or_default() += v;
        }
        self.completed_latency.merge(other.completed_latency);
    }
}

fn failure_kind(e: &ToolError) -> String {
    let e = match e {
        ToolError::Http(e) => e,
        ToolError::Answer(_) => return "decode".into(),
        e => return e.to_string(),
    };
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connect".into()
    } else if e.is_decode() {
        "decode".into()
    } else {
        "transport".into()
    }
}

/// A random order of `plan`'s shape: a random customer, 1..=`lines` distinct
/// random products, 1..=`max_quantity` units each.
pub fn random_order(rng: &mut impl Rng, fixture: &Fixture, plan: &LoadPlan) -> (String, Vec<(String, i64)>) {
    let customer = fixture.customers[rng.random_range(0..fixture.customers.len())].id.clone();
    let lines = rng.random_range(1..=plan.lines.min(fixture.products.len()));
    let mut items: Vec<(String, i64)> = Vec::with_capacity(lines);
    while items.len() < lines {
        let p = &fixture.products[rng.random_range(0..fixture.products.len())].id;
        if !items.iter().any(|(id, _)| id == p) {
            items.push((p.clone(), rng.random_range(1..=plan.max_quantity)));
        }
    }
    (customer, items)
}

/// Places the order (with a fresh idempotency key) and says what came of it.
pub async fn place(orders: &Orders, customer: &str, items: &[(String, i64)]) -> Sample {
    let key = uuid::Uuid::new_v4().to_string();
    match orders.place_order(customer, items, &key).await {
        Ok(PlaceOutcome::Accepted { order_id, status }) => Sample::Accepted { order_id, status },
        Ok(PlaceOutcome::Rejected { status }) => Sample::Rejected(status),
        Err(e) => Sample::Failed(failure_kind(&e)),
    }
}

/// Checks that `fixture` and `plan` can make orders.
pub fn check_plan(fixture: &Fixture, plan: &LoadPlan) -> Result<(), ToolError> {
    if fixture.products.is_empty() || fixture.customers.is_empty() {
        return Err(ToolError::Usage("the fixture needs at least one product and one customer".into()));
    }
    if plan.lines == 0 || plan.max_quantity < 1 {
        return Err(ToolError::Usage("--lines and --max-quantity must be at least 1".into()));
    }
    Ok(())
}

async fn worker(
    orders: Arc<Orders>,
    fixture: Arc<Fixture>,
    plan: LoadPlan,
    deadline: Instant,
    stop: CancellationToken,
) -> LoadReport {
    let mut rng = StdRng::from_os_rng();
    let mut report = LoadReport::default();
    while Instant::now() < deadline && !stop.is_cancelled() {
        let (customer, items) = random_order(&mut rng, &fixture, &plan);
        let started = Instant::now();
        let sample = place(&orders, &customer, &items).await;
        if sample.completed() {
            report.completed_latency.record(started.elapsed());
        }
        match sample {
            Sample::Accepted { order_id, status } => report.accepted.push((order_id, status)),
            Sample::Rejected(status) => {
                *report.rejected.entry(status).or_default() += 1;
                // Rate-limited or shed (429/503 come back at once): back off instead of spinning.
                if status == 429 || status == 503 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            Sample::Failed(kind) => {
                *report.failed.entry(kind).or_default() += 1;
                // A dead gateway refuses instantly; don't spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    report
}

/// Runs `plan.concurrency` workers for `plan.duration`, or until `stop`
/// (each worker finishes the order in hand and the report is complete).
pub async fn run(
    orders: Arc<Orders>,
    fixture: Arc<Fixture>,
    plan: LoadPlan,
    stop: CancellationToken,
) -> Result<LoadReport, ToolError> {
    check_plan(&fixture, &plan)?;
    let started = Instant::now();
    let deadline = started + plan.duration;
    let workers: Vec<_> = (0..plan.concurrency.max(1))
        .map(|_| tokio::spawn(worker(orders.clone(), fixture.clone(), plan.clone(), deadline, stop.clone())))
        .collect();
    let mut report = LoadReport::default();
    for w in workers {
        let r = w.await?;
        report.merge(r);
    }
    report.elapsed = started.elapsed();
    Ok(report)
}
