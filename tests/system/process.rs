//! The real binaries as processes: configuration from a file plus `APP_*`
//! variables, structured logs, readiness, and graceful shutdown on SIGTERM
//! (what Kubernetes and `docker stop` send).
//!
//! Needs the service binaries built (`cargo build --workspace`, which
//! `scripts/test` does first).

use sagaworks_test_support::{Broker, TestDatabase, eventually, free_port};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use system_tests::processes::binary;

#[tokio::test]
async fn payment_reads_file_and_env_logs_json_and_drains_on_sigterm() {
    let db = TestDatabase::create("proc").await;
    let broker = Broker::start().await;
    let kafka = broker.kafka_settings_as("payment");
    let (grpc, http) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("sw-proc-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("payment.toml");
    // The file sets the log format and a port the environment then overrides.
    std::fs::write(
        &file,
        format!("[telemetry]\nlog_format = \"json\"\nlog_level = \"info\"\n[http]\nport = 1\n[grpc]\nport = {grpc}\n"),
    )
    .unwrap();

    let mut child = Command::new(binary("payment"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("APP_CONFIG_FILE", &file)
        .env("APP_ENVIRONMENT", "development")
        .env("APP_HTTP__PORT", http.to_string())
        .env("APP_DATABASE__URL", &db.url)
        .env("APP_KAFKA__BROKERS", &kafka.brokers)
        .env("APP_KAFKA__SECURITY_PROTOCOL", "sasl_ssl")
        .env("APP_KAFKA__SASL_USERNAME", &kafka.sasl_username)
        .env("APP_KAFKA__SASL_PASSWORD", &kafka.sasl_password)
        .env("APP_KAFKA__SSL_CA_FILE", &kafka.ssl_ca_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines =
        std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<_>>());

    let client = reqwest::Client::new();
    let ready = format!("http://127.0.0.1:{http}/health/ready");
    // Ready with the broker not yet reached is "degraded" (the broker is not critical to
    // readiness): the test waits for both checks to pass, as the service reached them.
    let body = eventually("payment ready on the env-chosen port", Duration::from_secs(60), || async {
        let res = client.get(&ready).send().await.ok()?;
        if res.status() != reqwest::StatusCode::OK {
            return None;
        }
        let body: serde_json::Value = res.json().await.ok()?;
        (body["checks"]["kafka"] == "ok").then_some(body)
    })
    .await;
    assert_eq!(body["checks"]["database"], "ok", "{body}");
    assert_eq!(body["status"], "ready", "{body}");
    // The file's gRPC port is the one in use.
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", grpc)).await.is_ok());

    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    // A graceful shutdown shows in the clean exit and the log line checked below. The
    // deadline is no bound on how long that may take: it only turns a service that
    // ignores SIGTERM into a failure instead of a hung test.
    let exit = eventually("payment to exit after SIGTERM", Duration::from_secs(60), || {
        let exit = child.try_wait().unwrap();
        async move { exit }
    })
    .await;
    assert!(exit.success(), "graceful shutdown exits 0, got {exit}");

    let lines = lines.join().unwrap();
    assert!(!lines.is_empty(), "the service logged nothing");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{line}");
    }
    assert!(lines.iter().any(|l| l.contains("shutdown signal received")), "{lines:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_broken_config_is_a_clear_error_not_a_panic() {
    let output = Command::new(binary("order"))
        .env_clear()
        .env("APP_ENVIRONMENT", "development")
        .env("APP_GRPC__PORT", "not-a-port")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("port"), "names the bad key: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn migrate_applies_the_schema_and_exits_and_a_bad_command_is_a_usage_error() {
    let db = TestDatabase::create("proc_migrate").await;
    let migrate = || {
        Command::new(binary("order"))
            .arg("migrate")
            .env_clear()
            .env("APP_ENVIRONMENT", "development")
            .env("APP_DATABASE__URL", &db.url)
            // Nothing but the database is needed: no broker, no ports.
            .env("APP_KAFKA__BROKERS", "127.0.0.1:1")
            .output()
            .unwrap()
    };
    let first = migrate();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let pool = db.pool().await;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_name IN ('orders', 'saga_instances', 'outbox', 'inbox') ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(tables, ["inbox", "orders", "outbox", "saga_instances"]);
    let applied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations").fetch_one(&pool).await.unwrap();
    // Again: nothing to do, still success (an init container runs on every pod start).
    let again = migrate();
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    let after: i64 =
        sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations").fetch_one(&pool).await.unwrap();
    assert_eq!(after, applied);

    let bad = Command::new(binary("order")).arg("migrat").env_clear().output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("unrecognized subcommand 'migrat'") && stderr.contains("Usage"), "{stderr}");
}

/// Without `APP_ENVIRONMENT` (nor `environment` in a config file) no service starts, nor
/// migrates: each exits non-zero, before touching anything, saying the variable is not
/// set. (A debug build would otherwise run as development: no TLS, no allow-list, /fault.)
#[tokio::test]
async fn every_service_refuses_to_start_without_app_environment() {
    for service in ["gateway", "order", "inventory", "payment"] {
        for args in [&[][..], &["migrate"][..]] {
            if service == "gateway" && !args.is_empty() {
                continue; // the gateway has no database to migrate
            }
            let child = Command::new(binary(service))
                .args(args)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                // Everything else a development start needs: only the variable is missing.
                .env("APP_HTTP__PORT", "0")
                .env("APP_GRPC__PORT", "0")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let pid = child.id().to_string();
            // The deadline measures nothing: it only turns a service that starts (and
            // serves on) into a failure instead of a hung test.
            let waited = tokio::time::timeout(
                Duration::from_secs(60),
                tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()),
            )
            .await;
            let Ok(out) = waited else {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
                panic!("{service} {args:?} runs without APP_ENVIRONMENT");
            };
            let out = out.unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{service} {args:?} started without APP_ENVIRONMENT:\n{stderr}");
            assert!(stderr.contains("APP_ENVIRONMENT is not set"), "{service} {args:?}: {stderr}");
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
    }
}
