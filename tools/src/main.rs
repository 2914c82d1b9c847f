//! `sagaworks-tools seed|load|check`: see `--help`, the crate docs and scripts/load, scripts/chaos.

use clap::Parser;
use sagaworks_config::KafkaSettings;
use sagaworks_mtls::dev_ca::DevCa;
use sagaworks_tools::check::coverage::{Kill, Minimums};
use sagaworks_tools::check::{self, Verdict};
use sagaworks_tools::cli::{CheckArgs, Cli, Command, GatewayArgs, LedgerArgs, LoadArgs, SeedArgs};
use sagaworks_tools::cpu::{CpuTimes, CpuUsage};
use sagaworks_tools::load;
use sagaworks_tools::open_loop::{self, StepReport};
use sagaworks_tools::pg::{self, Databases};
use sagaworks_tools::processes::ProcessCpu;
use sagaworks_tools::{Api, Fixture, Orders, ToolError};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The gateway client of `seed` and `load`.
fn api(gateway: &GatewayArgs) -> Result<Api, ToolError> {
    Api::new(&gateway.api, gateway.tokens()?, Duration::from_secs(30))
}

/// Where `load` sends its orders (`--target`): the gateway, or a peer (Restate, Temporal).
fn orders(args: &LoadArgs) -> Result<Orders, ToolError> {
    Orders::new(&args.target, api(&args.gateway)?, Duration::from_secs(30))
}

/// The commit counter's line: for the Restate peer only the participants' commits (Restate
/// keeps its journal and the orders in its own store, not in PostgreSQL).
fn commits_note(args: &LoadArgs) -> &'static str {
    match args.target {
        sagaworks_tools::Target::Gateway => "",
        sagaworks_tools::Target::Restate { .. } => {
            " [inventory and payment only: Restate's journal and state are not in PostgreSQL]"
        }
        sagaworks_tools::Target::Temporal { .. } => {
            " [inventory and payment only: Temporal's history is in its own SQLite file, not in PostgreSQL]"
        }
    }
}

/// A token that SIGTERM cancels.
fn cancelled_on_sigterm() -> Result<CancellationToken, ToolError> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| ToolError::Usage(format!("cannot listen for SIGTERM: {e}")))?;
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            term.recv().await;
            stop.cancel();
        }
    });
    Ok(stop)
}

/// Reads a file given by a flag.
fn read(path: &Path) -> Result<String, ToolError> {
    std::fs::read_to_string(path).map_err(|source| ToolError::Io { path: path.display().to_string(), source })
}

async fn ledger(args: LedgerArgs) -> Result<ExitCode, ToolError> {
    let dbs = Databases::connect(&args.pg_admin, &args.db_prefix, &args.pg_servers).await?;
    for (service, pool) in dbs.all() {
        sagaworks_outbox::ledger::install(pool).await?;
        println!("outbox ledger installed on {}_{service}", args.db_prefix);
    }
    Ok(ExitCode::SUCCESS)
}

async fn seed(args: SeedArgs) -> Result<ExitCode, ToolError> {
    let api = api(&args.gateway)?;
    let out = &args.out;
    let plan = args.plan();
    let fixture = Fixture::seed(&api, &plan).await?;
    fixture.save(out)?;
    println!(
        "seeded {} products ({} units each) and {} customers ({} with {} cents, the others {} cents) -> {}",
        plan.products,
        plan.stock,
        plan.customers,
        plan.poor_customers.min(plan.customers),
        plan.poor_credit_cents,
        plan.credit_cents,
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The server's commits since `before`, read after pg_stat_database's flush
/// (about once a second).
async fn commits_since(admin: &sqlx::PgPool, before: i64) -> Result<i64, ToolError> {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(pg::server_commits(admin).await? - before)
}

/// Writes the accepted orders' ids, one a line, for `check --accepted`.
fn write_accepted<'a>(
    path: &Path,
    accepted: impl IntoIterator<Item = &'a (String, String)>,
) -> Result<(), ToolError> {
    let ids: String = accepted.into_iter().map(|(id, _)| format!("{id}\n")).collect();
    std::fs::write(path, ids).map_err(|source| ToolError::Io { path: path.display().to_string(), source })
}

async fn run_load(args: LoadArgs) -> Result<ExitCode, ToolError> {
    if args.rate.is_some() || args.sweep.is_some() {
        return run_open_load(args).await;
    }
    let orders = Arc::new(orders(&args)?);
    let fixture = Arc::new(Fixture::load(&args.fixture)?);
    let plan = args.plan();

    let admin = pg::connect(&args.pg_admin, "postgres").await?;
    let commits_before = pg::server_commits(&admin).await?;
    let by_db_before = pg::commits_by_database(&admin).await?;
    let cpu_before = CpuTimes::read();
    let procs_before = ProcessCpu::read();
    // SIGTERM ends the run early, with its report (the chaos script stops
    // the load once its faults are done).
    let stop = cancelled_on_sigterm()?;
    let mut report = load::run(orders.clone(), fixture, plan.clone(), stop).await?;
    let cpu = cpu_before.zip(CpuTimes::read()).map(|(before, after)| after.since(&before));
    let by_process = ProcessCpu::read().since(&procs_before);
    let commits = commits_since(&admin, commits_before).await?;
    let by_db = pg::commits_by_database(&admin).await?;
    if let Some(path) = &args.accepted_out {
        write_accepted(path, &report.accepted)?;
    }
    let secs = report.elapsed.as_secs_f64();
    let rate = report.sagas_per_sec();
    let ms = |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3));
    println!(
        "load: {secs:.1} s, {} closed-loop workers, up to {} lines per order, target {}",
        plan.concurrency,
        plan.lines,
        args.target.name()
    );
    println!(
        "  accepted {} (CONFIRMED {}, CANCELLED {}, still PENDING {}); rejected {:?}; transport failures {:?}",
        report.accepted.len(),
        report.count("CONFIRMED"),
        report.count("CANCELLED"),
        report.count("PENDING"),
        report.rejected,
        report.failed
    );
    print_resent(&orders);
    println!("  completed sagas/s: {rate:.1}");
    let lat = &mut report.completed_latency;
    println!(
        "  saga latency ({}): p50 {}  p95 {}  p99 {}  max {}",
        args.target.name(),
        ms(lat.percentile(50.0)),
        ms(lat.percentile(95.0)),
        ms(lat.percentile(99.0)),
        ms(lat.percentile(100.0))
    );
    let completed = report.completed().max(1) as f64;
    println!(
        "  postgres commits during the run: {commits} ({:.0}/s, {:.1} per completed saga){}",
        commits as f64 / secs,
        commits as f64 / completed,
        commits_note(&args)
    );
    if let Some(cpu) = cpu {
        println!(
            "  machine CPU during the run: {:.0}% of {} cores busy; {:.2} ms of CPU per completed saga (every process, this generator too)",
            100.0 * cpu.busy_fraction,
            cpu.cores,
            1e3 * cpu.busy_secs / completed
        );
    }
    // Where it went: the capacity model's inputs (docs/performance.md).
    let per_saga = |secs: f64| format!("{:.2}", 1e3 * secs / completed);
    let groups: Vec<String> = by_process.iter().map(|(g, s)| format!("{g} {}", per_saga(*s))).collect();
    println!("  CPU ms per completed saga by process: {}", groups.join(", "));
    let dbs: Vec<String> = by_db
        .iter()
        .filter_map(|(db, n)| {
            // Databases the run did not use (a monitoring query's commit) are left out.
            let per = (n - by_db_before.get(db).copied().unwrap_or(0)) as f64 / completed;
            (per >= 0.01).then(|| format!("{db} {per:.2}"))
        })
        .collect();
    println!("  commits per completed saga by database: {}", dbs.join(", "));
    if let Some(tps) = args.commit_ceiling {
        println!(
            "  commit ceiling (pgbench, same server): {tps:.0} tps; sagas/s = {:.1}% of it; commit rate = {:.0}% of it",
            100.0 * rate / tps,
            100.0 * commits as f64 / secs / tps
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// How many orders went out twice (`Orders::place_order`), when any did.
fn print_resent(orders: &Orders) {
    let resent = orders.resent();
    if resent > 0 {
        println!("  sent again after their connection ended unanswered (same Idempotency-Key): {resent}");
    }
}

/// One open-loop step as a line: offered and achieved rate, latency quantiles, errors.
fn print_step(step: &StepReport, cpu: Option<CpuUsage>, missed: Option<&str>) {
    let ms = |q: f64| step.quantile(q).map_or("-".to_string(), |d| format!("{:.1}", d.as_secs_f64() * 1e3));
    let cpu =
        cpu.map_or("-".to_string(), |c| format!("{:.2}", 1e3 * c.busy_secs / step.completed().max(1) as f64));
    println!(
        "  {:>7.1} {:>7} {:>9.1} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8} {:>7}  {}{}",
        step.rate,
        step.sent,
        step.throughput(),
        ms(0.5),
        ms(0.99),
        ms(0.999),
        ms(1.0),
        step.without_saga(),
        step.waited_for_slot,
        cpu,
        if step.rejected.is_empty() && step.failed.is_empty() {
            String::new()
        } else {
            format!("rejected {:?} failed {:?} ", step.rejected, step.failed)
        },
        missed.map_or(String::new(), |m| format!("MISSED: {m}")),
    );
}

/// `load --rate` / `load --sweep`: open-loop steps, one line each, then the knee.
async fn run_open_load(args: LoadArgs) -> Result<ExitCode, ToolError> {
    let orders = Arc::new(orders(&args)?);
    let fixture = Arc::new(Fixture::load(&args.fixture)?);
    let plan = args.plan();
    load::check_plan(&fixture, &plan)?;
    let send = || {
        let (customer, items) = load::random_order(&mut rand::rng(), &fixture, &plan);
        let orders = Arc::clone(&orders);
        async move { load::place(&orders, &customer, &items).await }
    };
    let rates = match (args.rate, args.sweep) {
        (Some(rate), _) => vec![rate],
        (None, Some(s)) => open_loop::rates(s.from, s.to, s.step),
        (None, None) => unreachable!("run_load calls this with --rate or --sweep"),
    };
    let bound = args.bound();
    let admin = pg::connect(&args.pg_admin, "postgres").await?;
    let commits_before = pg::server_commits(&admin).await?;
    println!(
        "open-loop load: {} s per rate, up to {} in flight, kept up with: p99 <= {} ms and <= {} % without a saga, target {}",
        args.duration_secs,
        args.max_in_flight,
        args.p99_bound_ms,
        args.max_error_percent,
        args.target.name()
    );
    println!(
        "  {:>7} {:>7} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8} {:>7}",
        "rate/s", "sent", "sagas/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "no saga", "waited", "CPU ms"
    );
    let mut last_cpu = CpuTimes::read();
    // SIGTERM ends the run early, with its report (scripts/test-k8s stops the
    // load once its rolling restarts are done).
    let stop = cancelled_on_sigterm()?;
    let (steps, knee) =
        open_loop::sweep(&rates, &args.open_plan(rates[0]), bound, send, &stop, |step, missed| {
            let now = CpuTimes::read();
            let cpu = last_cpu.zip(now).map(|(before, after)| after.since(&before));
            last_cpu = now;
            print_step(step, cpu, missed);
        })
        .await;
    let commits = commits_since(&admin, commits_before).await?;
    let completed: u64 = steps.iter().map(StepReport::completed).sum();
    print_resent(&orders);
    println!(
        "  (CPU ms: CPU of every process on the machine per completed saga; no saga: requests answered without a \
         finished saga: rejected, failed, or still running when the gateway answered)"
    );
    println!(
        "  postgres commits during the run: {commits} ({:.1} per completed saga){}",
        commits as f64 / completed.max(1) as f64,
        commits_note(&args)
    );
    match (knee, args.sweep) {
        (Some(knee), Some(_)) => println!(
            "knee: {knee} orders/s (the highest rate tried with p99 <= {} ms and <= {} % errors)",
            args.p99_bound_ms, args.max_error_percent
        ),
        (None, Some(_)) => println!("knee: below the first rate tried ({} orders/s)", rates[0]),
        _ => {}
    }
    if let Some(path) = &args.accepted_out {
        write_accepted(path, steps.iter().flat_map(|s| &s.accepted))?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_check(args: CheckArgs) -> Result<ExitCode, ToolError> {
    let fixture = Fixture::load(&args.fixture)?;
    let accepted: Vec<String> = match &args.accepted {
        None => Vec::new(),
        Some(path) => {
            read(path)?.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
        }
    };
    let settle = Duration::from_secs(args.settle_secs);
    let kafka_timeout = Duration::from_secs(args.kafka_timeout_secs);
    let kills = match &args.kills {
        None => Vec::new(),
        Some(path) => Kill::parse(&read(path)?)?,
    };
    let minimums = Minimums {
        accepted: args.min_accepted,
        confirmed: args.min_confirmed,
        cancelled: args.min_cancelled,
        resumed: args.min_resumed,
        kills_under_load: args.min_kills_under_load,
    };

    let dbs = Databases::connect(&args.pg_admin, &args.db_prefix, &args.pg_servers).await?;
    let customers = check::uuids("fixture customer", fixture.customers.iter().map(|c| c.id.as_str()))?;
    let accepted = check::uuids("accepted order", accepted.iter().map(String::as_str))?;
    let mut verdicts: Vec<Verdict> = Vec::new();
    let mut report = |v: Verdict| {
        println!("{v}");
        verdicts.push(v);
    };
    report(check::orders::terminal(&dbs.order, &customers, &accepted, settle).await?);
    report(check::stock::conserved(&dbs, &fixture.products, &customers, settle).await?);
    report(check::money::balanced(&dbs.order, &dbs.payment, &fixture.customers).await?);
    if let Some(brokers) = args.brokers {
        let mut kafka = KafkaSettings { brokers, topic_prefix: args.topic_prefix, ..Default::default() };
        if let Some(user) = args.kafka_user {
            kafka.security_protocol = sagaworks_config::KafkaSecurity::SaslSsl;
            kafka.sasl_username = user;
            kafka.sasl_password = args.kafka_password.unwrap_or_default();
            kafka.ssl_ca_file = args.kafka_ca_file.unwrap_or_default();
        }
        report(check::events::drained(&dbs, settle).await?);
        report(check::events::exactly_once(&dbs, &kafka, &kills, kafka_timeout).await?);
    }
    if !kills.is_empty() || minimums != Minimums::default() {
        report(check::coverage::minimums(&dbs.order, &accepted, &kills, &minimums).await?);
    }
    let failed = verdicts.iter().filter(|v| !v.ok).count();
    println!("invariants: {} checked, {failed} failed", verdicts.len());
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The name `dev-certs` issues Kafka's nodes' certificate for, from a CA of their own.
const KAFKA_NODES: &str = "kafka";

fn dev_certs(args: &sagaworks_tools::cli::DevCertsArgs) -> Result<ExitCode, ToolError> {
    if let Some(bad) = args.services.iter().find(|s| {
        !s.starts_with(|c: char| c.is_ascii_lowercase())
            || !s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    }) {
        return Err(ToolError::Usage(format!("{bad:?} is not a service name ([a-z][a-z0-9]*)")));
    }
    let ca = DevCa::new("sagaworks development CA").map_err(|e| ToolError::Usage(e.to_string()))?;
    let (kafka, services): (Vec<&str>, Vec<&str>) =
        args.services.iter().map(String::as_str).partition(|name| *name == KAFKA_NODES);
    let unwritable =
        |e: std::io::Error| ToolError::Usage(format!("cannot write {}: {e}", args.dir.display()));
    ca.write(&args.dir, &services, &args.trust_domain).map_err(unwritable)?;
    if services.is_empty() {
        println!("wrote a development CA to {}", args.dir.display());
    } else {
        println!(
            "wrote a development CA and certificates for {} to {}",
            services.join(", "),
            args.dir.display()
        );
    }
    if !kafka.is_empty() {
        // Kafka's nodes get a CA of their own: CN=kafka is a super user of the controller
        // listener, which trusts that CA only, never the services' one.
        let kafka_ca =
            DevCa::new("sagaworks development Kafka CA").map_err(|e| ToolError::Usage(e.to_string()))?;
        kafka_ca.write_nodes(&args.dir, KAFKA_NODES).map_err(unwritable)?;
        println!("wrote a Kafka CA and the Kafka nodes' certificate (CN=kafka) to {}", args.dir.display());
    }
    Ok(ExitCode::SUCCESS)
}

#[tokio::main]
async fn main() -> ExitCode {
    // Usage errors (and --help, --version) exit here: 2 with clap's message, or 0.
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Seed(args) => seed(args).await,
        Command::Load(args) => run_load(args).await,
        Command::Check(args) => run_check(args).await,
        Command::Ledger(args) => ledger(args).await,
        Command::DevCerts(args) => dev_certs(&args),
    };
    result.unwrap_or_else(|e| {
        eprintln!("sagaworks-tools: {e}");
        ExitCode::from(2)
    })
}
