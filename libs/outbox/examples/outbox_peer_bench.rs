//! One outbox table published to Kafka by one system, measured from the Kafka side: the
//! relay (`libs/outbox`) or Debezium's PostgreSQL connector with the Outbox Event Router
//! under Kafka Connect. A command, not a test, built only with the `peer-bench` feature;
//! `scripts/bench-outbox-peer` runs it once per system and compares (docs/performance.md).
//!
//! ```text
//! outbox_peer_bench run --system relay|debezium --database-url URL --brokers HOST:PORT
//!     --topic-prefix P --pg-pid PID --broker-pid PID [--publisher CMD] [--publisher-log FILE]
//!     [--slot NAME] [--events 100000] [--aggregates 1000] [--tx-size 500]
//!     [--lag-rate EVENTS_PER_SEC] [--lag-secs 10] [--drain-secs 300]
//! outbox_peer_bench serve-relay --database-url URL --brokers HOST:PORT --topic-prefix P
//! ```
//!
//! `run`, on a fresh database with the outbox migrations:
//!
//! 0. creates the topic `<P>.bench` (3 partitions) and, for Debezium, the publication and
//!    the logical replication slot `--slot` (pgoutput) on the outbox table, so that the
//!    slot holds the backlog written next;
//! 1. **write**: `--events` events over `--aggregates` aggregates (`agg-<k>`, payload
//!    `{"agg", "n"}` with `n` rising per aggregate), `--tx-size` per transaction, 4
//!    writers, an aggregate always on the same writer (as relay_bench writes them);
//! 2. **throughput**: starts the publisher: for the relay, this binary's `serve-relay` as a
//!    process of its own; for Debezium, `--publisher` (`sh -c "exec CMD"`, the Kafka
//!    Connect JVM). A reader (an rdkafka consumer assigned to every partition from the
//!    start) notes when each event is first visible on Kafka. events/s = events from the
//!    first visible to the last visible; the time from the publisher's start is printed
//!    too (it includes the JVM's or the process's start-up);
//! 3. **lag**: with the publisher running, events of 1 000 other aggregates (`lag-<lane>-<j>`) at
//!    `--lag-rate` events/s (default: half the rate of phase 2) for `--lag-secs`, in
//!    transactions of 10 on a fixed schedule (8 lanes, an aggregate on one), and commit ->
//!    visible on Kafka p50/p99;
//! 4. stops the publisher (SIGTERM) and checks the topic: every event seen, duplicates,
//!    and per key (aggregate id) the payload's `n` strictly rising in topic order.
//!
//! CPU per event, for phases 2 (first to last visible) and 3, per process from
//! `/proc/<pid>/stat` (user + system; clock ticks of 10 ms): the publisher, PostgreSQL (the
//! postmaster, its live children, and its reaped children's time), the broker, their sum,
//! and the whole machine (`/proc/stat`, every process, including this one's writer and
//! reader and anything else running). The last line is `RESULT key=value ...` for the script.

use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sagaworks_config::KafkaSettings;
use sagaworks_outbox::kafka::{TopicSettings, ensure_topics, topic_name};
use sagaworks_outbox::{NewEvent, OutboxWriter, PendingEvents, Relay, RelaySettings};
use sqlx::PgPool;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WRITERS: usize = 4;
const AGGREGATE_TYPE: &str = "bench";
/// Linux's USER_HZ: the unit of `/proc/stat` and `/proc/<pid>/stat` times.
const TICK_US: f64 = 10_000.0;

#[derive(Debug, Clone)]
struct Args {
    system: String,
    database_url: String,
    brokers: String,
    topic_prefix: String,
    pg_pid: u32,
    broker_pid: u32,
    publisher: Option<String>,
    publisher_log: Option<String>,
    slot: String,
    events: usize,
    aggregates: usize,
    tx_size: usize,
    lag_rate: Option<u64>,
    lag_secs: u64,
    drain_secs: u64,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        system: String::new(),
        database_url: String::new(),
        brokers: String::new(),
        topic_prefix: String::new(),
        pg_pid: 0,
        broker_pid: 0,
        publisher: None,
        publisher_log: None,
        slot: "outbox_peer".into(),
        events: 100_000,
        aggregates: 1_000,
        tx_size: 500,
        lag_rate: None,
        lag_secs: 10,
        drain_secs: 300,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--system" => a.system = value()?,
            "--database-url" => a.database_url = value()?,
            "--brokers" => a.brokers = value()?,
            "--topic-prefix" => a.topic_prefix = value()?,
            "--pg-pid" => a.pg_pid = number(value()?)? as u32,
            "--broker-pid" => a.broker_pid = number(value()?)? as u32,
            "--publisher" => a.publisher = Some(value()?),
            "--publisher-log" => a.publisher_log = Some(value()?),
            "--slot" => a.slot = value()?,
            "--events" => a.events = number(value()?)?.max(1) as usize,
            "--aggregates" => a.aggregates = number(value()?)?.max(1) as usize,
            "--tx-size" => a.tx_size = number(value()?)?.max(1) as usize,
            "--lag-rate" => a.lag_rate = Some(number(value()?)?.max(10)),
            "--lag-secs" => a.lag_secs = number(value()?)?.max(1),
            "--drain-secs" => a.drain_secs = number(value()?)?.max(1),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.database_url.is_empty() || a.brokers.is_empty() || a.topic_prefix.is_empty() {
        return Err("--database-url, --brokers and --topic-prefix are required".into());
    }
    Ok(a)
}

fn kafka_settings(a: &Args) -> KafkaSettings {
    KafkaSettings { brokers: a.brokers.clone(), topic_prefix: a.topic_prefix.clone(), ..Default::default() }
}

// ---- CPU ----------------------------------------------------------------------------

/// `(ppid, utime + stime, cutime + cstime)` of a process, in ticks.
fn proc_stat(pid: u32) -> Option<(u32, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: the fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    Some((n(1) as u32, n(11) + n(12), n(13) + n(14)))
}

/// A process's own CPU time, its threads included.
fn process_ticks(pid: u32) -> u64 {
    if pid == 0 {
        return 0;
    }
    proc_stat(pid).map(|(_, own, _)| own).unwrap_or(0)
}

/// The PostgreSQL server's CPU time: the postmaster's own and its reaped children's, plus
/// every live child's (backends, walsenders, the background processes).
fn postgres_ticks(postmaster: u32) -> u64 {
    if postmaster == 0 {
        return 0;
    }
    let Some((_, own, reaped)) = proc_stat(postmaster) else { return 0 };
    let mut total = own + reaped;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if let Some((ppid, own, _)) = proc_stat(pid)
                && ppid == postmaster
            {
                total += own;
            }
        }
    }
    total
}

/// Busy CPU time of the whole machine (user, nice, system, irq, softirq), in ticks.
fn machine_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    [0, 1, 2, 5, 6].iter().filter_map(|i| ticks.get(*i)).sum()
}

#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    publisher: u64,
    postgres: u64,
    broker: u64,
    machine: u64,
}

#[derive(Debug, Clone, Copy)]
struct Pids {
    publisher: u32,
    postgres: u32,
    broker: u32,
}

fn cpu_now(p: Pids) -> Cpu {
    Cpu {
        publisher: process_ticks(p.publisher),
        postgres: postgres_ticks(p.postgres),
        broker: process_ticks(p.broker),
        machine: machine_ticks(),
    }
}

/// Microseconds of CPU per event between two readings: publisher, PostgreSQL, broker,
/// their sum, the machine.
fn per_event(from: Cpu, to: Cpu, events: usize) -> [f64; 5] {
    let us = |a: u64, b: u64| b.saturating_sub(a) as f64 * TICK_US / events.max(1) as f64;
    let (p, g, b) =
        (us(from.publisher, to.publisher), us(from.postgres, to.postgres), us(from.broker, to.broker));
    [p, g, b, p + g + b, us(from.machine, to.machine)]
}

fn cpu_text(c: [f64; 5]) -> String {
    format!(
        "CPU per event: publisher {:.1} us, PostgreSQL {:.1} us, broker {:.1} us, sum {:.1} us; machine {:.1} us",
        c[0], c[1], c[2], c[3], c[4]
    )
}

// ---- the reader ---------------------------------------------------------------------

/// What the reader saw on the topic.
#[derive(Default)]
struct Seen {
    /// Event id -> when it was first visible.
    first: HashMap<Uuid, Instant>,
    messages: u64,
    duplicates: u64,
    /// Messages without a parseable `ce_id` header, key or payload `n`.
    malformed: u64,
    /// Per key: the last `n` seen.
    last_n: HashMap<String, i64>,
    out_of_order: u64,
    /// The first few: `key: n after n`.
    out_of_order_samples: Vec<String>,
    /// The first message, for the record's shape.
    sample: Option<String>,
    /// CPU readings taken by the reader at the first message and at the `target`-th
    /// distinct event.
    target: usize,
    at_first: Option<(Instant, Cpu)>,
    at_target: Option<(Instant, Cpu)>,
}

fn describe(msg: &rdkafka::message::BorrowedMessage<'_>) -> String {
    let text = |b: Option<&[u8]>| match b {
        None => "null".to_string(),
        Some(b) => format!("{:?}", String::from_utf8_lossy(b)),
    };
    let mut out = format!("partition {} key {} headers [", msg.partition(), text(msg.key()));
    if let Some(h) = msg.headers() {
        for (i, h) in h.iter().enumerate() {
            out += &format!("{}{}={}", if i > 0 { ", " } else { "" }, h.key, text(h.value));
        }
    }
    out + &format!("] value {}", text(msg.payload()))
}

fn spawn_reader(
    kafka: &KafkaSettings,
    topic: &str,
    seen: Arc<Mutex<Seen>>,
    pids: Arc<Mutex<Pids>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let reader: StreamConsumer = sagaworks_outbox::kafka::client_config(
        kafka,
        &[("group.id", "outbox-peer-reader"), ("enable.auto.commit", "false"), ("fetch.wait.max.ms", "10")],
    )
    .create()
    .expect("reader");
    let metadata = reader.fetch_metadata(Some(topic), Duration::from_secs(10)).expect("metadata");
    let mut tpl = TopicPartitionList::new();
    for p in metadata.topics()[0].partitions() {
        tpl.add_partition_offset(topic, p.id(), Offset::Beginning).expect("partition");
    }
    assert!(tpl.count() > 0, "topic {topic} has no partitions");
    reader.assign(&tpl).expect("assign");
    tokio::spawn(async move {
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => break,
                msg = reader.recv() => msg,
            };
            let Ok(msg) = msg else { continue };
            let at = Instant::now();
            let id = msg.headers().and_then(|h| {
                h.iter()
                    .find(|h| h.key == sagaworks_outbox::kafka::headers::CE_ID)
                    .and_then(|h| std::str::from_utf8(h.value?).ok().and_then(|v| Uuid::parse_str(v).ok()))
            });
            let key = msg.key().and_then(|k| std::str::from_utf8(k).ok()).map(str::to_owned);
            let n = msg
                .payload()
                .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                .and_then(|v| v["n"].as_i64());
            let mut s = seen.lock().unwrap();
            s.messages += 1;
            if s.sample.is_none() {
                s.sample = Some(describe(&msg));
            }
            let (Some(id), Some(key), Some(n)) = (id, key, n) else {
                s.malformed += 1;
                continue;
            };
            match s.first.entry(id) {
                Entry::Occupied(_) => s.duplicates += 1,
                Entry::Vacant(first) => {
                    first.insert(at);
                }
            }
            let prev = s.last_n.insert(key.clone(), n);
            if let Some(p) = prev.filter(|p| *p >= n) {
                s.out_of_order += 1;
                if s.out_of_order_samples.len() < 5 {
                    s.out_of_order_samples.push(format!("{key}: {n} after {p}"));
                }
            }
            let distinct = s.first.len();
            if s.at_first.is_none() {
                drop(s);
                let cpu = cpu_now(*pids.lock().unwrap());
                seen.lock().unwrap().at_first = Some((at, cpu));
                continue;
            }
            if distinct == s.target && s.at_target.is_none() {
                drop(s);
                let cpu = cpu_now(*pids.lock().unwrap());
                seen.lock().unwrap().at_target = Some((at, cpu));
            }
        }
        sagaworks_outbox::kafka::close(reader, "reader", Duration::from_secs(5)).await;
    })
}

// ---- writing --------------------------------------------------------------------------

fn event(aggregate: &str, n: i64) -> NewEvent {
    NewEvent::new(AGGREGATE_TYPE, aggregate, "BenchEvent", serde_json::json!({ "agg": aggregate, "n": n }))
        .expect("serializable")
}

/// Writes `jobs` in order, `tx_size` per transaction (one `append` per event).
async fn write(pool: &PgPool, jobs: Vec<(String, i64)>, tx_size: usize) {
    let writer = OutboxWriter::new("bench");
    for chunk in jobs.chunks(tx_size) {
        let mut tx = pool.begin().await.expect("begin");
        for (agg, n) in chunk {
            writer.append(&mut tx, event(agg, *n)).await.expect("write");
        }
        tx.commit().await.expect("commit");
    }
}

/// Writes `events` in one transaction, one statement; returns their ids with the instant
/// it committed.
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

/// Events at `rate`/s for `secs`, transactions of 10 on a fixed schedule, each on one of 8
/// lanes (transaction t on lane t % 8, up to 8 at a time): each event's id and commit
/// instant, and how far the writers fell behind. An aggregate is written by one lane only,
/// one transaction after the other, so its commit order is its `n` order; with the
/// transactions of every lane in flight at once (as a first version had it), a slow early
/// transaction could commit after a later one of the same aggregate, and the topic then
/// showed the commit order, not `n`'s.
async fn paced(pool: &PgPool, rate: u64, secs: u64) -> (Vec<(Uuid, Instant)>, Duration) {
    const PER_TX: usize = 10;
    const LANES: usize = 8;
    /// Aggregates per lane: 8 x 125 = 1 000 (`lag-<lane>-<j>`).
    const PER_LANE: usize = 125;
    let transactions = (rate * secs) as usize / PER_TX;
    let interval = Duration::from_secs_f64(PER_TX as f64 / rate as f64);
    let lanes: Vec<Arc<tokio::sync::Mutex<()>>> = (0..LANES).map(|_| Arc::default()).collect();
    let start = tokio::time::Instant::now();
    let mut behind = Duration::ZERO;
    let mut writes = Vec::with_capacity(transactions);
    for t in 0..transactions {
        let due = start + interval * t as u32;
        tokio::time::sleep_until(due).await;
        // Taken here, in t's order: the lane's transactions commit one after the other.
        let lane = lanes[t % LANES].clone().lock_owned().await;
        behind = behind.max(tokio::time::Instant::now() - due);
        let pool = pool.clone();
        let s = t / LANES;
        let events: Vec<NewEvent> = (0..PER_TX)
            .map(|k| {
                let pos = s * PER_TX + k;
                event(&format!("lag-{}-{}", t % LANES, pos % PER_LANE), (pos / PER_LANE) as i64 + 1)
            })
            .collect();
        writes.push(tokio::spawn(async move {
            let committed = write_pending(&pool, events).await;
            drop(lane);
            committed
        }));
    }
    let mut commits = Vec::with_capacity(transactions * PER_TX);
    for w in writes {
        commits.extend(w.await.expect("writer"));
    }
    (commits, behind)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---- the publisher ----------------------------------------------------------------------

fn start_publisher(a: &Args) -> Child {
    let mut cmd = match (a.system.as_str(), &a.publisher) {
        (_, Some(line)) => {
            let mut c = Command::new("sh");
            c.arg("-c").arg(format!("exec {line}"));
            c
        }
        ("relay", None) => {
            let mut c = Command::new(std::env::current_exe().expect("own path"));
            c.args(["serve-relay", "--database-url", &a.database_url, "--brokers", &a.brokers]);
            c.args(["--topic-prefix", &a.topic_prefix]);
            c
        }
        (other, None) => panic!("--system {other} needs --publisher"),
    };
    let log = |path: &Option<String>| match path {
        Some(p) => Stdio::from(std::fs::File::create(p).expect("publisher log")),
        None => Stdio::inherit(),
    };
    cmd.stdin(Stdio::null()).stdout(log(&a.publisher_log)).stderr(log(&a.publisher_log));
    cmd.spawn().expect("start the publisher")
}

/// SIGTERM, up to 30 s, then SIGKILL.
fn stop_publisher(mut child: Child) {
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("outbox_peer_bench: the publisher did not stop in 30 s; killing it");
    let _ = child.kill();
    let _ = child.wait();
}

// ---- run -------------------------------------------------------------------------------

async fn run(a: Args) -> bool {
    let kafka = kafka_settings(&a);
    let topic = topic_name(&kafka, AGGREGATE_TYPE);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(12)
        .connect(&a.database_url)
        .await
        .expect("connect");
    sagaworks_runtime::db::migrate(&pool, &mut [sagaworks_outbox::migrator()]).await.expect("migrate");
    println!("outbox_peer_bench: {a:?}, topic {topic}");
    ensure_topics(
        &kafka,
        std::slice::from_ref(&topic),
        TopicSettings { partitions: 3, replication_factor: 1 },
    )
    .await
    .expect("topic");
    if a.system == "debezium" {
        // Made before the backlog is written, so that the slot keeps it for the connector.
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE PUBLICATION {} FOR TABLE outbox", a.slot)))
            .execute(&pool)
            .await
            .expect("publication");
        sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
            .bind(&a.slot)
            .execute(&pool)
            .await
            .expect("replication slot");
    }

    let seen = Arc::new(Mutex::new(Seen { target: a.events, ..Default::default() }));
    let pids = Arc::new(Mutex::new(Pids { publisher: 0, postgres: a.pg_pid, broker: a.broker_pid }));
    let stop = CancellationToken::new();
    let reader = spawn_reader(&kafka, &topic, seen.clone(), pids.clone(), stop.clone());

    // 1. the backlog.
    let started = Instant::now();
    let mut per_writer: Vec<Vec<(String, i64)>> = vec![Vec::new(); WRITERS];
    for i in 0..a.events {
        let agg = i % a.aggregates;
        per_writer[agg % WRITERS].push((format!("agg-{agg}"), 1 + (i / a.aggregates) as i64));
    }
    let writers: Vec<_> = per_writer
        .into_iter()
        .map(|j| {
            let pool = pool.clone();
            tokio::spawn(async move { write(&pool, j, a.tx_size).await })
        })
        .collect();
    for w in writers {
        w.await.expect("writer");
    }
    println!(
        "write:      {} events in {:.2} s ({} per tx, {WRITERS} writers), before the publisher starts",
        a.events,
        started.elapsed().as_secs_f64(),
        a.tx_size
    );
    sqlx::query("CHECKPOINT").execute(&pool).await.expect("checkpoint");

    // 2. the publisher on the backlog.
    let spawned = Instant::now();
    let child = start_publisher(&a);
    pids.lock().unwrap().publisher = child.id();
    let cpu_spawn = cpu_now(*pids.lock().unwrap());
    let deadline = spawned + Duration::from_secs(a.drain_secs);
    while seen.lock().unwrap().at_target.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (first, last) = {
        let s = seen.lock().unwrap();
        (s.at_first, s.at_target)
    };
    let (Some((t_first, cpu_first)), Some((t_last, cpu_last))) = (first, last) else {
        let got = seen.lock().unwrap().first.len();
        eprintln!("outbox_peer_bench: only {got} of {} events visible after {} s", a.events, a.drain_secs);
        stop_publisher(child);
        stop.cancel();
        let _ = reader.await;
        return false;
    };
    let window = t_last.saturating_duration_since(t_first);
    let rate = (a.events - 1) as f64 / window.as_secs_f64().max(1e-3);
    let cpu_tp = per_event(cpu_first, cpu_last, a.events);
    let since_spawn = per_event(cpu_spawn, cpu_last, a.events);
    println!(
        "throughput: {} events, first to last visible on Kafka {:.2} s = {rate:.0} events/s; \
         publisher start to first {:.2} s, to last {:.2} s = {:.0} events/s",
        a.events,
        window.as_secs_f64(),
        t_first.saturating_duration_since(spawned).as_secs_f64(),
        t_last.saturating_duration_since(spawned).as_secs_f64(),
        a.events as f64 / t_last.saturating_duration_since(spawned).as_secs_f64()
    );
    println!("throughput: {}", cpu_text(cpu_tp));
    println!("throughput, from the publisher's start: {}", cpu_text(since_spawn));

    // 3. commit -> visible at a fixed rate.
    let lag_rate = a.lag_rate.unwrap_or((rate / 2.0) as u64).max(10);
    let cpu_lag0 = cpu_now(*pids.lock().unwrap());
    let (commits, behind) = paced(&pool, lag_rate, a.lag_secs).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && {
        let s = seen.lock().unwrap();
        commits.iter().any(|(id, _)| !s.first.contains_key(id))
    } {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu_lag1 = cpu_now(*pids.lock().unwrap());
    let mut lags: Vec<Duration> = {
        let s = seen.lock().unwrap();
        commits
            .iter()
            .filter_map(|(id, at)| s.first.get(id).map(|v| v.saturating_duration_since(*at)))
            .collect()
    };
    lags.sort();
    let cpu_lag = per_event(cpu_lag0, cpu_lag1, commits.len());
    println!(
        "lag:        {} of {} events at {lag_rate} events/s for {} s, commit -> visible on Kafka p50 {:.1} ms, \
         p99 {:.1} ms, max {:.1} ms (writers at most {:.1} ms behind schedule)",
        lags.len(),
        commits.len(),
        a.lag_secs,
        ms(percentile(&lags, 0.50)),
        ms(percentile(&lags, 0.99)),
        ms(lags.last().copied().unwrap_or_default()),
        ms(behind)
    );
    println!("lag:        {} (includes the writes)", cpu_text(cpu_lag));

    // 4. stop, check.
    stop_publisher(child);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    reader.await.expect("reader");
    if a.system == "debezium" {
        let dropped = sqlx::query("SELECT pg_drop_replication_slot($1)").bind(&a.slot).execute(&pool).await;
        if let Err(e) = dropped {
            eprintln!("outbox_peer_bench: cannot drop the slot {}: {e}", a.slot);
        }
    }
    let s = seen.lock().unwrap();
    let total = a.events + commits.len();
    let ok = s.first.len() == total && s.out_of_order == 0 && s.malformed == 0;
    println!("record:     {}", s.sample.as_deref().unwrap_or("(none)"));
    println!(
        "check:      {}/{total} events seen, {} messages, {} duplicates, {} malformed, {} keys, \
         out-of-order {} {:?}: {}",
        s.first.len(),
        s.messages,
        s.duplicates,
        s.malformed,
        s.last_n.len(),
        s.out_of_order,
        s.out_of_order_samples,
        if ok { "OK" } else { "FAILED" }
    );
    println!(
        "RESULT system={} events={} events_per_s={rate:.0} start_to_last_s={:.2} lag_rate={lag_rate} \
         lag_p50_ms={:.1} lag_p99_ms={:.1} cpu_publisher_us={:.1} cpu_postgres_us={:.1} cpu_broker_us={:.1} \
         cpu_sum_us={:.1} cpu_machine_us={:.1} lag_cpu_sum_us={:.1} lag_cpu_machine_us={:.1} \
         duplicates={} out_of_order={} seen={}/{total} check={}",
        a.system,
        a.events,
        t_last.saturating_duration_since(spawned).as_secs_f64(),
        ms(percentile(&lags, 0.50)),
        ms(percentile(&lags, 0.99)),
        cpu_tp[0],
        cpu_tp[1],
        cpu_tp[2],
        cpu_tp[3],
        cpu_tp[4],
        cpu_lag[3],
        cpu_lag[4],
        s.duplicates,
        s.out_of_order,
        s.first.len(),
        if ok { "OK" } else { "FAILED" }
    );
    ok
}

/// The relay as a process of its own, as relay_bench runs it (one relay, 500 heads per
/// batch, 100 ms fallback poll, the rest RelaySettings' defaults), until SIGTERM.
async fn serve_relay(a: Args) {
    let kafka = kafka_settings(&a);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&a.database_url)
        .await
        .expect("connect");
    let settings = RelaySettings {
        service: "bench".into(),
        poll_interval_ms: 100,
        batch_size: 500,
        ..Default::default()
    };
    let token = CancellationToken::new();
    let relay = tokio::spawn(Relay::new(pool, &kafka, settings).expect("relay").run(token.clone()));
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    token.cancel();
    let _ = relay.await;
}

#[tokio::main]
async fn main() {
    let mut argv = std::env::args().skip(1);
    let mode = argv.next().unwrap_or_default();
    let args = match parse_args(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("outbox_peer_bench: {e}");
            std::process::exit(2);
        }
    };
    match mode.as_str() {
        "run" if matches!(args.system.as_str(), "relay" | "debezium") => {
            if !run(args).await {
                std::process::exit(1);
            }
        }
        "serve-relay" => serve_relay(args).await,
        _ => {
            eprintln!(
                "usage: outbox_peer_bench run --system relay|debezium ... | serve-relay ... (see the source)"
            );
            std::process::exit(2);
        }
    }
}
