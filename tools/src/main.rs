//! `sagaworks-tools seed|load|check`: see the crate docs and scripts/load, scripts/chaos.

use sagaworks_config::KafkaSettings;
use sagaworks_tools::args::Flags;
use sagaworks_tools::check::coverage::{Kill, Minimums};
use sagaworks_tools::check::events::Required;
use sagaworks_tools::check::{self, Verdict};
use sagaworks_tools::cpu::CpuTimes;
use sagaworks_tools::load::{self, LoadPlan};
use sagaworks_tools::pg::{self, Databases};
use sagaworks_tools::{Api, Fixture, SeedPlan, Tokens, ToolError};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

const USAGE: &str = "usage:
  sagaworks-tools seed  --out FILE [--api URL] [--products N] [--customers N] [--stock UNITS] [--credit-cents C]
                        [--poor-customers N] [--poor-credit-cents C]
  sagaworks-tools load  --fixture FILE [--api URL] [--concurrency N] [--duration-secs S] [--lines N]
                        [--max-quantity Q] [--accepted-out FILE] [--pg-admin URL] [--commit-ceiling TPS]
  sagaworks-tools check --fixture FILE [--accepted FILE] [--pg-admin URL] [--db-prefix P] [--settle-secs S]
                        [--brokers HOST:PORT --topic-prefix P [--kafka-since RFC3339 --min-kafka-share F]]
                        [--kills FILE] [--min-accepted N]
                        [--min-confirmed N] [--min-cancelled N] [--min-resumed N] [--min-kills-under-load N]
Gateway auth: SW_TOKEN (one bearer token for every call), or SW_JWT_SECRET (HS256 secret: mints an admin
token for seeding and a token per customer for its orders; SW_JWT_ISSUER / SW_JWT_AUDIENCE if required).";

const DEFAULT_API: &str = "http://127.0.0.1:8080";
const DEFAULT_PG: &str = "postgres://postgres@127.0.0.1:5432/postgres";

fn api(flags: &mut Flags) -> Result<Api, ToolError> {
    let base: String = flags.or("api", DEFAULT_API.to_string())?;
    Api::new(&base, Tokens::from_env(), Duration::from_secs(30))
}

async fn seed(mut flags: Flags) -> Result<ExitCode, ToolError> {
    let api = api(&mut flags)?;
    let out: PathBuf = flags.required("out")?;
    let plan = SeedPlan {
        products: flags.or("products", 200)?,
        customers: flags.or("customers", 200)?,
        stock: flags.or("stock", 1_000_000)?,
        credit_cents: flags.or("credit-cents", 100_000_000_000)?,
        poor_customers: flags.or("poor-customers", 0)?,
        poor_credit_cents: flags.or("poor-credit-cents", 20_000)?,
    };
    flags.finish()?;
    let fixture = Fixture::seed(&api, &plan).await?;
    fixture.save(&out)?;
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

async fn run_load(mut flags: Flags) -> Result<ExitCode, ToolError> {
    let api = Arc::new(api(&mut flags)?);
    let fixture = Arc::new(Fixture::load(&flags.required::<PathBuf>("fixture")?)?);
    let plan = LoadPlan {
        concurrency: flags.or("concurrency", 32)?,
        duration: Duration::from_secs(flags.or("duration-secs", 30)?),
        lines: flags.or("lines", 2)?,
        max_quantity: flags.or("max-quantity", 3)?,
    };
    let accepted_out: Option<PathBuf> = flags.optional("accepted-out")?;
    let pg_admin: String = flags.or("pg-admin", DEFAULT_PG.to_string())?;
    let ceiling: Option<f64> = flags.optional("commit-ceiling")?;
    flags.finish()?;

    let admin = pg::connect(&pg_admin, "postgres").await?;
    let commits_before = pg::server_commits(&admin).await?;
    let cpu_before = CpuTimes::read();
    let mut report = load::run(api, fixture, plan.clone()).await?;
    let cpu = cpu_before.zip(CpuTimes::read()).map(|(before, after)| after.since(&before));
    // pg_stat_database is flushed about once a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let commits = pg::server_commits(&admin).await? - commits_before;

    if let Some(path) = &accepted_out {
        let ids: String = report.accepted.iter().map(|(id, _)| format!("{id}\n")).collect();
        std::fs::write(path, ids)
            .map_err(|source| ToolError::Io { path: path.display().to_string(), source })?;
    }
    let secs = report.elapsed.as_secs_f64();
    let rate = report.sagas_per_sec();
    let ms = |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3));
    println!(
        "load: {secs:.1} s, {} closed-loop workers, up to {} lines per order",
        plan.concurrency, plan.lines
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
    println!("  completed sagas/s: {rate:.1}");
    let lat = &mut report.completed_latency;
    println!(
        "  saga latency (POST /v1/orders): p50 {}  p95 {}  p99 {}  max {}",
        ms(lat.percentile(50.0)),
        ms(lat.percentile(95.0)),
        ms(lat.percentile(99.0)),
        ms(lat.percentile(100.0))
    );
    let completed = report.completed().max(1) as f64;
    println!(
        "  postgres commits during the run: {commits} ({:.0}/s, {:.1} per completed saga)",
        commits as f64 / secs,
        commits as f64 / completed
    );
    if let Some(cpu) = cpu {
        println!(
            "  machine CPU during the run: {:.0}% of {} cores busy; {:.2} ms of CPU per completed saga (every process, this generator too)",
            100.0 * cpu.busy_fraction,
            cpu.cores,
            1e3 * cpu.busy_secs / completed
        );
    }
    if let Some(tps) = ceiling {
        println!(
            "  commit ceiling (pgbench, same server): {tps:.0} tps; sagas/s = {:.1}% of it; commit rate = {:.0}% of it",
            100.0 * rate / tps,
            100.0 * commits as f64 / secs / tps
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_check(mut flags: Flags) -> Result<ExitCode, ToolError> {
    let fixture = Fixture::load(&flags.required::<PathBuf>("fixture")?)?;
    let accepted = match flags.optional::<PathBuf>("accepted")? {
        None => Vec::new(),
        Some(path) => std::fs::read_to_string(&path)
            .map_err(|source| ToolError::Io { path: path.display().to_string(), source })?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_string())
            .collect(),
    };
    let pg_admin: String = flags.or("pg-admin", DEFAULT_PG.to_string())?;
    let prefix: String = flags.or("db-prefix", "sagaworks".to_string())?;
    let settle = Duration::from_secs(flags.or("settle-secs", 60)?);
    let brokers: Option<String> = flags.optional("brokers")?;
    let topic_prefix: String = flags.or("topic-prefix", "sagaworks".to_string())?;
    let since: Option<chrono::DateTime<chrono::Utc>> = flags.optional("kafka-since")?;
    let min_share: f64 = flags.or("min-kafka-share", 0.0)?;
    let required = match since {
        None => Required::All,
        Some(since) => Required::Since { since, min_share },
    };
    let kafka_timeout = Duration::from_secs(flags.or("kafka-timeout-secs", 60)?);
    let kills = match flags.optional::<PathBuf>("kills")? {
        None => Vec::new(),
        Some(path) => Kill::parse(
            &std::fs::read_to_string(&path)
                .map_err(|source| ToolError::Io { path: path.display().to_string(), source })?,
        )?,
    };
    let minimums = Minimums {
        accepted: flags.or("min-accepted", 0)?,
        confirmed: flags.or("min-confirmed", 0)?,
        cancelled: flags.or("min-cancelled", 0)?,
        resumed: flags.or("min-resumed", 0)?,
        kills_under_load: flags.or("min-kills-under-load", 0)?,
    };
    flags.finish()?;

    let dbs = Databases::connect(&pg_admin, &prefix).await?;
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
    if let Some(brokers) = brokers {
        let kafka = KafkaSettings { brokers, topic_prefix, properties: Default::default() };
        report(check::events::drained(&dbs, settle).await?);
        report(check::events::exactly_once(&dbs, &kafka, required, kafka_timeout).await?);
    }
    if !kills.is_empty() || minimums != Minimums::default() {
        report(check::coverage::minimums(&dbs.order, &accepted, &kills, &minimums).await?);
    }
    let failed = verdicts.iter().filter(|v| !v.ok).count();
    println!("invariants: {} checked, {failed} failed", verdicts.len());
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_default();
    let result = match Flags::parse(args) {
        Err(e) => Err(e),
        Ok(flags) => match command.as_str() {
            "seed" => seed(flags).await,
            "load" => run_load(flags).await,
            "check" => run_check(flags).await,
            _ => Err(ToolError::Usage(format!("unknown command {command:?}"))),
        },
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sagaworks-tools: {e}");
            if matches!(e, ToolError::Usage(_)) {
                eprintln!("{USAGE}");
            }
            ExitCode::from(2)
        }
    }
}
