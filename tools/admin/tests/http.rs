//! The CLI's HTTP behaviour, against a tiny in-process axum server with
//! canned answers: the bearer token, the Idempotency-Key header, the JSON
//! bodies, paging, and how error statuses become exit codes. It runs the
//! built binary. (The end-to-end test against the real stack is elsewhere.)

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::process::Output;
use std::sync::{Arc, Mutex};

const ADMIN: &str = "admin-token";
const CUSTOMER: &str = "customer-token";
const SAGA: &str = "0196f0c4-7d1e-7b3a-9c55-2f1e0a6b8c9d";
const CONFLICTING_SAGA: &str = "0196f0c4-0000-7000-8000-000000000409";

/// One request the server saw.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    query: String,
    authorization: Option<String>,
    idempotency_key: Option<String>,
    body: Value,
}

type Log = Arc<Mutex<Vec<Seen>>>;

struct Server {
    url: String,
    log: Log,
}

impl Server {
    async fn start() -> Self {
        let log = Log::default();
        let app = Router::new().fallback(canned).with_state(log.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Server { url, log }
    }

    /// Runs the CLI against this server with `token` in SAGAWORKS_TOKEN (none: no token at all).
    async fn run(&self, token: Option<&str>, args: &[&str]) -> Output {
        let env: &[(&str, &str)] = match token {
            Some(token) => &[("SAGAWORKS_TOKEN", token)],
            None => &[],
        };
        self.run_with(env, args).await
    }

    /// Runs the CLI against this server with `env` (and no other SAGAWORKS_TOKEN).
    async fn run_with(&self, env: &[(&str, &str)], args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_sagaworks-admin"));
        command.env_remove("SAGAWORKS_TOKEN").env("SAGAWORKS_API", &self.url).args(args);
        command.envs(env.iter().copied());
        command.output().await.unwrap()
    }

    fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
}

fn problem(status: StatusCode, title: &str, detail: &str) -> Response {
    let body = json!({"type": "https://sagaworks.dev/problems/x", "title": title, "status": status.as_u16(), "detail": detail});
    (status, [("content-type", "application/problem+json")], body.to_string()).into_response()
}

fn saga_detail() -> Value {
    json!({
        "saga_id": SAGA, "order_id": "7f3c0a4e-5b1d-4c2e-9a57-0d7c5e1f2a3b", "version": 2, "status": "RUNNING",
        "current_step": "charge_payment", "steps": [], "created_at": "2026-12-04T19:00:00Z",
        "updated_at": null, "progressed_at": null, "actions": [], "a_field_from_the_future": 1
    })
}

/// One saga of `GET /v1/admin/sagas`, as the gateway lists it.
fn saga_summary(saga_id: &str, status: &str) -> Value {
    json!({
        "saga_id": saga_id, "order_id": "7f3c0a4e-5b1d-4c2e-9a57-0d7c5e1f2a3b", "status": status, "attempts": 1,
        "created_at": "2026-12-04T19:00:00Z", "progressed_at": null, "age_secs": 60, "idle_secs": 30
    })
}

/// A dead letter whose writer planted what a terminal acts on, in every field: an ANSI
/// CSI that erases the line, an OSC 8 hyperlink, a bare CR, a newline inside a value.
fn hostile_dead_letter() -> Value {
    let csi = "\x1b[2K\x1b[1A";
    let osc8 = "\x1b]8;;https://evil.example/\x07/sagaworks/order\x1b]8;;\x07";
    json!({
        "id": format!("0-3{csi}"), "topic": format!("order{osc8}"), "dlq_topic": "order.dlq\r",
        "key": format!("k\rk{csi}"), "group": format!("g\ng: forged{osc8}"),
        "reason": format!("untrusted_source{csi}\rhandler_error"), "error": "bad\nprice\r",
        "event_id": "e\x1b[8m", "event_type": "OrderConfirmed\u{9b}2K", "attempts": 1, "state": "pending\x07",
        "headers": {"ce_source": format!("/sagaworks/inventory\r{osc8}"), format!("x{csi}"): "v\nce_source: /sagaworks/order"},
        "payload": format!("not json{csi}\r\nOperator actions:"), "payload_bytes": 10, "payload_truncated": false,
        "actions": [{"action": "REPLAY\x1b[0m", "actor": "ops\r", "reason": format!("r{osc8}"), "at": null}]
    })
}

/// `text` holds no control character but its own line breaks.
fn assert_inert(text: &str) {
    let raw: Vec<char> = text.chars().filter(|c| c.is_control() && *c != '\n').collect();
    assert!(raw.is_empty(), "{raw:?} printed raw in:\n{text}");
}

/// Records the request, then answers for the few routes the tests use.
async fn canned(
    State(log): State<Log>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_string());
    let seen = Seen {
        method: method.clone(),
        path: uri.path().to_string(),
        query: uri.query().unwrap_or_default().to_string(),
        authorization: header("authorization"),
        idempotency_key: header("idempotency-key"),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    log.lock().unwrap().push(seen.clone());

    if seen.authorization.as_deref() != Some(&format!("Bearer {ADMIN}")) {
        return problem(StatusCode::FORBIDDEN, "Forbidden", "this needs the admin role");
    }
    let path: Vec<&str> = seen.path.trim_start_matches('/').split('/').collect();
    match (method, path.as_slice()) {
        (Method::GET, ["v1", "admin", "sagas"]) => {
            let page = if seen.query.contains("cursor=c2") {
                json!({"sagas": [saga_summary("s-2", "COMPLETED")]})
            } else {
                json!({"sagas": [saga_summary("s-1", "RUNNING")], "next_cursor": "c2"})
            };
            axum::Json(page).into_response()
        }
        (Method::POST, ["v1", "admin", "sagas", id, _action]) if *id == CONFLICTING_SAGA => {
            problem(StatusCode::CONFLICT, "Conflict", "the saga is past its pivot")
        }
        (Method::POST, ["v1", "admin", "sagas", _, _action]) => {
            axum::Json(json!({"step": "charge_payment", "replayed": false, "saga": saga_detail()}))
                .into_response()
        }
        (Method::GET, ["v1", "admin", "dlq", "order", "messages"]) => {
            axum::Json(json!({"messages": [hostile_dead_letter()]})).into_response()
        }
        (Method::GET, ["v1", "admin", "dlq", "order", "messages", "0-3"]) => {
            axum::Json(hostile_dead_letter()).into_response()
        }
        (Method::POST, ["v1", "admin", "dlq", "order", "replay"]) => {
            axum::Json(json!({"replayed": ["0-3", "0-4"], "replay": false})).into_response()
        }
        _ => problem(StatusCode::NOT_FOUND, "Not Found", "no such resource"),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn an_action_sends_the_token_the_given_key_and_the_reason() {
    let server = Server::start().await;
    let out =
        server.run(Some(ADMIN), &["sagas", "retry", SAGA, "--reason", "provider back", "--key", "k-1"]).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("retry of step charge_payment: done"), "{}", text(&out.stdout));

    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, Method::POST);
    assert_eq!(seen[0].path, format!("/v1/admin/sagas/{SAGA}/retry"));
    assert_eq!(seen[0].authorization.as_deref(), Some("Bearer admin-token"));
    assert_eq!(seen[0].idempotency_key.as_deref(), Some("k-1"));
    assert_eq!(seen[0].body, json!({"reason": "provider back"}));
}

#[tokio::test]
async fn without_a_key_a_fresh_uuid_is_sent_and_printed() {
    let server = Server::start().await;
    let output = r#"{"total_cents": 4200, "prices": []}"#;
    let out =
        server.run(Some(ADMIN), &["sagas", "resolve", SAGA, "--reason", "by hand", "--output", output]).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));

    let seen = server.seen();
    assert_eq!(seen[0].path, format!("/v1/admin/sagas/{SAGA}/resolve"));
    assert_eq!(seen[0].body, json!({"reason": "by hand", "output": {"total_cents": 4200, "prices": []}}));
    let key = seen[0].idempotency_key.clone().expect("an Idempotency-Key");
    assert_eq!(uuid::Uuid::parse_str(&key).unwrap().get_version_num(), 4);
    assert!(text(&out.stderr).contains(&format!("--key {key}")), "{}", text(&out.stderr));
}

#[tokio::test]
async fn dlq_replay_of_all_pending_sends_all_true() {
    let server = Server::start().await;
    let args = ["dlq", "replay", "order", "--all-pending", "--reason", "fixed", "--idempotency-key", "k-2"];
    let out = server.run(Some(ADMIN), &args).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("Replayed 2 message(s) to order: 0-3, 0-4"), "{}", text(&out.stdout));

    let seen = server.seen();
    assert_eq!(seen[0].path, "/v1/admin/dlq/order/replay");
    assert_eq!(seen[0].idempotency_key.as_deref(), Some("k-2"));
    assert_eq!(seen[0].body, json!({"reason": "fixed", "all": true}));
}

#[tokio::test]
async fn a_conflict_exits_with_4_and_explains_why() {
    let server = Server::start().await;
    let out = server.run(Some(ADMIN), &["sagas", "compensate", CONFLICTING_SAGA, "--reason", "r"]).await;
    assert_eq!(out.status.code(), Some(4));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("Conflict (HTTP 409)") && stderr.contains("the saga is past its pivot"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));

    // With --json the problem document goes to stdout too.
    let out =
        server.run(Some(ADMIN), &["--json", "sagas", "compensate", CONFLICTING_SAGA, "--reason", "r"]).await;
    assert_eq!(out.status.code(), Some(4));
    let problem: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(problem["status"], 409);
}

#[tokio::test]
async fn forbidden_exits_with_5() {
    let server = Server::start().await;
    let out = server.run(Some(CUSTOMER), &["sagas", "retry", SAGA, "--reason", "r", "--key", "k"]).await;
    assert_eq!(out.status.code(), Some(5));
    assert!(text(&out.stderr).contains("Forbidden (HTTP 403)"), "{}", text(&out.stderr));
    assert_eq!(server.seen()[0].authorization.as_deref(), Some("Bearer customer-token"));
}

#[tokio::test]
async fn list_all_follows_the_cursor_and_merges_the_pages() {
    let server = Server::start().await;
    let out = server
        .run(Some(ADMIN), &["sagas", "list", "--status", "stuck", "--limit", "1", "--all", "--json"])
        .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let merged: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(merged, json!({"sagas": [saga_summary("s-1", "RUNNING"), saga_summary("s-2", "COMPLETED")]}));

    let queries: Vec<String> = server.seen().into_iter().map(|s| s.query).collect();
    assert_eq!(queries, ["status=stuck&limit=1", "status=stuck&limit=1&cursor=c2"]);
}

#[tokio::test]
async fn no_token_is_a_usage_error() {
    let server = Server::start().await;
    let out = server.run(None, &["sagas", "list"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(server.seen().is_empty());
}

#[tokio::test]
async fn dlq_show_and_list_print_planted_terminal_sequences_escaped() {
    let server = Server::start().await;
    let out = server.run(Some(ADMIN), &["dlq", "show", "order", "0-3"]).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert_inert(&shown);
    for escaped in [
        "\nkey            k\\rk\\x1b[2K\\x1b[1A\n",
        "\ngroup          g\\ng: forged\\x1b]8;;https://evil.example/\\x07/sagaworks/order\\x1b]8;;\\x07\n",
        "\nreason         untrusted_source\\x1b[2K\\x1b[1A\\rhandler_error\n",
        "\n  ce_source: /sagaworks/inventory\\r\\x1b]8;;https://evil.example/",
        "\n  x\\x1b[2K\\x1b[1A: v\\nce_source: /sagaworks/order\n",
        "\nnot json\\x1b[2K\\x1b[1A\\r\\nOperator actions:\n",
        "OrderConfirmed\\u{9b}2K",
    ] {
        assert!(shown.contains(escaped), "{escaped:?} not in:\n{shown}");
    }
    assert_eq!(shown.matches("Operator actions:").count(), 2, "the payload's and the real one:\n{shown}");
    assert_eq!(shown.lines().filter(|l| l.starts_with("  ce_source:")).count(), 1, "{shown}");

    let out = server.run(Some(ADMIN), &["dlq", "list", "order"]).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert_inert(&listed);
    assert_eq!(listed.lines().count(), 2, "a header and one row:\n{listed}");
    assert!(listed.contains("0-3\\x1b[2K\\x1b[1A  pending\\x07  k\\rk"), "{listed}");

    let out = server.run(Some(ADMIN), &["--json", "dlq", "show", "order", "0-3"]).await;
    let json = text(&out.stdout);
    assert_inert(&json);
    assert!(json.contains("OrderConfirmed\\u009b2K"), "{json}");
    assert_eq!(serde_json::from_str::<Value>(&json).unwrap(), hostile_dead_letter(), "the same JSON");
}

#[tokio::test]
async fn a_token_on_the_command_line_works_and_warns_that_ps_shows_it() {
    let server = Server::start().await;
    let out = server
        .run_with(&[], &["--token", ADMIN, "dlq", "replay", "order", "--all-pending", "--reason", "r"])
        .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("warning: a token given with --token shows in the process list (ps)"),
        "{stderr}"
    );
    assert!(stderr.contains("SAGAWORKS_TOKEN") && stderr.contains("--token-file"), "{stderr}");
    assert!(!stderr.contains(ADMIN), "{stderr}");
    assert_eq!(server.seen()[0].authorization.as_deref(), Some("Bearer admin-token"));

    // From the environment: the same call, no warning.
    let out = server.run(Some(ADMIN), &["dlq", "replay", "order", "--all-pending", "--reason", "r"]).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("warning"), "{}", text(&out.stderr));
    assert_eq!(server.seen()[1].authorization.as_deref(), Some("Bearer admin-token"));
}

#[tokio::test]
async fn a_token_file_is_read_wins_over_the_environment_and_a_bad_one_is_a_usage_error() {
    let server = Server::start().await;
    let dir = std::env::temp_dir().join(format!("sw-admin-http-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, format!("{ADMIN}\n")).unwrap();
    let path = file.to_str().unwrap();
    let args = ["--token-file", path, "dlq", "replay", "order", "--all-pending", "--reason", "r"];
    let out = server.run_with(&[("SAGAWORKS_TOKEN", CUSTOMER)], &args).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("warning"), "{}", text(&out.stderr));
    assert_eq!(server.seen()[0].authorization.as_deref(), Some("Bearer admin-token"), "the file's");

    let missing = dir.join("missing");
    let out = server.run_with(&[], &["--token-file", missing.to_str().unwrap(), "dlq", "topics"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read --token-file"), "{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 1, "no call without a token");
    std::fs::remove_dir_all(dir).unwrap();
}
