//! Relay and consumer benchmark (a command, not a test).
//!
//! ```text
//! cargo run --release -p sagaworks-outbox --example relay_bench -- --events 100000
//!     [--aggregates 1000] [--tx-size 500] [--latency-events 5000] [--rate 500]
//!     [--brokers host:port] [--database-url postgres://...]
//! ```
//!
//! Without `--brokers` / `--database-url` it starts its own Tansu and a fresh
//! database (test-support). Three phases:
//!
//! 1. **write**: `--events` events over `--aggregates` aggregates, `--tx-size`
//!    events per transaction, 4 concurrent writers (relay not running);
//! 2. **relay**: start the relay on that backlog; throughput = events / time
//!    until every row is acked and marked published (commit -> broker ack);
//! 3. **latency**: with the relay and a consumer running, write
//!    `--latency-events` more at `--rate` events/s in transactions of 10 and
//!    measure commit -> handler latency (p50/p99).
//!
//! Then it checks that the consumer handled every event once (inbox count)
//! and each aggregate in order.

use sagaworks_config::KafkaSettings;
use sagaworks_outbox::{
    Consumer, ConsumerSettings, Handler, HandlerError, NewEvent, OutboxWriter, ReceivedEvent, Relay,
    RelaySettings,
};
use sagaworks_test_support::{Broker, TestDatabase};
use sqlx::{PgConnection, PgPool};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WRITERS: usize = 4;

#[derive(Debug)]
struct Args {
    events: usize,
    aggregates: usize,
    tx_size: usize,
    latency_events: usize,
    rate: u64,
    brokers: Option<String>,
    database_url: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        events: 100_000,
        aggregates: 1_000,
        tx_size: 500,
        latency_events: 5_000,
        rate: 500,
        brokers: None,
        database_url: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--events" => a.events = number(value()?)?,
            "--aggregates" => a.aggregates = number(value()?)?.max(1),
            "--tx-size" => a.tx_size = number(value()?)?.max(1),
            "--latency-events" => a.latency_events = number(value()?)?,
            "--rate" => a.rate = number(value()?)?.max(1) as u64,
            "--brokers" => a.brokers = Some(value()?),
            "--database-url" => a.database_url = Some(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// Records when each event was handled and checks per-aggregate order.
#[derive(Default)]
struct Probe {
    handled: Mutex<HashMap<Uuid, Instant>>,
    last_n: Mutex<HashMap<String, i64>>,
    out_of_order: Mutex<u64>,
}

struct ProbeHandler(Arc<Probe>);

impl Handler for ProbeHandler {
    async fn handle(&self, _tx: &mut PgConnection, event: &ReceivedEvent) -> Result<(), HandlerError> {
        let now = Instant::now();
        let n = event
            .json::<serde_json::Value>()
            .ok()
            .and_then(|p| p["n"].as_i64())
            .ok_or_else(|| HandlerError::Permanent("no n".into()))?;
        let mut last = self.0.last_n.lock().unwrap();
        let prev = last.insert(event.aggregate_id.clone(), n);
        if prev.is_some_and(|p| p >= n) {
            *self.0.out_of_order.lock().unwrap() += 1;
        }
        self.0.handled.lock().unwrap().insert(event.id, now);
        Ok(())
    }
}

/// Writes `jobs` (aggregate, n) in order, `tx_size` per transaction; returns
/// each event's id with the instant its transaction committed.
async fn write(pool: &PgPool, jobs: Vec<(String, i64)>, tx_size: usize) -> Vec<(Uuid, Instant)> {
    let writer = OutboxWriter::new("bench");
    let mut out = Vec::with_capacity(jobs.len());
    for chunk in jobs.chunks(tx_size) {
        let mut tx = pool.begin().await.expect("begin");
        let mut ids = Vec::with_capacity(chunk.len());
        for (agg, n) in chunk {
            let event = NewEvent::new("bench", agg, "BenchEvent", serde_json::json!({ "agg": agg, "n": n }))
                .expect("serializable");
            ids.push(writer.write(&mut tx, event).await.expect("write"));
        }
        tx.commit().await.expect("commit");
        let at = Instant::now();
        out.extend(ids.into_iter().map(|id| (id, at)));
    }
    out
}

/// Splits `events` events (round-robin over aggregates, `n` increasing per
/// aggregate from `first_n`) over writers so each aggregate has one writer.
fn jobs(events: usize, aggregates: usize, first_n: i64) -> Vec<Vec<(String, i64)>> {
    let mut per_writer: Vec<Vec<(String, i64)>> = vec![Vec::new(); WRITERS];
    for i in 0..events {
        let agg = i % aggregates;
        let n = first_n + (i / aggregates) as i64;
        per_writer[agg % WRITERS].push((format!("agg-{agg}"), n));
    }
    per_writer
}

async fn backlog(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        .fetch_one(pool)
        .await
        .expect("count")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("relay_bench: {e}");
            std::process::exit(2);
        }
    };
    let _broker;
    let kafka = match &args.brokers {
        Some(b) => KafkaSettings {
            brokers: b.clone(),
            topic_prefix: format!("bench{}", &Uuid::new_v4().simple().to_string()[..8]),
            ..Default::default()
        },
        None => {
            let b = Broker::start().await;
            let k = b.kafka_settings();
            _broker = b;
            k
        }
    };
    let _db;
    let url = match &args.database_url {
        Some(u) => u.clone(),
        None => {
            let db = TestDatabase::create("bench").await;
            let u = db.url.clone();
            _db = db;
            u
        }
    };
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(12).connect(&url).await.expect("connect");
    sagaworks_runtime::db::migrate(&pool, &mut [sagaworks_outbox::migrator()]).await.expect("migrate");
    println!("relay_bench: {args:?}, brokers {}, topic prefix {}", kafka.brokers, kafka.topic_prefix);

    // 1. write the backlog.
    let started = Instant::now();
    let tasks: Vec<_> = jobs(args.events, args.aggregates, 1)
        .into_iter()
        .map(|j| {
            let pool = pool.clone();
            tokio::spawn(async move { write(&pool, j, args.tx_size).await })
        })
        .collect();
    for t in tasks {
        t.await.expect("writer");
    }
    let write_time = started.elapsed();
    println!(
        "write:   {} events in {:.2} s = {:.0} events/s ({} per tx, {WRITERS} writers)",
        args.events,
        write_time.as_secs_f64(),
        args.events as f64 / write_time.as_secs_f64(),
        args.tx_size
    );

    // 2. relay the backlog.
    let token = CancellationToken::new();
    let relay_settings =
        RelaySettings { service: "bench".into(), poll_interval_ms: 100, ..Default::default() };
    let relay = Relay::new(pool.clone(), &kafka, relay_settings).expect("relay");
    let started = Instant::now();
    let relay_task = tokio::spawn(relay.run(token.clone()));
    while backlog(&pool).await > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let relay_time = started.elapsed();
    println!(
        "relay:   {} events acked and marked in {:.2} s = {:.0} events/s",
        args.events,
        relay_time.as_secs_f64(),
        args.events as f64 / relay_time.as_secs_f64()
    );

    // 3. consume the backlog, then paced writes for latency.
    let probe = Arc::new(Probe::default());
    let consumer_settings =
        ConsumerSettings { group_id: "bench".into(), topics: vec!["bench".into()], ..Default::default() };
    let consumer = Consumer::new(pool.clone(), &kafka, consumer_settings, ProbeHandler(probe.clone()))
        .expect("consumer");
    let started = Instant::now();
    let consumer_task = tokio::spawn(consumer.run(token.clone()));
    while probe.handled.lock().unwrap().len() < args.events {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let consume_time = started.elapsed();
    println!(
        "consume: {} events handled (inbox + handler, one tx each) in {:.2} s = {:.0} events/s (incl. group join)",
        args.events,
        consume_time.as_secs_f64(),
        args.events as f64 / consume_time.as_secs_f64()
    );

    let first_n = (args.events / args.aggregates) as i64 + 2;
    let mut commits = Vec::with_capacity(args.latency_events);
    let per_tx = 10;
    let tick = Duration::from_secs_f64(per_tx as f64 / args.rate as f64);
    let mut interval = tokio::time::interval(tick);
    let latency_jobs: Vec<(String, i64)> = (0..args.latency_events)
        .map(|i| (format!("agg-{}", i % args.aggregates), first_n + (i / args.aggregates) as i64))
        .collect();
    for chunk in latency_jobs.chunks(per_tx) {
        interval.tick().await;
        commits.extend(write(&pool, chunk.to_vec(), per_tx).await);
    }
    let total = args.events + args.latency_events;
    let deadline = Instant::now() + Duration::from_secs(120);
    while probe.handled.lock().unwrap().len() < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut latencies: Vec<Duration> = {
        let handled = probe.handled.lock().unwrap();
        commits
            .iter()
            .filter_map(|(id, at)| handled.get(id).map(|h| h.saturating_duration_since(*at)))
            .collect()
    };
    latencies.sort();
    println!(
        "latency: {} events at {} events/s, commit -> handler p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        args.rate,
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );

    token.cancel();
    relay_task.await.expect("relay stops");
    consumer_task.await.expect("consumer stops");
    let handled = probe.handled.lock().unwrap().len();
    let inbox: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox").fetch_one(&pool).await.expect("inbox");
    let out_of_order = *probe.out_of_order.lock().unwrap();
    let ok = handled == total && inbox as usize == total && out_of_order == 0;
    println!(
        "check:   {handled}/{total} handled, inbox {inbox}, out-of-order {out_of_order}: {}",
        if ok { "OK" } else { "FAILED" }
    );
    if !ok {
        std::process::exit(1);
    }
}
