//! The `mint-token` binary as a user runs it: `--help`, usage errors, and a
//! token the gateway's own verifier accepts with the claims asked for.

use std::process::{Command, Output};

const SECRET: &str = "mint-token-test-secret";

fn mint(args: &[&str], secret: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mint-token"));
    cmd.args(args)
        .env_remove("APP_CONFIG_FILE")
        .env_remove("APP_AUTH__ISSUER")
        .env_remove("APP_AUTH__AUDIENCE");
    match secret {
        Some(s) => cmd.env("APP_AUTH__JWT_SECRET", s),
        None => cmd.env_remove("APP_AUTH__JWT_SECRET"),
    };
    cmd.output().expect("mint-token runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_names_every_flag_and_exits_zero() {
    let out = mint(&["--help"], None);
    assert!(out.status.success(), "{out:?}");
    let help = text(&out.stdout);
    for flag in ["--sub", "--role", "--ttl-secs", "APP_AUTH__JWT_SECRET"] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

#[test]
fn usage_errors_exit_2_and_say_what_is_wrong() {
    for (args, says) in [
        (&[][..], "--sub"),
        (&["--sub", "ops", "--ttl-secs", "0"][..], "--ttl-secs"),
        (&["--sub", "ops", "--colour", "red"][..], "--colour"),
    ] {
        let out = mint(args, Some(SECRET));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(text(&out.stderr).contains(says), "{args:?}: {}", text(&out.stderr));
        assert!(out.stdout.is_empty(), "no token on a usage error");
    }
}

#[test]
fn without_a_secret_it_fails_and_names_the_variable() {
    let out = mint(&["--sub", "ops"], None);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("APP_AUTH__JWT_SECRET"), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
}

#[test]
fn the_token_carries_the_subject_roles_and_lifetime_asked_for() {
    let out =
        mint(&["--sub", "ops", "--role", "admin", "--role", "support", "--ttl-secs", "120"], Some(SECRET));
    assert!(out.status.success(), "{out:?}");
    let token = text(&out.stdout).trim().to_string();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    validation.required_spec_claims = ["exp", "sub"].into_iter().map(String::from).collect();
    let claims = jsonwebtoken::decode::<serde_json::Value>(
        &token,
        &jsonwebtoken::DecodingKey::from_secret(SECRET.as_bytes()).unwrap(),
        &validation,
    )
    .expect("signed with the configured secret")
    .claims;
    assert_eq!(claims["sub"], "ops");
    assert_eq!(claims["roles"], serde_json::json!(["admin", "support"]));
    assert_eq!(claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(), 120);
}
