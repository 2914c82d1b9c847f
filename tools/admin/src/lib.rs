//! `sagaworks-admin`: the operator's command line for the gateway's admin
//! REST API (`/v1/admin/...`). It finds stuck or failing sagas and acts on
//! them, and inspects and replays dead-lettered Kafka messages.
//!
//! It talks HTTP(S) to the gateway with a bearer token whose `roles` claim
//! contains `admin`, so the same binary works against a local stack, docker
//! compose and Kubernetes (through an ingress or `kubectl port-forward`):
//!
//! The token comes from `SAGAWORKS_TOKEN` or a file (`--token-file`); `--token` on
//! the command line works but warns on stderr, since it shows in `ps` and the shell's
//! history. No `Debug` output shows it ([`client::Token`]).
//!
//! ```text
//! export SAGAWORKS_API=http://127.0.0.1:8080 SAGAWORKS_TOKEN=eyJ...
//! sagaworks-admin sagas list --status stuck --older-than 10m
//! sagaworks-admin sagas show 0196f0c4-...
//! sagaworks-admin sagas retry 0196f0c4-... --reason "payment provider back"
//! sagaworks-admin dlq list order --state pending
//! sagaworks-admin dlq replay order --all-pending --reason "bug #42 fixed"
//! sagaworks-admin --json sagas list --all | jq '.sagas[].saga_id'
//! ```
//!
//! # Exit codes
//!
//! | code | meaning |
//! | ---- | ------- |
//! | 0 | ok |
//! | 1 | the API answered with another error, or it could not be reached |
//! | 2 | usage error (bad flags; clap's default) |
//! | 3 | not found (404) |
//! | 4 | conflict: the action is not valid in this state (409) |
//! | 5 | not authenticated or not allowed (401/403) |
//! | 6 | service unavailable or rate limited (503/429): try again later |
//!
//! The mapping lives in one place: [`client::Error::exit_code`].
//!
//! # Layout
//!
//! * [`cli`]: the command line (clap derive types).
//! * [`client`]: the REST calls, and the typed errors they fail with.
//! * [`render`]: tables and other human output.
//! * [`run`]: one command, from parsed flags to printed output.
//!
//! Every mutating call sends an `Idempotency-Key` header; without `--key` a
//! fresh UUID is used and printed to stderr, so that the operator can repeat
//! exactly the same call (after a timeout, say) without doing it twice.

pub mod cli;
pub mod client;
pub mod render;

use cli::{Cli, Command, DlqCommand, ReplaySelector, SagasCommand};
use client::{Client, Error};
use serde_json::{Value, json};
use std::process::ExitCode;

/// What `main` does: runs the parsed command and turns the outcome into the
/// documented exit code, reporting an error on stderr (and, with `--json`,
/// the problem document on stdout).
pub async fn main_with(cli: Cli) -> ExitCode {
    let token = cli.bearer_token().unwrap_or_else(|message| {
        use clap::CommandFactory;
        Cli::command().error(clap::error::ErrorKind::MissingRequiredArgument, message).exit()
    });
    if cli.token_on_command_line {
        eprintln!("{}", cli::TOKEN_ON_COMMAND_LINE);
    }
    match run(&cli, token).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            report(&error, cli.json);
            ExitCode::from(error.exit_code())
        }
    }
}

/// Prints a failed command's error: the readable form on stderr; with `--json`
/// the problem document (as the API sent it) on stdout as well.
pub fn report(error: &Error, json: bool) {
    eprint!("{}", render::error(error));
    if json && let Some(problem) = error.problem() {
        println!("{}", pretty(&problem.raw));
    }
}

/// Runs one command with `token` ([`Cli::bearer_token`]).
pub async fn run(cli: &Cli, token: client::Token) -> Result<(), Error> {
    let client = Client::new(&cli.api, token, std::time::Duration::from_secs(cli.timeout_secs))?;
    match &cli.command {
        Command::Sagas { command } => sagas(&client, cli.json, command).await,
        Command::Dlq { command } => dlq(&client, cli.json, command).await,
    }
}

async fn sagas(client: &Client, json: bool, command: &SagasCommand) -> Result<(), Error> {
    match command {
        SagasCommand::List(args) => {
            let filter = client::SagaFilter {
                status: args.status.map(|s| s.as_str()),
                step: args.step.as_deref(),
                older_than_secs: args.older_than,
                customer_id: args.customer.map(|c| c.to_string()),
                limit: args.page.limit,
            };
            let pages = client.list_sagas(&filter, args.page.cursor.clone(), args.page.all).await?;
            if json {
                println!("{}", pretty(&pages.raw));
            } else {
                print!("{}", render::saga_list(&pages.value.sagas));
                hint_next_page(pages.value.next_cursor.as_deref());
            }
        }
        SagasCommand::Show { id } => {
            let saga = client.get_saga(id).await?;
            if json {
                println!("{}", pretty(&saga.raw));
            } else {
                print!("{}", render::saga_detail(&saga.value));
            }
        }
        SagasCommand::Retry(args) => {
            saga_action(client, json, "retry", &args.id, &args.reason, None, args).await?
        }
        SagasCommand::Compensate(args) => {
            saga_action(client, json, "compensate", &args.id, &args.reason, None, args).await?
        }
        SagasCommand::Versions => {
            let versions = client.saga_versions().await?;
            if json {
                println!("{}", pretty(&versions.raw));
            } else {
                print!("{}", render::saga_versions(&versions.value.versions));
            }
        }
        SagasCommand::Drain { version, timeout, every } => drain(client, *version, *timeout, *every).await?,
        SagasCommand::Resolve(args) => {
            saga_action(
                client,
                json,
                "resolve",
                &args.action.id,
                &args.action.reason,
                args.output.as_ref(),
                &args.action,
            )
            .await?
        }
    }
    Ok(())
}

/// Asks every `every` seconds until `version` has no unfinished instance; refuses a
/// version that still starts new ones (it would never drain).
async fn drain(client: &Client, version: u32, timeout: u64, every: u64) -> Result<(), Error> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout);
    let made_up = |status: u16, title: String| {
        Box::new(client::Fetched { value: client::Problem::new(status, "admin", &title), raw: Value::Null })
    };
    loop {
        let versions = client.saga_versions().await?.value.versions;
        let Some(v) = versions.iter().find(|v| v.version == version) else {
            return Err(Error::NotFound(made_up(404, format!("no version {version} of the saga"))));
        };
        if v.starts_new {
            return Err(Error::Conflict(made_up(
                409,
                format!(
                    "version {version} still starts new instances: deploy a newer version or set saga.start_version first"
                ),
            )));
        }
        if v.unfinished == 0 {
            println!(
                "version {version} of {} is drained: no unfinished instance",
                render::escape(&v.saga_type)
            );
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(Error::Unavailable(made_up(
                503,
                format!(
                    "version {version} still has {} unfinished instance(s) after {timeout} s",
                    v.unfinished
                ),
            )));
        }
        eprintln!("version {version}: {} unfinished", v.unfinished);
        tokio::time::sleep(std::time::Duration::from_secs(every)).await;
    }
}

async fn saga_action(
    client: &Client,
    json: bool,
    action: &str,
    id: &str,
    reason: &str,
    output: Option<&Value>,
    args: &cli::SagaActionArgs,
) -> Result<(), Error> {
    let key = idempotency_key(args.key.as_deref(), "--key");
    let mut body = json!({ "reason": reason });
    if let Some(output) = output {
        body["output"] = output.clone();
    }
    let result = client.act_on_saga(id, action, &key, &body).await?;
    if json {
        println!("{}", pretty(&result.raw));
    } else {
        print!("{}", render::saga_action(action, &result.value));
    }
    Ok(())
}

async fn dlq(client: &Client, json: bool, command: &DlqCommand) -> Result<(), Error> {
    match command {
        DlqCommand::Topics => {
            let topics = client.dlq_topics().await?;
            if json {
                println!("{}", pretty(&topics.raw));
            } else {
                print!("{}", render::dlq_topics(&topics.value.topics));
            }
        }
        DlqCommand::List(args) => {
            let filter = client::DeadLetterFilter {
                state: args.state.map(|s| s.as_str()),
                key: args.key.as_deref(),
                limit: args.page.limit,
            };
            let pages = client
                .list_dead_letters(&args.topic, &filter, args.page.cursor.clone(), args.page.all)
                .await?;
            if json {
                println!("{}", pretty(&pages.raw));
            } else {
                print!("{}", render::dead_letter_list(&pages.value.messages));
                hint_next_page(pages.value.next_cursor.as_deref());
            }
        }
        DlqCommand::Show { topic, id } => {
            let message = client.get_dead_letter(topic, id).await?;
            if json {
                println!("{}", pretty(&message.raw));
            } else {
                print!("{}", render::dead_letter(&message.value));
            }
        }
        DlqCommand::Replay(args) => {
            let key = idempotency_key(args.idempotency_key.as_deref(), "--idempotency-key");
            let mut body = json!({ "reason": args.reason });
            match args.selector() {
                ReplaySelector::Id(id) => body["id"] = json!(id),
                ReplaySelector::Key(k) => body["key"] = json!(k),
                ReplaySelector::AllPending => body["all"] = json!(true),
            }
            let result = client.replay_dead_letters(&args.topic, &key, &body).await?;
            if json {
                println!("{}", pretty(&result.raw));
            } else {
                print!("{}", render::replay_result(&args.topic, &result.value));
            }
        }
        DlqCommand::Discard(args) => {
            let key = idempotency_key(args.idempotency_key.as_deref(), "--idempotency-key");
            let body = json!({ "reason": args.reason });
            let result = client.discard_dead_letter(&args.topic, &args.id, &key, &body).await?;
            if json {
                println!("{}", pretty(&result.raw));
            } else {
                print!("{}", render::discard_result(&args.topic, &result.value));
            }
        }
    }
    Ok(())
}

/// The key given with `flag`, or a fresh UUID v4, announced on stderr before
/// the call so that it can be repeated even when no answer comes back.
fn idempotency_key(given: Option<&str>, flag: &str) -> String {
    match given {
        Some(key) => key.to_string(),
        None => {
            let key = uuid::Uuid::new_v4().to_string();
            eprintln!("Idempotency-Key: {key} (to repeat this exact call, add {flag} {key})");
            key
        }
    }
}

fn hint_next_page(next_cursor: Option<&str>) {
    if let Some(cursor) = next_cursor {
        let cursor = render::escape(cursor);
        eprintln!("more: add --cursor {cursor} for the next page, or --all for every page");
    }
}

/// Pretty JSON for stdout, with nothing a terminal acts on ([`render::json`]).
fn pretty(value: &Value) -> String {
    render::json(value)
}
