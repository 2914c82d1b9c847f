//! Relay and consumer benchmark (a command, not a test).
//!
//! ```text
//! cargo run --release -p sagaworks-outbox --example relay_bench -- --events 100000
//!     [--aggregates 1000] [--tx-size 500] [--relay-batch 500] [--relay-rows 4000] [--relays 1]
//!     [--consumer-batch 200] [--consumer-wait-ms 0] [--consumer-concurrency 4]
//!     [--lag-rate EVENTS_PER_SEC] [--lag-secs 10]
//!     [--latency-events 5000] [--rate 500]
//!     [--brokers host:port] [--database-url postgres://...]
//! ```
//!
//! Without `--brokers` / `--database-url` it starts its own Kafka broker and a fresh
//! database (test-support). Phases:
//!
//! 1. **write**: `--events` events over `--aggregates` aggregates, `--tx-size`
//!    events per transaction, 4 concurrent writers (relay not running);
//! 2. **relay**: start the relay (`--relays` of them, as replicas would run
//!    them) on that backlog; throughput = events / time until every row is
//!    acked and deleted (commit -> broker ack);
//! 3. **lag**: with the relay running and nothing else, write events of
//!    another aggregate type at `--lag-rate` events/s (default: half the
//!    relay's measured rate) for `--lag-secs`, in transactions of 10 on their
//!    own schedule (open loop), and measure commit -> visible on Kafka (a
//!    plain consumer assigned to the topic's end) p50/p99;
//! 4. **consume**: a consumer (inbox + handler, `--consumer-batch` messages
//!    per transaction, `--consumer-concurrency` workers) on the backlog;
//! 5. **latency**: with the relay and the consumer running, write
//!    `--latency-events` more at `--rate` events/s in transactions of 10 and
//!    measure commit -> handler latency (p50/p99).
//!
//! Each phase also prints the machine's CPU time per event (all processes:
//! this one, PostgreSQL, the broker; from `/proc/stat`). Then it checks that
//! the consumer handled every event once (inbox count) and each aggregate in
//! order.

use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sagaworks_config::KafkaSettings;
use sagaworks_outbox::{
    Consumer, ConsumerSettings, Handler, HandlerError, NewEvent, OutboxWriter, PendingEvents, ReceivedEvent,
    Relay, RelaySettings,
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
    relay_batch: i64,
    relay_rows: Option<i64>,
    relays: usize,
    consumer_batch: usize,
    consumer_wait_ms: u64,
    consumer_concurrency: usize,
    lag_rate: Option<u64>,
    lag_secs: u64,
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
        relay_batch: 500,
        relay_rows: None,
        relays: 1,
        consumer_batch: 200,
        consumer_wait_ms: 0,
        consumer_concurrency: 4,
        lag_rate: None,
        lag_secs: 10,
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
            "--relay-batch" => a.relay_batch = number(value()?)?.max(1) as i64,
            "--relay-rows" => a.relay_rows = Some(number(value()?)?.max(1) as i64),
            "--relays" => a.relays = number(value()?)?.max(1),
            "--consumer-batch" => a.consumer_batch = number(value()?)?.max(1),
            "--consumer-wait-ms" => a.consumer_wait_ms = number(value()?)? as u64,
            "--consumer-concurrency" => a.consumer_concurrency = number(value()?)?.max(1),
            "--lag-rate" => a.lag_rate = Some(number(value()?)?.max(10) as u64),
            "--lag-secs" => a.lag_secs = number(value()?)?.max(1) as u64,
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
            ids.push(writer.append(&mut tx, event).await.expect("write"));
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

/// Whether any event is still unpublished. (Not a `count(*)`: counting the
/// whole backlog on every poll would take CPU from the relay being measured.)
async fn backlog(pool: &PgPool) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox)").fetch_one(pool).await.expect("backlog")
}

/// Busy CPU time of the whole machine so far (user, nice, system, irq,
/// softirq; all processes), from `/proc/stat` in USER_HZ (100/s) ticks.
fn machine_busy() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let busy: u64 = [0, 1, 2, 5, 6].iter().filter_map(|i| ticks.get(*i)).sum();
    Duration::from_millis(busy * 10)
}

/// Machine CPU per event since `since` (a [`machine_busy`] reading).
fn cpu_per_event(since: Duration, events: usize) -> String {
    let us = (machine_busy().saturating_sub(since)).as_secs_f64() * 1e6 / events.max(1) as f64;
    format!("{us:.0} us of machine CPU per event")
}

/// Phase 3: events of aggregate type `benchlag` written at `rate` events/s
/// (transactions of 10 on a fixed schedule, up to 8 at a time) for `secs`,
/// with the relay running; returns commit -> visible on Kafka per event and
/// how far the writers fell behind their schedule at the worst.
async fn lag_phase(pool: &PgPool, kafka: &KafkaSettings, rate: u64, secs: u64) -> (Vec<Duration>, Duration) {
    const PER_TX: usize = 10;
    let topic = sagaworks_outbox::kafka::topic_name(kafka, "benchlag");
    let lag_event = |i: usize| {
        NewEvent::new("benchlag", format!("lag-{}", i % 1000), "LagEvent", serde_json::json!({ "i": i }))
            .expect("serializable")
    };
    // One event first, so the topic exists before the reader is assigned to it.
    let warm = write_pending(pool, vec![lag_event(usize::MAX)]).await;
    while backlog(pool).await {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reader: StreamConsumer = sagaworks_outbox::kafka::client_config(
        kafka,
        &[("group.id", "bench-lag"), ("enable.auto.commit", "false"), ("fetch.wait.max.ms", "10")],
    )
    .create()
    .expect("lag reader");
    let metadata = reader.fetch_metadata(Some(&topic), Duration::from_secs(5)).expect("metadata");
    let mut tpl = TopicPartitionList::new();
    for p in metadata.topics()[0].partitions() {
        tpl.add_partition_offset(&topic, p.id(), Offset::Beginning).expect("partition");
    }
    reader.assign(&tpl).expect("assign");
    let seen: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
    let stop = CancellationToken::new();
    let read = {
        let (seen, stop) = (seen.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    _ = stop.cancelled() => break,
                    msg = reader.recv() => msg,
                };
                let Ok(msg) = msg else { continue };
                let at = Instant::now();
                let id = msg.headers().and_then(|h| {
                    h.iter().find(|h| h.key == sagaworks_outbox::kafka::headers::CE_ID).and_then(|h| {
                        std::str::from_utf8(h.value?).ok().and_then(|v| Uuid::parse_str(v).ok())
                    })
                });
                if let Some(id) = id {
                    seen.lock().unwrap().insert(id, at);
                }
            }
        })
    };
    // Let the reader fetch the warm-up event: it is then positioned.
    while !seen.lock().unwrap().contains_key(&warm[0].0) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let transactions = (rate * secs) as usize / PER_TX;
    let interval = Duration::from_secs_f64(PER_TX as f64 / rate as f64);
    let slots = Arc::new(tokio::sync::Semaphore::new(8));
    let start = tokio::time::Instant::now();
    let mut behind = Duration::ZERO;
    let mut writes = Vec::with_capacity(transactions);
    for t in 0..transactions {
        let due = start + interval * t as u32;
        tokio::time::sleep_until(due).await;
        let permit = slots.clone().acquire_owned().await.expect("open");
        behind = behind.max(tokio::time::Instant::now() - due);
        let pool = pool.clone();
        let events: Vec<NewEvent> = (0..PER_TX).map(|k| lag_event(t * PER_TX + k)).collect();
        writes.push(tokio::spawn(async move {
            let committed = write_pending(&pool, events).await;
            drop(permit);
            committed
        }));
    }
    let mut commits = Vec::with_capacity(transactions * PER_TX);
    for w in writes {
        commits.extend(w.await.expect("writer"));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && commits.iter().any(|(id, _)| !seen.lock().unwrap().contains_key(id)) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    read.await.expect("reader");
    let seen = seen.lock().unwrap();
    let mut lags: Vec<Duration> = commits
        .iter()
        .filter_map(|(id, at)| seen.get(id).map(|v| v.saturating_duration_since(*at)))
        .collect();
    lags.sort();
    (lags, behind)
}

/// Writes `events` in one transaction, one statement; returns their ids with
/// the instant it committed.
async fn write_pending(pool: &PgPool, events: Vec<NewEvent>) -> Vec<(Uuid, Instant)> {
    let writer = OutboxWriter::new("bench");
    let mut pending = PendingEvents::new();
    let mut ids = Vec::with_capacity(events.len());
    for e in events {
        let p = writer.stage(e).expect("pending");
        ids.push(p.id());
        pending.push(p);
    }
    let sql = format!("WITH {} SELECT count(*) FROM ev", PendingEvents::cte("ev", 1));
    let mut tx = pool.begin().await.expect("begin");
    pending.bind(sqlx::query(sqlx::AssertSqlSafe(sql))).execute(&mut *tx).await.expect("write");
    tx.commit().await.expect("commit");
    let at = Instant::now();
    ids.into_iter().map(|id| (id, at)).collect()
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
    let cpu = machine_busy();
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
        "write:   {} events in {:.2} s = {:.0} events/s ({} per tx, {WRITERS} writers), {}",
        args.events,
        write_time.as_secs_f64(),
        args.events as f64 / write_time.as_secs_f64(),
        args.tx_size,
        cpu_per_event(cpu, args.events)
    );

    // 2. relay the backlog.
    let token = CancellationToken::new();
    let relay_settings = RelaySettings {
        service: "bench".into(),
        poll_interval_ms: 100,
        batch_size: args.relay_batch,
        batch_rows: args.relay_rows.unwrap_or(RelaySettings::default().batch_rows),
        ..Default::default()
    };
    let started = Instant::now();
    let cpu = machine_busy();
    let relay_tasks: Vec<_> = (0..args.relays)
        .map(|_| {
            let relay = Relay::new(pool.clone(), &kafka, relay_settings.clone()).expect("relay");
            tokio::spawn(relay.run(token.clone()))
        })
        .collect();
    while backlog(&pool).await {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let relay_time = started.elapsed();
    let relay_rate = args.events as f64 / relay_time.as_secs_f64();
    println!(
        "relay:   {} events acked and deleted in {:.2} s = {relay_rate:.0} events/s ({} relay(s), {} heads per batch), {}",
        args.events,
        relay_time.as_secs_f64(),
        args.relays,
        args.relay_batch,
        cpu_per_event(cpu, args.events)
    );

    // 3. commit -> visible on Kafka at a fixed rate.
    let lag_rate = args.lag_rate.unwrap_or((relay_rate / 2.0) as u64).max(10);
    let cpu = machine_busy();
    let (lags, behind) = lag_phase(&pool, &kafka, lag_rate, args.lag_secs).await;
    println!(
        "lag:     {} events at {lag_rate} events/s for {} s, commit -> on Kafka p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms \
         (writers at most {:.1} ms behind schedule), {}",
        lags.len(),
        args.lag_secs,
        percentile(&lags, 0.50).as_secs_f64() * 1e3,
        percentile(&lags, 0.99).as_secs_f64() * 1e3,
        lags.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
        behind.as_secs_f64() * 1e3,
        cpu_per_event(cpu, lags.len())
    );

    // 4. consume the backlog, then 5. paced writes for latency.
    let probe = Arc::new(Probe::default());
    let consumer_settings = ConsumerSettings {
        group_id: "bench".into(),
        topics: vec!["bench".into()],
        batch_size: args.consumer_batch,
        batch_wait_ms: args.consumer_wait_ms,
        concurrency: args.consumer_concurrency,
        ..Default::default()
    };
    let consumer = Consumer::new(pool.clone(), &kafka, consumer_settings, ProbeHandler(probe.clone()))
        .expect("consumer");
    let started = Instant::now();
    let cpu = machine_busy();
    let consumer_task = tokio::spawn(consumer.run(token.clone()));
    while probe.handled.lock().unwrap().len() < args.events {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let consume_time = started.elapsed();
    let steady = {
        let handled = probe.handled.lock().unwrap();
        let first = handled.values().min().copied().unwrap_or(started);
        let last = handled.values().max().copied().unwrap_or(started);
        last.saturating_duration_since(first)
    };
    println!(
        "consume: first to last handled event {:.2} s = {:.0} events/s",
        steady.as_secs_f64(),
        args.events as f64 / steady.as_secs_f64().max(1e-3)
    );
    println!(
        "consume: {} events handled (inbox + handler, up to {} per tx, {} workers) in {:.2} s = {:.0} events/s \
         (incl. group join), {}",
        args.events,
        args.consumer_batch,
        args.consumer_concurrency,
        consume_time.as_secs_f64(),
        args.events as f64 / consume_time.as_secs_f64(),
        cpu_per_event(cpu, args.events)
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
    for relay in relay_tasks {
        relay.await.expect("relay stops");
    }
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
