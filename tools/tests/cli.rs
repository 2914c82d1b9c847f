//! The command line of the built `sagaworks-tools` binary: help for every
//! command and flag, and exit code 2 with a message naming the flag for a bad
//! command line. Nothing here reaches a gateway, a database or a broker.

use std::process::{Command, Output};

/// Runs the binary with `args`, without the environment's gateway credentials.
fn tools(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sagaworks-tools"))
        .args(args)
        .env_remove("SW_TOKEN")
        .env_remove("SW_JWT_SECRET")
        .env_remove("SW_JWT_ISSUER")
        .env_remove("SW_JWT_AUDIENCE")
        .output()
        .expect("run sagaworks-tools")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts the run exited 2 with `needle` in its error message.
fn usage_error(args: &[&str], needle: &str) {
    let out = tools(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    assert!(stderr(&out).contains(needle), "{args:?}: expected {needle:?} in:\n{}", stderr(&out));
}

/// The flags scripts/load, scripts/chaos and the docs use, per command.
const SEED_FLAGS: &[&str] = &[
    "--out",
    "--api",
    "--products",
    "--customers",
    "--stock",
    "--credit-cents",
    "--poor-customers",
    "--poor-credit-cents",
    "--token",
    "--jwt-secret",
    "--jwt-issuer",
    "--jwt-audience",
];
const LOAD_FLAGS: &[&str] = &[
    "--fixture",
    "--api",
    "--concurrency",
    "--duration-secs",
    "--lines",
    "--max-quantity",
    "--accepted-out",
    "--pg-admin",
    "--commit-ceiling",
    "--target",
    "--token",
    "--jwt-secret",
];
const CHECK_FLAGS: &[&str] = &[
    "--fixture",
    "--accepted",
    "--pg-admin",
    "--db-prefix",
    "--settle-secs",
    "--brokers",
    "--topic-prefix",
    "--kafka-timeout-secs",
    "--kills",
    "--min-accepted",
    "--min-confirmed",
    "--min-cancelled",
    "--min-resumed",
    "--min-kills-under-load",
];

#[test]
fn help_lists_the_commands_and_exit_codes() {
    for args in [&["--help"][..], &["-h"], &["help"]] {
        let out = tools(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        let help = stdout(&out);
        for command in ["seed", "load", "check", "Exit codes"] {
            assert!(help.contains(command), "{args:?}: {command} missing from:\n{help}");
        }
    }
}

#[test]
fn no_command_is_a_usage_error_that_shows_the_commands() {
    let out = tools(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("seed"), "{}", stderr(&out));
}

#[test]
fn each_command_help_names_its_flags() {
    for (command, flags) in [("seed", SEED_FLAGS), ("load", LOAD_FLAGS), ("check", CHECK_FLAGS)] {
        for args in [vec![command, "--help"], vec!["help", command]] {
            let out = tools(&args);
            assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
            let help = stdout(&out);
            for flag in flags {
                assert!(help.contains(&format!("{flag} <")), "{args:?}: {flag} missing from:\n{help}");
            }
        }
    }
}

#[test]
fn help_names_the_environment_variables_for_credentials() {
    let help = stdout(&tools(&["seed", "--help"]));
    for var in ["SW_TOKEN", "SW_JWT_SECRET", "SW_JWT_ISSUER", "SW_JWT_AUDIENCE"] {
        assert!(help.contains(var), "{var} missing from:\n{help}");
    }
}

#[test]
fn an_unknown_flag_exits_2_naming_it() {
    usage_error(&["load", "--fixture", "f.json", "--workers", "8"], "--workers");
    // Flags belong to their command: check talks to no gateway.
    usage_error(&["check", "--fixture", "f.json", "--api", "http://127.0.0.1:8080"], "--api");
    usage_error(&["seed", "--out", "f.json", "--api"], "--api");
}

#[test]
fn an_unknown_command_exits_2_naming_it() {
    usage_error(&["soak", "--fixture", "f.json"], "soak");
}

#[test]
fn a_missing_required_flag_exits_2_naming_it() {
    usage_error(&["seed", "--products", "4"], "--out");
    usage_error(&["load", "--concurrency", "4"], "--fixture");
    usage_error(&["check", "--settle-secs", "4"], "--fixture");
}

#[test]
fn a_bad_value_exits_2_naming_the_flag() {
    usage_error(&["load", "--fixture", "f.json", "--concurrency", "zero"], "--concurrency");
    usage_error(&["load", "--fixture", "f.json", "--concurrency", "0"], "--concurrency");
    usage_error(&["load", "--fixture", "f.json", "--duration-secs", "1.5"], "--duration-secs");
    usage_error(&["load", "--fixture", "f.json", "--commit-ceiling", "fast"], "--commit-ceiling");
    usage_error(&["seed", "--out", "f.json", "--stock", "-1"], "--stock");
    usage_error(&["seed", "--out", "f.json", "--api", "127.0.0.1:8080"], "--api");
    usage_error(&["check", "--fixture", "f.json", "--min-accepted", "-1"], "--min-accepted");
}

#[test]
fn a_missing_fixture_exits_2_naming_the_file() {
    let missing = std::env::temp_dir().join(format!("sagaworks-tools-cli-{}.json", std::process::id()));
    let path = missing.to_str().unwrap();
    usage_error(&["load", "--fixture", path, "--duration-secs", "1"], path);
    usage_error(&["check", "--fixture", path], path);
}
