//! The command line of `sagaworks-tools` (clap derive types). Run
//! `sagaworks-tools help <command>` (or `<command> --help`) for each
//! command's flags and an example; scripts/load and scripts/chaos show them
//! in use.

use crate::fixture::SeedPlan;
use crate::load::LoadPlan;
use crate::open_loop::{Bound, OpenPlan};
use crate::pg::{Databases, PgServer};
use crate::{Target, Tokens, ToolError};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// The gateway `seed` and `load` talk to unless `--api` says otherwise.
pub const DEFAULT_API: &str = "http://127.0.0.1:8080";
/// The PostgreSQL server (any database on it) `load` and `check` connect to.
pub const DEFAULT_PG: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The after-text of the top-level `--help`: the exit codes.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  1  check: an invariant failed
  2  usage error (bad flags, bad fixture or kills file), or the run failed (API, database, Kafka, files)";

/// Seed data, generate load and check the invariants of a running sagaworks system.
///
/// `seed` creates products and customers through the gateway and saves them as a
/// fixture; `load` places orders for the fixture's customers with closed-loop
/// workers and reports throughput and saga latency; `check` verifies, after the
/// load stopped, that every order settled, stock and money add up and every event
/// reached Kafka exactly once. scripts/load and scripts/chaos run all three.
#[derive(Debug, Parser)]
#[command(name = "sagaworks-tools", version, after_help = EXIT_CODES, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create products and customers through the gateway; save them as a fixture (JSON).
    #[command(after_long_help = "\
The first --poor-customers customers get only --poor-credit-cents, so their orders
soon fail the charge and take the compensation path.

Examples:
  sagaworks-tools seed --out fixture.json
  SW_JWT_SECRET=dev-only-insecure-jwt-secret \\
      sagaworks-tools seed --out fixture.json --products 40 --customers 40 --poor-customers 8 --poor-credit-cents 30000")]
    Seed(SeedArgs),

    /// Place orders (POST /v1/orders), closed or open loop; report sagas/s, latency, commits, CPU.
    #[command(after_long_help = "\
Closed loop (the default): each of --concurrency workers places an order (a random
customer of the fixture, 1 to --lines random products, 1 to --max-quantity units each)
and waits for the answer before the next.

Open loop (--rate or --sweep): orders arrive at a fixed rate whatever the answers do,
and each latency counts from the order's intended send time, so queueing shows
(no coordinated omission); p50/p99/p99.9 come from an HdrHistogram. --sweep runs rate
after rate and stops at the first that misses --p99-bound-ms or --max-error-percent;
the last rate that met both is the knee.

The PostgreSQL server's commit counter (pg_stat_database) is read before and after.

--target restate=URL sends the same orders to the Restate peer of scripts/bench-peer
(bench/restate-peer: the same saga orchestrated by Restate) instead of the gateway:
{order_id} in the URL becomes a fresh order id; 200 with {order_id, status} is a
placed order, any other status a rejection. --target temporal=URL does the same with
the Temporal peer's HTTP front (bench/temporal-peer), which answers alike.

Examples:
  sagaworks-tools load --fixture fixture.json --concurrency 64 --duration-secs 60
  sagaworks-tools load --fixture fixture.json --accepted-out accepted.txt --commit-ceiling 5200
  sagaworks-tools load --fixture fixture.json --rate 200 --duration-secs 30
  sagaworks-tools load --fixture fixture.json --sweep 100:600:50 --duration-secs 20 --p99-bound-ms 100
  sagaworks-tools load --fixture fixture.json --rate 150 \\
      --target 'restate=http://127.0.0.1:18080/OrderSaga/{order_id}/place'")]
    Load(LoadArgs),

    /// Check the invariants after a run; exits 1 when one fails.
    #[command(after_long_help = "\
Always checked: orders terminal, stock conserved, money balanced. With --brokers also
that every outbox row was published and every event is on Kafka exactly once (after
dedup). With --kills or any --min-* also that the run did enough to mean something.

Examples:
  sagaworks-tools check --fixture fixture.json --accepted accepted.txt
  sagaworks-tools check --fixture fixture.json --accepted accepted.txt --settle-secs 120 \\
      --brokers 127.0.0.1:9092 --kills kills.txt --min-accepted 100 --min-cancelled 1")]
    Check(CheckArgs),

    /// Install the outbox ledger on the service databases, before a run that `check` verifies.
    #[command(after_long_help = "\
The relay deletes an outbox row once the broker acked it, so after a run the outbox no
longer says what was written. The ledger (sagaworks_outbox::ledger) copies every row
written from now on, in the writer's transaction, into outbox_ledger; `check --brokers`
compares it with Kafka and fails on a database without it. Install it right after the
services' migrations ran and before anything writes events: a verification run's
set-up, never production (every write pays a second insert).

Examples:
  sagaworks-tools ledger --db-prefix sagaworks_chaos")]
    Ledger(LedgerArgs),

    /// Write a development CA and a certificate per service (mutual TLS between them), and Kafka's.
    #[command(after_long_help = "\
Writes <dir>/ca.pem and, per service, <dir>/<service>.pem and <dir>/<service>-key.pem:
the identity spiffe://<trust domain>/<service>, DNS names <service> and localhost, IP
127.0.0.1. A service reads them with APP_TLS__CA_FILE, APP_TLS__CERT_FILE and
APP_TLS__KEY_FILE.

The name `kafka` stands for Apache Kafka's nodes, whose certificate comes from a CA of
their own, never from ca.pem: <dir>/kafka-ca.pem (that CA), <dir>/kafka.pem and
<dir>/kafka-key.pem (CN=kafka, the nodes' super user on their controller listener, which
trusts kafka-ca.pem only; DNS names kafka and localhost, IP 127.0.0.1; no SPIFFE
identity; PKCS#8 key). Kafka's clients verify the broker with kafka-ca.pem
(APP_KAFKA__SSL_CA_FILE), the services their peers with ca.pem.

For development and tests only: the CAs' keys are not kept, so the set is made again as
a whole (scripts/dev-up does when a certificate is missing).

Examples:
  sagaworks-tools dev-certs .dev/certs order inventory payment gateway")]
    DevCerts(DevCertsArgs),
}

#[derive(Debug, Clone, Args)]
pub struct DevCertsArgs {
    /// Where to write the files (created; existing files are replaced).
    pub dir: PathBuf,
    /// The services to issue certificates for; `kafka`: Kafka's nodes (their own CA).
    #[arg(required = true)]
    pub services: Vec<String>,
    /// The SPIFFE trust domain of the identities: the services' `tls.trust_domain`
    /// (APP_TLS__TRUST_DOMAIN), which they verify their peers against.
    #[arg(long, env = "APP_TLS__TRUST_DOMAIN", default_value = "sagaworks")]
    pub trust_domain: String,
}

/// The gateway and its credentials (`seed`, `load`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Gateway")]
pub struct GatewayArgs {
    /// The gateway's base URL (http or https).
    #[arg(long, value_name = "URL", default_value = DEFAULT_API, value_parser = parse_api)]
    pub api: String,

    /// One bearer token for every call (wins over --jwt-secret).
    #[arg(long, value_name = "TOKEN", env = "SW_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// The gateway's HS256 secret: mints an admin token for seeding and a token per customer for its orders.
    #[arg(long, value_name = "SECRET", env = "SW_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,

    /// `iss` of minted tokens, if the gateway requires one.
    #[arg(long, value_name = "ISS", env = "SW_JWT_ISSUER", hide_env_values = true)]
    pub jwt_issuer: Option<String>,

    /// `aud` of minted tokens, if the gateway requires one.
    #[arg(long, value_name = "AUD", env = "SW_JWT_AUDIENCE", hide_env_values = true)]
    pub jwt_audience: Option<String>,
}

impl GatewayArgs {
    /// The bearer tokens: `--token`, else minted with `--jwt-secret`, else none.
    pub fn tokens(&self) -> Result<Tokens, ToolError> {
        Tokens::from_parts(
            self.token.clone(),
            self.jwt_secret.clone(),
            self.jwt_issuer.clone(),
            self.jwt_audience.clone(),
        )
    }
}

#[derive(Debug, Clone, Args)]
#[command(allow_negative_numbers = true)]
pub struct SeedArgs {
    /// Write the fixture (the created products and customers) to this file.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,

    /// How many products to create.
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub products: usize,

    /// How many customers to create.
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub customers: usize,

    /// Initial stock of each product, in units.
    #[arg(long, value_name = "UNITS", default_value_t = 1_000_000, value_parser = clap::value_parser!(i64).range(0..))]
    pub stock: i64,

    /// Initial credit of each customer (but the poor ones), in cents.
    #[arg(long, value_name = "C", default_value_t = 100_000_000_000, value_parser = clap::value_parser!(i64).range(0..))]
    pub credit_cents: i64,

    /// How many of the customers get only --poor-credit-cents.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub poor_customers: usize,

    /// Initial credit of each poor customer, in cents.
    #[arg(long, value_name = "C", default_value_t = 20_000, value_parser = clap::value_parser!(i64).range(0..))]
    pub poor_credit_cents: i64,

    #[command(flatten)]
    pub gateway: GatewayArgs,
}

impl SeedArgs {
    pub fn plan(&self) -> SeedPlan {
        SeedPlan {
            products: self.products,
            customers: self.customers,
            stock: self.stock,
            credit_cents: self.credit_cents,
            poor_customers: self.poor_customers,
            poor_credit_cents: self.poor_credit_cents,
        }
    }
}

#[derive(Debug, Clone, Args)]
#[command(allow_negative_numbers = true)]
pub struct LoadArgs {
    /// The fixture `seed` wrote.
    #[arg(long, value_name = "FILE")]
    pub fixture: PathBuf,

    /// How many closed-loop workers (orders in flight).
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub concurrency: u64,

    /// How long to place orders, in seconds.
    #[arg(long, value_name = "S", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub duration_secs: u64,

    /// Up to this many lines (distinct random products) per order.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub lines: u64,

    /// Up to this many units per line.
    #[arg(long, value_name = "Q", default_value_t = 3, value_parser = clap::value_parser!(i64).range(1..))]
    pub max_quantity: i64,

    /// Write the ids of the accepted orders to this file, one a line (for `check --accepted`).
    #[arg(long, value_name = "FILE")]
    pub accepted_out: Option<PathBuf>,

    /// The PostgreSQL server whose commit counter is read, as a URL.
    #[arg(long, value_name = "URL", default_value = DEFAULT_PG)]
    pub pg_admin: String,

    /// The server's commit ceiling in transactions/s (e.g. from pgbench): reports sagas/s and commits/s against it.
    #[arg(long, value_name = "TPS", value_parser = parse_positive)]
    pub commit_ceiling: Option<f64>,

    /// Open loop: this many orders a second for --duration-secs (instead of closed-loop workers).
    #[arg(long, value_name = "PER_SEC", value_parser = parse_positive, conflicts_with_all = ["sweep", "concurrency"])]
    pub rate: Option<f64>,

    /// Open loop, rate after rate: FROM:TO:STEP orders a second, each for --duration-secs, up to the knee.
    #[arg(long, value_name = "FROM:TO:STEP", value_parser = parse_sweep, conflicts_with = "concurrency")]
    pub sweep: Option<Sweep>,

    /// Open loop: a rate is kept up with while the p99 of completed sagas stays at or under this.
    #[arg(long, value_name = "MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub p99_bound_ms: u64,

    /// Open loop: ... and at most this share of the requests (in %) is answered without a finished saga (rejected, failed, still running).
    #[arg(long, value_name = "PERCENT", default_value_t = 1.0, value_parser = parse_percent)]
    pub max_error_percent: f64,

    /// Open loop: at most this many orders in flight; a later one waits for a slot (and the wait counts).
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_in_flight: u64,

    /// Where the orders go: `gateway` (POST /v1/orders at --api), `restate=URL` (the Restate peer's handler) or `temporal=URL` (the Temporal peer's front); {order_id} in a URL becomes the order id.
    #[arg(long, value_name = "gateway|restate=URL|temporal=URL", default_value = "gateway")]
    pub target: Target,

    #[command(flatten)]
    pub gateway: GatewayArgs,
}

/// `--pg-server SERVICE=URL`: SERVICE is one of [`Databases::SERVICES`].
fn parse_pg_server(s: &str) -> Result<PgServer, String> {
    let (service, url) = s.split_once('=').ok_or_else(|| format!("expected SERVICE=URL, got {s:?}"))?;
    if !Databases::SERVICES.contains(&service) {
        return Err(format!("unknown service {service:?}: one of {}", Databases::SERVICES.join(", ")));
    }
    if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
        return Err(format!("{service}'s server is not a postgres:// URL: {url:?}"));
    }
    Ok(PgServer { service: service.to_owned(), url: url.to_owned() })
}

/// `--sweep FROM:TO:STEP`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sweep {
    pub from: f64,
    pub to: f64,
    pub step: f64,
}

fn parse_sweep(s: &str) -> Result<Sweep, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let [from, to, step] = parts[..] else {
        return Err(format!("{s:?} is not FROM:TO:STEP (e.g. 100:600:50)"));
    };
    let (from, to, step) = (parse_positive(from)?, parse_positive(to)?, parse_positive(step)?);
    if to < from {
        return Err(format!("TO ({to}) is below FROM ({from})"));
    }
    Ok(Sweep { from, to, step })
}

fn parse_percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=100.0).contains(&x) => Ok(x),
        Ok(_) => Err("must be from 0 to 100".into()),
        Err(_) => Err(format!("{s:?} is not a number")),
    }
}

impl LoadArgs {
    /// The open-loop plan at `rate`.
    pub fn open_plan(&self, rate: f64) -> OpenPlan {
        OpenPlan {
            rate,
            duration: Duration::from_secs(self.duration_secs),
            max_in_flight: usize::try_from(self.max_in_flight).unwrap_or(usize::MAX),
        }
    }

    /// When an open-loop rate counts as kept up with.
    pub fn bound(&self) -> Bound {
        Bound {
            p99: Duration::from_millis(self.p99_bound_ms),
            max_error_share: self.max_error_percent / 100.0,
        }
    }

    pub fn plan(&self) -> LoadPlan {
        LoadPlan {
            concurrency: usize::try_from(self.concurrency).unwrap_or(usize::MAX),
            duration: Duration::from_secs(self.duration_secs),
            lines: usize::try_from(self.lines).unwrap_or(usize::MAX),
            max_quantity: self.max_quantity,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct LedgerArgs {
    /// The PostgreSQL server of the service databases, as a URL (a role that may create triggers).
    #[arg(long, value_name = "URL", default_value = DEFAULT_PG)]
    pub pg_admin: String,

    /// The server of SERVICE's database when it is not --pg-admin's, as SERVICE=URL (repeatable).
    #[arg(long = "pg-server", value_name = "SERVICE=URL", value_parser = parse_pg_server)]
    pub pg_servers: Vec<PgServer>,

    /// The service databases are <P>_order, <P>_inventory, <P>_payment.
    #[arg(long, value_name = "P", default_value = "sagaworks")]
    pub db_prefix: String,
}

#[derive(Debug, Clone, Args)]
#[command(allow_negative_numbers = true)]
pub struct CheckArgs {
    /// The fixture `seed` wrote (its customers' orders, its products' stock).
    #[arg(long, value_name = "FILE")]
    pub fixture: PathBuf,

    /// Order ids the gateway accepted, one a line (`load --accepted-out`): each must exist and be terminal.
    #[arg(long, value_name = "FILE")]
    pub accepted: Option<PathBuf>,

    /// The PostgreSQL server of the service databases, as a URL.
    #[arg(long, value_name = "URL", default_value = DEFAULT_PG)]
    pub pg_admin: String,

    /// The server of SERVICE's database when it is not --pg-admin's, as SERVICE=URL (repeatable).
    #[arg(long = "pg-server", value_name = "SERVICE=URL", value_parser = parse_pg_server)]
    pub pg_servers: Vec<PgServer>,

    /// The service databases are <P>_order, <P>_inventory, <P>_payment.
    #[arg(long, value_name = "P", default_value = "sagaworks")]
    pub db_prefix: String,

    /// Wait up to this many seconds for sagas to settle and outboxes to drain.
    #[arg(long, value_name = "S", default_value_t = 60)]
    pub settle_secs: u64,

    /// Kafka bootstrap servers: also check the outboxes drained and every event is on Kafka exactly once.
    #[arg(long, value_name = "HOST:PORT", help_heading = "Kafka")]
    pub brokers: Option<String>,

    /// Prefix of the topic names.
    #[arg(long, value_name = "P", default_value = "sagaworks", help_heading = "Kafka")]
    pub topic_prefix: String,

    /// A SASL_SSL broker: this SCRAM-SHA-512 user (e.g. `admin` of scripts/kafka's secure mode).
    #[arg(long, value_name = "USER", env = "SW_KAFKA_USER", help_heading = "Kafka")]
    pub kafka_user: Option<String>,

    /// The user's password.
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "SW_KAFKA_PASSWORD",
        hide_env_values = true,
        help_heading = "Kafka"
    )]
    pub kafka_password: Option<String>,

    /// The CA certificate of the broker's (PEM; default: the system's roots).
    #[arg(long, value_name = "FILE", env = "SW_KAFKA_CA_FILE", help_heading = "Kafka")]
    pub kafka_ca_file: Option<String>,

    /// Give up reading the topics after this many seconds.
    #[arg(long, value_name = "S", default_value_t = 60, help_heading = "Kafka")]
    pub kafka_timeout_secs: u64,

    /// The process kills of a chaos run, one a line: `target how killed_at restarted_at load_running`.
    #[arg(long, value_name = "FILE", help_heading = "Coverage")]
    pub kills: Option<PathBuf>,

    /// Fail unless at least this many orders were accepted.
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Coverage")]
    pub min_accepted: u64,

    /// Fail unless at least this many accepted orders ended CONFIRMED.
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Coverage")]
    pub min_confirmed: u64,

    /// Fail unless at least this many accepted orders ended CANCELLED.
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Coverage")]
    pub min_cancelled: u64,

    /// Fail unless at least this many sagas were resumed after a kill of the order service.
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Coverage")]
    pub min_resumed: u64,

    /// Fail unless at least this many kills landed while the load ran.
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Coverage")]
    pub min_kills_under_load: u64,
}

/// An `http` or `https` base URL with a host (kept as given).
fn parse_api(s: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" if url.has_host() => Ok(s.to_string()),
        _ => Err("must be an http:// or https:// URL with a host".into()),
    }
}

/// A finite number above 0.
fn parse_positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        Ok(_) => Err("must be a number above 0".into()),
        Err(_) => Err(format!("{s:?} is not a number")),
    }
}

/// A share: a number from 0 to 1.
#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from([&["sagaworks-tools"], args].concat()).map(|cli| cli.command)
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_those_of_the_scripts() {
        let Command::Seed(seed) = parse(&["seed", "--out", "f.json"]).unwrap() else { panic!("not seed") };
        assert_eq!(seed.out, PathBuf::from("f.json"));
        assert_eq!(seed.gateway.api, DEFAULT_API);
        let plan = seed.plan();
        assert_eq!((plan.products, plan.customers, plan.stock), (200, 200, 1_000_000));
        assert_eq!(
            (plan.credit_cents, plan.poor_customers, plan.poor_credit_cents),
            (100_000_000_000, 0, 20_000)
        );

        let Command::Load(load) = parse(&["load", "--fixture", "f.json"]).unwrap() else {
            panic!("not load")
        };
        let plan = load.plan();
        assert_eq!(
            (plan.concurrency, plan.duration, plan.lines, plan.max_quantity),
            (32, Duration::from_secs(30), 2, 3)
        );
        assert_eq!(
            (load.accepted_out, load.pg_admin.as_str(), load.commit_ceiling),
            (None, DEFAULT_PG, None)
        );
        assert_eq!(load.target, Target::Gateway);

        let Command::Check(check) = parse(&["check", "--fixture", "f.json"]).unwrap() else {
            panic!("not check")
        };
        assert_eq!((check.db_prefix.as_str(), check.topic_prefix.as_str()), ("sagaworks", "sagaworks"));
        assert_eq!((check.settle_secs, check.kafka_timeout_secs), (60, 60));
        assert_eq!((check.brokers, check.kills, check.accepted), (None, None, None));
        assert_eq!(check.pg_admin, DEFAULT_PG);
        assert_eq!(
            [
                check.min_accepted,
                check.min_confirmed,
                check.min_cancelled,
                check.min_resumed,
                check.min_kills_under_load
            ],
            [0; 5]
        );
    }

    #[test]
    fn the_chaos_check_command_line_parses() {
        let Command::Check(check) = parse(&[
            "check",
            "--fixture",
            "f",
            "--accepted",
            "a",
            "--pg-admin",
            "postgres://x@h/postgres",
            "--db-prefix",
            "sw7",
            "--settle-secs",
            "120",
            "--brokers",
            "127.0.0.1:9092",
            "--topic-prefix",
            "sagaworks",
            "--kills",
            "k",
            "--min-accepted",
            "100",
            "--min-confirmed",
            "10",
            "--min-cancelled",
            "1",
            "--min-resumed",
            "2",
            "--min-kills-under-load",
            "3",
        ])
        .unwrap() else {
            panic!("not check")
        };
        assert_eq!(check.brokers.as_deref(), Some("127.0.0.1:9092"));
        assert_eq!((check.min_kills_under_load, check.settle_secs), (3, 120));
    }

    #[test]
    fn open_loop_flags_make_the_plan_and_the_bound() {
        let Command::Load(load) =
            parse(&["load", "--fixture", "f", "--sweep", "100:600:50", "--p99-bound-ms", "250"]).unwrap()
        else {
            panic!("not load")
        };
        assert_eq!(load.sweep, Some(Sweep { from: 100.0, to: 600.0, step: 50.0 }));
        assert_eq!(load.rate, None);
        let bound = load.bound();
        assert_eq!((bound.p99, bound.max_error_share), (Duration::from_millis(250), 0.01));
        let plan = load.open_plan(300.0);
        assert_eq!((plan.rate, plan.duration, plan.max_in_flight), (300.0, Duration::from_secs(30), 4096));
        let Command::Load(load) = parse(&["load", "--fixture", "f", "--rate", "12.5"]).unwrap() else {
            panic!("not load")
        };
        assert_eq!(load.rate, Some(12.5));
    }

    #[test]
    fn the_target_is_the_gateway_or_a_peer_url() {
        let url = "http://127.0.0.1:18080/OrderSaga/{order_id}/place";
        let target = format!("restate={url}");
        for mode in [&["--concurrency", "8"][..], &["--rate", "150"], &["--sweep", "100:200:50"]] {
            let args = [&["load", "--fixture", "f", "--target", &target][..], mode].concat();
            let Command::Load(load) = parse(&args).unwrap() else { panic!("not load") };
            assert_eq!(load.target, Target::Restate { url: url.into() }, "{mode:?}");
        }
        let Command::Load(load) = parse(&["load", "--fixture", "f", "--target", "gateway"]).unwrap() else {
            panic!("not load")
        };
        assert_eq!(load.target, Target::Gateway);
        assert!(parse(&["load", "--fixture", "f", "--target", "restate"]).is_err());
        assert!(parse(&["load", "--fixture", "f", "--target", "restate=127.0.0.1:18080/x"]).is_err());
        let Command::Load(load) =
            parse(&["load", "--fixture", "f", "--target", "temporal=http://h/x"]).unwrap()
        else {
            panic!("not load")
        };
        assert_eq!(load.target, Target::Temporal { url: "http://h/x".into() });
        assert!(parse(&["load", "--fixture", "f", "--target", "cadence=http://h/x"]).is_err());
        assert!(parse(&["seed", "--out", "f", "--target", "gateway"]).is_err());
    }

    #[test]
    fn each_service_database_may_name_its_own_server() {
        let Command::Check(check) = parse(&[
            "check",
            "--fixture",
            "f",
            "--pg-server",
            "order=postgres://postgres@10.96.0.11:5432/postgres",
            "--pg-server",
            "payment=postgres://postgres@10.96.0.12:5432/postgres",
        ])
        .unwrap() else {
            panic!("not check")
        };
        assert_eq!(
            check.pg_servers,
            [
                PgServer {
                    service: "order".into(),
                    url: "postgres://postgres@10.96.0.11:5432/postgres".into()
                },
                PgServer {
                    service: "payment".into(),
                    url: "postgres://postgres@10.96.0.12:5432/postgres".into()
                },
            ]
        );
        let Command::Ledger(ledger) =
            parse(&["ledger", "--pg-server", "inventory=postgresql://h/postgres"]).unwrap()
        else {
            panic!("not ledger")
        };
        assert_eq!(ledger.pg_servers.len(), 1);
        assert!(parse(&["ledger", "--pg-server", "gateway=postgres://h/postgres"]).is_err());
        assert!(parse(&["ledger", "--pg-server", "order"]).is_err());
        assert!(parse(&["ledger", "--pg-server", "order=http://h"]).is_err());
    }

    #[test]
    fn rejects_values_that_make_no_sense() {
        assert!(parse(&["load", "--fixture", "f", "--concurrency", "0"]).is_err());
        assert!(parse(&["load", "--fixture", "f", "--lines", "0"]).is_err());
        assert!(parse(&["load", "--fixture", "f", "--commit-ceiling", "-3"]).is_err());
        assert!(parse(&["load", "--fixture", "f", "--rate", "0"]).is_err());
        assert!(parse(&["load", "--fixture", "f", "--rate", "10", "--concurrency", "4"]).is_err());
        assert!(parse(&["load", "--fixture", "f", "--rate", "10", "--sweep", "1:2:1"]).is_err());
        assert!(parse(&["load", "--fixture", "f", "--sweep", "100:50:10"]).is_err());
        assert!(parse(&["load", "--fixture", "f", "--sweep", "100:200"]).is_err());
        assert!(
            parse(&["load", "--fixture", "f", "--sweep", "1:2:1", "--max-error-percent", "101"]).is_err()
        );
        assert!(parse(&["seed", "--out", "f", "--api", "127.0.0.1:8080"]).is_err());
        assert!(parse(&["check", "--fixture", "f", "--api", "http://x"]).is_err());
    }
}
