//! The command line (clap derive types). Every flag can go anywhere after the
//! program name; `--api`, `--token`, `--token-file`, `--json` and `--timeout-secs`
//! apply to every subcommand. Run `sagaworks-admin help <command>` (or `--help`) for
//! each command's flags and examples.

use crate::client::Token;
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use serde_json::Value;
use std::ffi::OsString;
use std::path::PathBuf;

/// The after-text of the top-level `--help`: the exit codes.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  1  the API answered with another error, or could not be reached
  2  usage error (bad flags)
  3  not found (404)
  4  conflict: the action is not valid in this state (409); nothing changed
  5  not authenticated or not allowed (401/403): check the token and its admin role
  6  service unavailable or rate limited (503/429): try again later";

/// The help heading of the flags every command takes.
const GLOBAL: &str = "Global options";

/// Operate sagaworks: find stuck sagas and act on them, inspect and replay dead letters.
///
/// Talks to the gateway's admin REST API with a bearer token that has the
/// `admin` role, so it works against a local stack, docker compose and
/// Kubernetes alike. Errors go to stderr; with --json, stdout gets the API's
/// JSON as it is (pretty-printed), errors included.
#[derive(Debug, Parser)]
#[command(name = "sagaworks-admin", version, after_help = EXIT_CODES, propagate_version = true)]
pub struct Cli {
    /// The gateway's base URL (http or https; a path prefix is kept).
    #[arg(
        long,
        value_name = "URL",
        env = "SAGAWORKS_API",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8080",
        value_parser = parse_api,
        global = true,
        help_heading = GLOBAL
    )]
    pub api: reqwest::Url,

    /// Bearer token with the `admin` role (this, SAGAWORKS_TOKEN or --token-file is required).
    /// On the command line it shows in `ps` and the shell's history: prefer the variable or
    /// --token-file (a warning on stderr says so).
    #[arg(long, value_name = "TOKEN", env = "SAGAWORKS_TOKEN", hide_env_values = true, global = true, help_heading = GLOBAL)]
    pub token: Option<Token>,

    /// Read the bearer token from this file (surrounding whitespace is dropped); wins over
    /// SAGAWORKS_TOKEN.
    #[arg(long, value_name = "PATH", global = true, help_heading = GLOBAL)]
    pub token_file: Option<PathBuf>,

    /// Whether `--token` was given on the command line (not through SAGAWORKS_TOKEN):
    /// set by [`Cli::try_parse_args`].
    #[arg(skip)]
    pub token_on_command_line: bool,

    /// Print the API's JSON as it is (pretty), for scripts.
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub json: bool,

    /// Give up on a request after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..), global = true, help_heading = GLOBAL)]
    pub timeout_secs: u64,

    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses `args` (the program name first), noting where the token came from.
    pub fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = Self::command().try_get_matches_from(args)?;
        let mut cli = Self::from_arg_matches(&matches)?;
        cli.token_on_command_line = matches.value_source("token") == Some(ValueSource::CommandLine);
        Ok(cli)
    }

    /// This process's arguments, parsed; a usage error exits (2) as clap does.
    pub fn parse_args() -> Self {
        Self::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// The bearer token: the contents of `--token-file` (trimmed) if given, else
    /// `--token` or SAGAWORKS_TOKEN. `Err`: why there is none, for a usage error.
    pub fn bearer_token(&self) -> Result<Token, String> {
        const MISSING: &str = "a token is required: SAGAWORKS_TOKEN, --token-file PATH or --token TOKEN";
        if let Some(path) = &self.token_file {
            if self.token_on_command_line {
                return Err("--token and --token-file: give one of them".into());
            }
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read --token-file {}: {e}", path.display()))?;
            let token = text.trim();
            if token.is_empty() {
                return Err(format!("--token-file {} is empty", path.display()));
            }
            return Ok(Token::from(token));
        }
        self.token.clone().filter(|t| !t.is_empty()).ok_or_else(|| MISSING.into())
    }
}

/// What `--token` on the command line prints to stderr.
pub const TOKEN_ON_COMMAND_LINE: &str = "warning: a token given with --token shows in the process list (ps) \
     and the shell's history; set SAGAWORKS_TOKEN or use --token-file instead";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Find, inspect and act on sagas (retry, compensate, resolve).
    Sagas {
        #[command(subcommand)]
        command: SagasCommand,
    },
    /// Inspect, replay and discard dead-lettered Kafka messages.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum SagasCommand {
    /// List sagas, newest first, filtered (GET /v1/admin/sagas).
    #[command(after_long_help = "\
Examples:
  sagaworks-admin sagas list --status stuck
  sagaworks-admin sagas list --status RUNNING --step charge_payment --older-than 15m
  sagaworks-admin sagas list --customer 7f3c0a4e-5b1d-4c2e-9a57-0d7c5e1f2a3b --all")]
    List(SagaListArgs),

    /// Show one saga: its steps' attempts, its trace and operators' actions.
    #[command(
        after_long_help = "Example:\n  sagaworks-admin sagas show 0196f0c4-7d1e-7b3a-9c55-2f1e0a6b8c9d"
    )]
    Show {
        /// Saga id (UUID).
        id: String,
    },

    /// Run the saga's current step again now, skipping its backoff.
    #[command(after_long_help = "\
Prints the Idempotency-Key it sends; run it again with the same --key to repeat
the exact call safely (the second answer says it was a replay).

Example:
  sagaworks-admin sagas retry 0196f0c4-7d1e-7b3a-9c55-2f1e0a6b8c9d --reason \"provider back up\"")]
    Retry(SagaActionArgs),

    /// Abort a running saga before its pivot: compensate and cancel the order.
    #[command(after_long_help = "\
Exits with 4 (conflict) when the saga cannot be compensated any more (finished,
already compensating, or past its pivot); nothing is changed then.

Example:
  sagaworks-admin sagas compensate 0196f0c4-7d1e-7b3a-9c55-2f1e0a6b8c9d --reason \"customer asked\"")]
    Compensate(SagaActionArgs),

    /// State the current step's effect by hand; the saga goes on from there.
    #[command(after_long_help = "\
--output is the step's output: needed for reserve_stock (what the reservation
would have answered), omitted for every other step. @FILE reads it from a file.

Examples:
  sagaworks-admin sagas resolve 0196f0c4-7d1e-7b3a-9c55-2f1e0a6b8c9d --reason \"charged by phone\"
  sagaworks-admin sagas resolve 0196f0c4-7d1e-7b3a-9c55-2f1e0a6b8c9d --reason \"reserved by hand\" \\
      --output '{\"total_cents\": 4200, \"prices\": [{\"product_id\": \"…\", \"unit_price_cents\": 2100}]}'")]
    Resolve(SagaResolveArgs),

    /// The saga's versions, newest first, with their unfinished instances (GET /v1/admin/sagas/versions).
    #[command(after_long_help = "\
A version that starts no new instances and has none unfinished is drained: the
next deploy may drop its code. See docs/design.md, \"Changing a saga\".

Example:
  sagaworks-admin sagas versions")]
    Versions,

    /// Wait until a version that starts no new instances has none unfinished.
    #[command(after_long_help = "\
Exits 0 once the version is drained; 4 (conflict) when it still starts new
instances (deploy a newer version, or set saga.start_version, first); 6 when
--timeout passes first (run it again later).

Example:
  sagaworks-admin sagas drain 1 --timeout 30m")]
    Drain {
        /// The version to drain.
        #[arg(id = "saga_version", value_name = "VERSION")]
        version: u32,
        /// How long to wait: seconds, or with a unit (90s, 15m, 2h).
        #[arg(long, value_name = "SECS", value_parser = parse_secs, default_value = "600")]
        timeout: u64,
        /// How often to ask, in seconds.
        #[arg(long, value_name = "SECS", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=300))]
        every: u64,
    },
}

/// `--status` of `sagas list`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SagaStatus {
    #[value(name = "RUNNING")]
    Running,
    #[value(name = "COMPENSATING")]
    Compensating,
    #[value(name = "COMPLETED")]
    Completed,
    #[value(name = "COMPENSATED")]
    Compensated,
    /// Unfinished and without progress for longer than the order service's stuck threshold.
    #[value(name = "stuck")]
    Stuck,
}

impl SagaStatus {
    /// The API's name of the filter.
    pub fn as_str(self) -> &'static str {
        match self {
            SagaStatus::Running => "RUNNING",
            SagaStatus::Compensating => "COMPENSATING",
            SagaStatus::Completed => "COMPLETED",
            SagaStatus::Compensated => "COMPENSATED",
            SagaStatus::Stuck => "stuck",
        }
    }
}

#[derive(Debug, Args)]
pub struct SagaListArgs {
    /// Only sagas in this state (`stuck`: unfinished, no recent progress).
    #[arg(long, value_enum, ignore_case = true)]
    pub status: Option<SagaStatus>,

    /// Only sagas whose current step is this one, e.g. `refund_payment`.
    #[arg(long, value_name = "NAME")]
    pub step: Option<String>,

    /// Only sagas created at least this long ago: seconds, or with a unit (90s, 15m, 2h, 1d).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub older_than: Option<u64>,

    /// Only this customer's orders.
    #[arg(long, value_name = "UUID")]
    pub customer: Option<uuid::Uuid>,

    #[command(flatten)]
    pub page: PageArgs,
}

/// Paging of a list: `--limit`, `--cursor`, `--all`.
#[derive(Debug, Args)]
pub struct PageArgs {
    /// At most this many per page (the API's default is 50).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=500))]
    pub limit: Option<u32>,

    /// Start at this page (the `next_cursor` of a previous page).
    #[arg(long, value_name = "C")]
    pub cursor: Option<String>,

    /// Follow `next_cursor` to the last page (--limit is the page size; --json prints one merged document).
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct SagaActionArgs {
    /// Saga id (UUID).
    pub id: String,

    /// Why (recorded with the action), 1 to 1000 characters.
    #[arg(long, value_name = "R", value_parser = parse_reason)]
    pub reason: String,

    /// Idempotency-Key to send (default: a fresh UUID, printed on stderr).
    #[arg(long, visible_alias = "idempotency-key", value_name = "K")]
    pub key: Option<String>,
}

#[derive(Debug, Args)]
pub struct SagaResolveArgs {
    #[command(flatten)]
    pub action: SagaActionArgs,

    /// The step's output as JSON, or @FILE to read it from a file.
    #[arg(long, value_name = "JSON", value_parser = parse_json)]
    pub output: Option<Value>,
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Dead-letter topics with their message and pending counts (GET /v1/admin/dlq).
    Topics,

    /// List a topic's dead letters, oldest first.
    #[command(after_long_help = "\
TOPIC is the original topic (order, reservation, payment), not the .dlq one.

Examples:
  sagaworks-admin dlq list order --state pending
  sagaworks-admin dlq list payment --key 7f3c0a4e-5b1d-4c2e-9a57-0d7c5e1f2a3b --all")]
    List(DlqListArgs),

    /// Show one dead letter: why it failed, its headers and its payload.
    #[command(after_long_help = "Example:\n  sagaworks-admin dlq show order 0-3")]
    Show {
        /// The original topic (order, reservation, payment).
        topic: String,
        /// The dead letter's id (`<partition>-<offset>` in the DLQ topic).
        id: String,
    },

    /// Send pending dead letters back to their original topic.
    #[command(after_long_help = "\
Choose exactly one of --id, --key and --all-pending. A key's messages are sent in
their original order. Only pending messages are replayed: --id of one that was
replayed or discarded already exits with 4 (conflict).

Examples:
  sagaworks-admin dlq replay order --id 0-3 --reason \"consumer fixed\"
  sagaworks-admin dlq replay order --key 7f3c0a4e-5b1d-4c2e-9a57-0d7c5e1f2a3b --reason \"bad price fixed\"
  sagaworks-admin dlq replay payment --all-pending --reason \"provider outage over\"")]
    Replay(DlqReplayArgs),

    /// Mark a pending dead letter as discarded: it will not be replayed.
    #[command(
        after_long_help = "Example:\n  sagaworks-admin dlq discard order 0-3 --reason \"test message\""
    )]
    Discard(DlqDiscardArgs),
}

/// `--state` of `dlq list`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeadLetterState {
    Pending,
    Replayed,
    Discarded,
}

impl DeadLetterState {
    /// The API's name of the state.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterState::Pending => "pending",
            DeadLetterState::Replayed => "replayed",
            DeadLetterState::Discarded => "discarded",
        }
    }
}

#[derive(Debug, Args)]
pub struct DlqListArgs {
    /// The original topic (order, reservation, payment).
    pub topic: String,

    /// Only messages in this state.
    #[arg(long, value_enum, ignore_case = true)]
    pub state: Option<DeadLetterState>,

    /// Only messages with this Kafka key (the aggregate id).
    #[arg(long, value_name = "K")]
    pub key: Option<String>,

    #[command(flatten)]
    pub page: PageArgs,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("selector").required(true).args(["id", "key", "all_pending"])))]
pub struct DlqReplayArgs {
    /// The original topic (order, reservation, payment).
    pub topic: String,

    /// Replay this one message (`<partition>-<offset>`).
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,

    /// Replay every pending message with this Kafka key, in order.
    #[arg(long, value_name = "K")]
    pub key: Option<String>,

    /// Replay every pending message of the topic.
    #[arg(long)]
    pub all_pending: bool,

    /// Why (recorded with the action), 1 to 1000 characters.
    #[arg(long, value_name = "R", value_parser = parse_reason)]
    pub reason: String,

    /// Idempotency-Key to send (default: a fresh UUID, printed on stderr).
    #[arg(long, visible_alias = "key-idempotency", value_name = "K")]
    pub idempotency_key: Option<String>,
}

/// Which messages `dlq replay` sends back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaySelector<'a> {
    Id(&'a str),
    Key(&'a str),
    AllPending,
}

impl DlqReplayArgs {
    /// The one selector clap let through (the `selector` group is required and exclusive).
    pub fn selector(&self) -> ReplaySelector<'_> {
        match (&self.id, &self.key) {
            (Some(id), _) => ReplaySelector::Id(id),
            (None, Some(key)) => ReplaySelector::Key(key),
            (None, None) => ReplaySelector::AllPending,
        }
    }
}

#[derive(Debug, Args)]
pub struct DlqDiscardArgs {
    /// The original topic (order, reservation, payment).
    pub topic: String,

    /// The dead letter's id (`<partition>-<offset>`).
    pub id: String,

    /// Why (recorded with the action), 1 to 1000 characters.
    #[arg(long, value_name = "R", value_parser = parse_reason)]
    pub reason: String,

    /// Idempotency-Key to send (default: a fresh UUID, printed on stderr).
    #[arg(long, visible_alias = "key-idempotency", value_name = "K")]
    pub idempotency_key: Option<String>,
}

/// An `http` or `https` base URL.
fn parse_api(s: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" if url.has_host() => Ok(url),
        _ => Err("must be an http:// or https:// URL with a host".into()),
    }
}

/// A duration in whole seconds: `600`, or with a unit `90s`, `15m`, `2h`, `1d`.
pub fn parse_secs(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => s.split_at(at),
        None => (s, "s"),
    };
    let n: u64 =
        digits.parse().map_err(|_| format!("{s:?} is not a duration (e.g. 600, 90s, 15m, 2h, 1d)"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("unknown unit {unit:?} (use s, m, h or d)")),
    };
    match n.checked_mul(scale) {
        Some(0) => Err("must be at least 1 second".into()),
        Some(secs) => Ok(secs),
        None => Err("too large".into()),
    }
}

/// A reason: 1 to 1000 characters, not only blanks.
fn parse_reason(s: &str) -> Result<String, String> {
    match s.chars().count() {
        _ if s.trim().is_empty() => Err("must not be empty".into()),
        n if n > 1000 => Err(format!("at most 1000 characters ({n} given)")),
        _ => Ok(s.to_string()),
    }
}

/// JSON given inline, or `@FILE` to read it from a file.
fn parse_json(s: &str) -> Result<Value, String> {
    let text = match s.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?,
        None => s.to_string(),
    };
    serde_json::from_str(&text).map_err(|e| format!("not valid JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_secs("600"), Ok(600));
        assert_eq!(parse_secs("90s"), Ok(90));
        assert_eq!(parse_secs("15m"), Ok(900));
        assert_eq!(parse_secs("2h"), Ok(7200));
        assert_eq!(parse_secs("1d"), Ok(86_400));
        assert!(parse_secs("0").is_err());
        assert!(parse_secs("m").is_err());
        assert!(parse_secs("5w").is_err());
        assert!(parse_secs("-5").is_err());
        assert!(parse_secs("99999999999999999999d").is_err());
    }

    #[test]
    fn replay_needs_exactly_one_selector() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from([&["sagaworks-admin", "dlq", "replay", "order"], args].concat())
        };
        let cli = parse(&["--all-pending", "--reason", "r"]).unwrap();
        let Command::Dlq { command: DlqCommand::Replay(replay) } = cli.command else {
            panic!("not a replay")
        };
        assert_eq!(replay.selector(), ReplaySelector::AllPending);
        assert!(parse(&["--reason", "r"]).is_err());
        assert!(parse(&["--id", "0-1", "--key", "k", "--reason", "r"]).is_err());
        assert!(parse(&["--id", "0-1", "--reason", " "]).is_err());
    }

    #[test]
    fn the_token_is_redacted_in_debug_and_its_source_is_noted() {
        let secret = "eyJ.secret-admin-token.sig";
        let cli = Cli::try_parse_args(["sagaworks-admin", "--token", secret, "dlq", "topics"]).unwrap();
        assert!(cli.token_on_command_line);
        assert_eq!(cli.bearer_token().unwrap().expose(), secret);
        let shown = format!("{cli:?} {cli:#?}");
        assert!(!shown.contains(secret) && shown.contains("[REDACTED]"), "{shown}");
        let cli = Cli::try_parse_args(["sagaworks-admin", "dlq", "topics", "--token", secret]).unwrap();
        assert!(cli.token_on_command_line, "a global flag after the subcommand");
    }

    #[test]
    fn a_token_file_is_read_trimmed_and_refused_when_missing_or_empty() {
        let dir = std::env::temp_dir().join(format!("sw-admin-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "  eyJ.from-a-file.sig\n").unwrap();
        let parse = |args: &[&str]| {
            Cli::try_parse_args([&["sagaworks-admin"], args, &["dlq", "topics"]].concat()).unwrap()
        };
        let path = file.to_str().unwrap();
        let cli = parse(&["--token-file", path]);
        assert!(!cli.token_on_command_line);
        assert_eq!(cli.bearer_token().unwrap().expose(), "eyJ.from-a-file.sig");

        let both = parse(&["--token-file", path, "--token", "t"]).bearer_token().unwrap_err();
        assert!(both.contains("--token and --token-file"), "{both}");
        std::fs::write(&file, " \n").unwrap();
        let empty = parse(&["--token-file", path]).bearer_token().unwrap_err();
        assert!(empty.contains("is empty") && empty.contains(path), "{empty}");
        let missing = dir.join("nope");
        let missing = parse(&["--token-file", missing.to_str().unwrap()]).bearer_token().unwrap_err();
        assert!(missing.contains("cannot read --token-file") && missing.contains("nope"), "{missing}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn status_filter_ignores_case() {
        let cli = Cli::try_parse_from(["sagaworks-admin", "sagas", "list", "--status", "running"]).unwrap();
        let Command::Sagas { command: SagasCommand::List(list) } = cli.command else { panic!("not a list") };
        assert_eq!(list.status, Some(SagaStatus::Running));
    }
}
