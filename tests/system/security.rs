//! Gateway security: bearer tokens (HS256, RS256 via JWKS), customer
//! ownership, the admin role, per-client rate limits; a refused request
//! never changes anything.

use reqwest::{RequestBuilder, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;
use system_tests::auth::{
    JwksServer, RS256_JWKS, RS256_KID, TEST_JWT_SECRET, admin_token, claims, customer_token, epoch,
    sign_hs256, sign_rs256,
};
use system_tests::{Running, Stack, gateway_settings, start_gateway_with};

/// A client without the stack's default admin token.
fn anonymous() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

async fn send(req: RequestBuilder) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let res = req.send().await.expect("gateway answers");
    let (status, headers) = (res.status(), res.headers().clone());
    (status, headers, res.json().await.unwrap_or(Value::Null))
}

fn url(gateway: &Running, path: &str) -> String {
    format!("http://127.0.0.1:{}{path}", gateway.http_port)
}

/// Another gateway in front of the stack's services, with tweaked settings.
async fn gateway(stack: &Stack, tweak: impl FnOnce(&mut gateway::config::Settings)) -> Running {
    let mut s =
        gateway_settings(&stack.order.grpc_url(), &stack.inventory.grpc_url(), &stack.payment.grpc_url());
    tweak(&mut s);
    start_gateway_with(s).await
}

fn assert_unauthenticated(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: &Value,
    what: &str,
) {
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
    assert_eq!(headers["www-authenticate"], "Bearer", "{what}");
    assert_eq!(headers["content-type"], "application/problem+json", "{what}");
    assert_eq!(body["status"], 401, "{what}");
}

#[tokio::test]
async fn requests_without_a_valid_token_are_401_and_change_nothing() {
    let stack = Stack::start().await;
    let product = stack.product(100, 10).await;
    let customer = stack.customer(1_000).await;
    let audience_gateway = gateway(&stack, |s| s.auth.audience = Some("sagaworks".into())).await;
    let http = anonymous();
    let order = json!({ "customer_id": customer, "items": [{ "product_id": product, "quantity": 1 }] });
    let new_product = json!({ "sku": "intruder", "name": "X", "price_cents": 1, "initial_stock": 1 });

    let mut expired = claims(&customer, &["admin"]);
    expired["exp"] = epoch(-3600).into();
    let tokens = [
        ("no token", None),
        ("not a JWT", Some("not-a-jwt".to_string())),
        ("bad signature", Some(sign_hs256("some-other-secret", &claims(&customer, &["admin"])))),
        ("expired", Some(sign_hs256(TEST_JWT_SECRET, &expired))),
        (
            "alg none",
            Some(format!(
                "{}.{}.",
                b64(r#"{"alg":"none"}"#),
                b64(&claims(&customer, &["admin"]).to_string())
            )),
        ),
    ];
    for (what, token) in &tokens {
        let with = |req: RequestBuilder| match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let (s, h, b) = send(with(http.post(stack.url("/v1/orders")).json(&order))).await;
        assert_unauthenticated(s, &h, &b, what);
        let (s, h, b) = send(with(http.post(stack.url("/v1/products")).json(&new_product))).await;
        assert_unauthenticated(s, &h, &b, what);
        let (s, h, b) = send(with(http.get(stack.url(&format!("/v1/customers/{customer}"))))).await;
        assert_unauthenticated(s, &h, &b, what);
    }
    let (s, h, b) = send(http.get(stack.url("/v1/products")).header("authorization", "Basic YTpi")).await;
    assert_unauthenticated(s, &h, &b, "basic auth");

    // `aud` is checked when configured: a token for another audience, or none, is refused.
    let mut other_audience = claims("ops", &["admin"]);
    other_audience["aud"] = "someone-else".into();
    for (what, token) in [("wrong audience", other_audience), ("no audience", claims("ops", &["admin"]))] {
        let req =
            http.get(url(&audience_gateway, "/v1/products")).bearer_auth(sign_hs256(TEST_JWT_SECRET, &token));
        let (s, h, b) = send(req).await;
        assert_unauthenticated(s, &h, &b, what);
    }
    let mut right_audience = claims("ops", &["admin"]);
    right_audience["aud"] = "sagaworks".into();
    let req = http
        .get(url(&audience_gateway, "/v1/products"))
        .bearer_auth(sign_hs256(TEST_JWT_SECRET, &right_audience));
    assert_eq!(send(req).await.0, StatusCode::OK);

    // Health, metrics and the API documents stay public.
    for path in ["/health/live", "/health/ready", "/metrics", "/openapi.json", "/asyncapi.json"] {
        let res = http.get(stack.url(path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }

    // Nothing was accepted.
    assert_eq!(stack.stock(&product).await, (10, 0, 0));
    assert_eq!(stack.balance(&customer).await, 1_000);
    let (_, list) = stack.get(&format!("/v1/orders?customer_id={customer}")).await;
    assert_eq!(list["orders"], json!([]));
    let (_, products) = stack.get("/v1/products").await;
    assert_eq!(products["products"].as_array().unwrap().len(), 1, "no intruder product: {products}");
}

fn b64(s: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = s.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

#[tokio::test]
async fn customers_see_and_place_only_their_own_orders() {
    let stack = Stack::start().await;
    let product = stack.product(100, 10).await;
    let (alice, bob) = (stack.customer(10_000).await, stack.customer(10_000).await);
    let http = anonymous();
    let as_alice = |req: RequestBuilder| req.bearer_auth(customer_token(&alice));
    let as_bob = |req: RequestBuilder| req.bearer_auth(customer_token(&bob));

    // Bob cannot place an order for Alice: 403, and nothing happens.
    let for_alice = json!({ "customer_id": alice, "items": [{ "product_id": product, "quantity": 1 }] });
    let (status, _, problem) = send(as_bob(http.post(stack.url("/v1/orders")).json(&for_alice))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{problem}");
    assert_eq!(problem["status"], 403);
    assert_eq!(stack.stock(&product).await, (10, 0, 0));
    assert_eq!(stack.balance(&alice).await, 10_000);

    // Alice can.
    let (status, _, order) = send(as_alice(http.post(stack.url("/v1/orders")).json(&for_alice))).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    let order_id = order["order_id"].as_str().unwrap().to_string();
    let saga_id = order["saga"]["saga_id"].as_str().unwrap().to_string();

    let own = [
        format!("/v1/orders/{order_id}"),
        format!("/v1/sagas/{saga_id}"),
        format!("/v1/orders?customer_id={alice}"),
    ];
    // Another customer's order or saga is answered as an unknown one (a 403 would tell
    // that it exists); another customer's list, named by its id, is a 403.
    let unknown = uuid::Uuid::new_v4();
    let hidden = [
        (own[0].clone(), format!("/v1/orders/{unknown}"), order_id.as_str()),
        (own[1].clone(), format!("/v1/sagas/{unknown}"), saga_id.as_str()),
    ];
    for (path, unknown_path, id) in &hidden {
        let (status, _, body) = send(as_bob(http.get(stack.url(path)))).await;
        let (unknown_status, _, unknown_body) = send(as_bob(http.get(stack.url(unknown_path)))).await;
        assert_eq!(
            (status, unknown_status),
            (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND),
            "bob {path}: {body}"
        );
        let masked = |b: &serde_json::Value, id: &str| b.to_string().replace(id, "<id>");
        assert_eq!(
            masked(&body, id),
            masked(&unknown_body, &unknown.to_string()),
            "the same answer as for an unknown id"
        );
    }
    for path in &own {
        let (status, _, body) = send(as_alice(http.get(stack.url(path)))).await;
        assert_eq!(status, StatusCode::OK, "alice {path}: {body}");
        if path.contains("customer_id") {
            let (status, _, body) = send(as_bob(http.get(stack.url(path)))).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "bob {path}: {body}");
            assert_eq!(body["type"], "https://sagaworks.dev/problems/forbidden");
        }
        let (status, _, _) = send(http.get(stack.url(path)).bearer_auth(admin_token())).await;
        assert_eq!(status, StatusCode::OK, "admin {path}");
    }
    let (_, _, list) = send(as_alice(http.get(stack.url(&format!("/v1/orders?customer_id={alice}"))))).await;
    assert_eq!(list["orders"][0]["order_id"], order_id.as_str());

    // Bob's forbidden attempts left no order of his.
    let (_, bobs) = stack.get(&format!("/v1/orders?customer_id={bob}")).await;
    assert_eq!(bobs["orders"], json!([]));
    assert_eq!(stack.balance(&bob).await, 10_000);
}

#[tokio::test]
async fn admin_endpoints_need_the_admin_role() {
    let stack = Stack::start().await;
    let product = stack.product(100, 10).await;
    let customer = stack.customer(1_000).await;
    let http = anonymous();
    let token = customer_token(&customer);
    let lookalike = sign_hs256(TEST_JWT_SECRET, &claims(&customer, &["customer", "Admin ", "support"]));

    let calls: Vec<(&str, String, Option<Value>)> = vec![
        (
            "POST",
            "/v1/products".into(),
            Some(json!({ "sku": "s-1", "name": "X", "price_cents": 1, "initial_stock": 1 })),
        ),
        ("GET", "/v1/products".into(), None),
        ("GET", format!("/v1/products/{product}"), None),
        ("POST", format!("/v1/products/{product}/stock"), Some(json!({ "quantity": 5 }))),
        (
            "POST",
            "/v1/customers".into(),
            Some(json!({ "name": "Mallory", "initial_credit_cents": 1_000_000 })),
        ),
        ("GET", format!("/v1/customers/{customer}"), None),
        ("POST", format!("/v1/customers/{customer}/credit"), Some(json!({ "amount_cents": 1_000_000 }))),
    ];
    for bearer in [&token, &lookalike] {
        for (method, path, body) in &calls {
            let mut req =
                if *method == "POST" { http.post(stack.url(path)) } else { http.get(stack.url(path)) };
            if let Some(body) = body {
                req = req.json(body);
            }
            let (status, headers, problem) = send(req.bearer_auth(bearer)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {problem}");
            assert_eq!(headers["content-type"], "application/problem+json");
        }
    }
    // Nothing changed: no new product, no stock, no credit, no new customer.
    assert_eq!(stack.stock(&product).await, (10, 0, 0));
    assert_eq!(stack.balance(&customer).await, 1_000);
    let (_, products) = stack.get("/v1/products").await;
    assert_eq!(products["products"].as_array().unwrap().len(), 1);

    // The admin role may do all of it.
    for (method, path, body) in &calls {
        let mut req = if *method == "POST" { http.post(stack.url(path)) } else { http.get(stack.url(path)) };
        if let Some(body) = body {
            req = req.json(body);
        }
        let (status, _, body) = send(req.bearer_auth(admin_token())).await;
        assert!(status.is_success(), "admin {method} {path}: {status} {body}");
    }
    assert_eq!(stack.stock(&product).await, (15, 0, 0));
}

#[tokio::test]
async fn rs256_tokens_verify_against_a_jwks() {
    let stack = Stack::start().await;
    let jwks = JwksServer::start(RS256_JWKS).await;
    let fetched = gateway(&stack, |s| {
        s.auth.jwt_secret = None;
        s.auth.jwks_url = Some(jwks.url.clone());
        s.auth.issuer = Some("https://idp.test".into());
    })
    .await;
    let inline = gateway(&stack, |s| {
        s.auth.jwt_secret = None;
        s.auth.jwks_json = Some(RS256_JWKS.into());
    })
    .await;
    let http = anonymous();
    let mut admin = claims("ops", &["admin"]);
    admin["iss"] = "https://idp.test".into();

    for _ in 0..3 {
        let req = http.get(url(&fetched, "/v1/products")).bearer_auth(sign_rs256(Some(RS256_KID), &admin));
        let (status, _, body) = send(req).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert_eq!(jwks.hits(), 1, "the JWKS is fetched once and cached");
    // A token without kid is checked against the only key.
    let req = http.get(url(&inline, "/v1/products")).bearer_auth(sign_rs256(None, &admin));
    assert_eq!(send(req).await.0, StatusCode::OK);

    let mut wrong_issuer = admin.clone();
    wrong_issuer["iss"] = "https://evil.test".into();
    let refused = [
        ("unknown kid", sign_rs256(Some("rotated-away"), &admin)),
        ("wrong issuer", sign_rs256(Some(RS256_KID), &wrong_issuer)),
        ("HS256 with no secret configured", sign_hs256(TEST_JWT_SECRET, &admin)),
        // The classic confusion: HS256 "signed" with the public key material.
        ("HS256 keyed with the JWKS", sign_hs256(RS256_JWKS, &admin)),
    ];
    for (what, token) in refused {
        let (s, h, b) = send(http.get(url(&fetched, "/v1/products")).bearer_auth(token)).await;
        assert_unauthenticated(s, &h, &b, what);
    }
    // Customers' RS256 tokens get the same ownership rules.
    let customer = stack.customer(1_000).await;
    let mut own = claims(&customer, &[]);
    own["iss"] = "https://idp.test".into();
    let token = sign_rs256(Some(RS256_KID), &own);
    let (status, _, _) =
        send(http.get(url(&fetched, &format!("/v1/orders?customer_id={customer}"))).bearer_auth(&token))
            .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) =
        send(http.get(url(&fetched, &format!("/v1/customers/{customer}"))).bearer_auth(&token)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn rate_limit_answers_429_with_retry_after_then_lets_the_client_in_again() {
    let stack = Stack::start().await;
    let limited = gateway(&stack, |s| {
        s.rate_limit.per_second = 1;
        s.rate_limit.burst = 3;
    })
    .await;
    let http = anonymous();
    let customer = stack.customer(1_000).await;
    let admin = admin_token();

    for i in 0..3 {
        let (status, _, body) = send(http.get(url(&limited, "/v1/products")).bearer_auth(&admin)).await;
        assert_eq!(status, StatusCode::OK, "request {i}: {body}");
    }
    // Over budget: even a write is refused before it reaches a service.
    let product = json!({ "sku": "over-budget", "name": "X", "price_cents": 1, "initial_stock": 1 });
    let (status, headers, problem) =
        send(http.post(url(&limited, "/v1/products")).bearer_auth(&admin).json(&product)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{problem}");
    assert_eq!(headers["content-type"], "application/problem+json");
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(problem["status"], 429);
    let (_, products) = stack.get("/v1/products").await;
    assert_eq!(products["products"], json!([]), "the refused write did not happen");

    // Another client (subject) has its own budget.
    let own_orders = url(&limited, &format!("/v1/orders?customer_id={customer}"));
    let (status, _, _) = send(http.get(&own_orders).bearer_auth(customer_token(&customer))).await;
    assert_eq!(status, StatusCode::OK);

    // Once the bucket has refilled (one request a second) the admin is let in again.
    // Polled instead of sleeping Retry-After: a refused request takes nothing from the
    // bucket (GCRA), and every refusal until then must still be a proper 429. The
    // deadline measures nothing; it only turns a bucket that never refills into a failure.
    let products = url(&limited, "/v1/products");
    sagaworks_test_support::eventually("the admin to be let in again", Duration::from_secs(30), || async {
        let (status, headers, body) = send(http.get(&products).bearer_auth(&admin)).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert!(headers.contains_key("retry-after"), "{headers:?}");
            return None;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        Some(())
    })
    .await;

    // Requests without a valid token are limited per client address.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(send(http.get(url(&limited, "/v1/products"))).await.0);
    }
    assert_eq!(statuses[..3], [StatusCode::UNAUTHORIZED; 3]);
    assert_eq!(statuses[3], StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn the_gateway_refuses_to_start_without_a_signing_key() {
    let mut settings = gateway_settings("https://127.0.0.1:1", "https://127.0.0.1:1", "https://127.0.0.1:1");
    settings.auth.jwt_secret = None;
    let err = gateway::startup::Application::build(settings.clone()).await.err().expect("start-up fails");
    let message = err.to_string();
    assert!(message.contains("APP_AUTH__JWT_SECRET") && message.contains("APP_AUTH__JWKS_URL"), "{message}");

    settings.auth.jwks_json = Some("not json".into());
    assert!(
        gateway::startup::Application::build(settings.clone()).await.is_err(),
        "a broken JWKS is refused"
    );
    settings.auth.jwks_json = None;
    settings.auth.enabled = false;
    assert!(gateway::startup::Application::build(settings).await.is_ok(), "auth explicitly disabled");
}

/// A key rotation at the identity provider: a token whose `kid` the cached
/// JWKS lacks makes the gateway fetch the JWKS again, at most once per
/// `auth.jwks_unknown_kid_refetch_ms`. After the rotation, tokens of the new
/// key are accepted and those of the old one refused; a flood of tokens
/// naming a key nobody has is refused (401 problem+json) and costs the
/// identity provider at most one fetch per interval.
#[tokio::test]
async fn an_unknown_kid_refetches_the_jwks_at_most_once_per_interval() {
    use system_tests::auth::{RS256_JWKS_2, RS256_KID_2, RS256_PRIVATE_PEM_2, sign_rs256_with};
    const REFETCH_MS: u64 = 500;
    let stack = Stack::start().await;
    let jwks = JwksServer::start(RS256_JWKS).await;
    let rotating = gateway(&stack, |s| {
        s.auth.jwt_secret = None;
        s.auth.jwks_url = Some(jwks.url.clone());
        s.auth.jwks_unknown_kid_refetch_ms = REFETCH_MS;
    })
    .await;
    let http = anonymous();
    let products = url(&rotating, "/v1/products");
    let admin = claims("ops", &["admin"]);
    let old_key = sign_rs256(Some(RS256_KID), &admin);
    let new_key = sign_rs256_with(RS256_PRIVATE_PEM_2, Some(RS256_KID_2), &admin);

    let (status, _, body) = send(http.get(&products).bearer_auth(&old_key)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(jwks.hits(), 1);

    // The identity provider rotates: it now publishes the new key only. The
    // new kid is refused until the interval since the last fetch has passed;
    // then one fetch brings the new key.
    jwks.serve(RS256_JWKS_2);
    sagaworks_test_support::eventually(
        "a token of the new key to be accepted",
        Duration::from_secs(30),
        || {
            let req = http.get(&products).bearer_auth(&new_key);
            async move {
                let (status, headers, body) = send(req).await;
                if status == StatusCode::OK {
                    return Some(());
                }
                assert_unauthenticated(status, &headers, &body, "the new kid before the refetch");
                None
            }
        },
    )
    .await;
    assert_eq!(jwks.hits(), 2, "one fetch for the new kid, however often it was presented before");
    let (status, headers, body) = send(http.get(&products).bearer_auth(&old_key)).await;
    assert_unauthenticated(status, &headers, &body, "the old kid after the rotation");

    // A kid nobody issued, over and over: refused, without a fetch per token.
    let nobody = sign_rs256_with(RS256_PRIVATE_PEM_2, Some("never-issued"), &admin);
    let (before, started) = (jwks.hits(), std::time::Instant::now());
    const TOKENS: usize = 40;
    for i in 0..TOKENS {
        let (status, headers, body) = send(http.get(&products).bearer_auth(&nobody)).await;
        assert_unauthenticated(status, &headers, &body, &format!("unknown kid, token {i}"));
        assert!(body["detail"].as_str().is_some_and(|d| d.contains("kid")), "{body}");
    }
    let elapsed = started.elapsed();
    let fetches = jwks.hits() - before;
    let allowed = 1 + (elapsed.as_millis() / u128::from(REFETCH_MS)) as usize;
    assert!(
        fetches <= allowed,
        "{fetches} JWKS fetches for {TOKENS} tokens in {elapsed:?}: at most {allowed}"
    );
}

/// `auth.admin_role` names the role that opens the admin endpoints: with it
/// set to `ops`, an `ops` token may call them (and act for any customer),
/// while a token with the default `admin` role gets 403 and changes nothing.
#[tokio::test]
async fn the_configured_admin_role_opens_the_admin_endpoints_and_the_default_one_does_not() {
    let stack = Stack::start().await;
    let ops_gateway = gateway(&stack, |s| s.auth.admin_role = "ops".into()).await;
    let customer = stack.customer(1_000).await;
    let http = anonymous();
    let ops = sign_hs256(TEST_JWT_SECRET, &claims("operator", &["ops"]));
    let admin = admin_token();
    let calls: Vec<(&str, String, Option<Value>)> = vec![
        (
            "POST",
            "/v1/products".into(),
            Some(json!({ "sku": "ops-1", "name": "X", "price_cents": 1, "initial_stock": 1 })),
        ),
        ("GET", "/v1/products".into(), None),
        ("GET", format!("/v1/customers/{customer}"), None),
        ("POST", format!("/v1/customers/{customer}/credit"), Some(json!({ "amount_cents": 500 }))),
        ("GET", format!("/v1/orders?customer_id={customer}"), None),
    ];
    let call = |bearer: &str, method: &str, path: &str, body: &Option<Value>| {
        let path = url(&ops_gateway, path);
        let mut req = if method == "POST" { http.post(path) } else { http.get(path) };
        if let Some(body) = body {
            req = req.json(body);
        }
        send(req.bearer_auth(bearer))
    };

    for (method, path, body) in &calls {
        let (status, headers, problem) = call(&admin, method, path, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "admin {method} {path}: {problem}");
        assert_eq!(headers["content-type"], "application/problem+json");
        assert_eq!(problem["status"], 403);
    }
    assert_eq!(stack.balance(&customer).await, 1_000, "the refused credit did not happen");
    let (_, products) = stack.get("/v1/products").await;
    assert_eq!(products["products"], json!([]), "the refused product was not created");

    for (method, path, body) in &calls {
        let (status, _, body) = call(&ops, method, path, body).await;
        assert!(status.is_success(), "ops {method} {path}: {status} {body}");
    }
    assert_eq!(stack.balance(&customer).await, 1_500);
    let (_, products) = stack.get("/v1/products").await;
    assert_eq!(products["products"].as_array().unwrap().len(), 1);
}

// --- The JWT secret, the deployment profile, rate limits behind a proxy,
// --- the services' database roles

/// A gateway whose backends are unreachable: enough for what the guard answers alone
/// (401, 429) and for start-up checks.
async fn gateway_alone(tweak: impl FnOnce(&mut gateway::config::Settings)) -> Running {
    let mut s = gateway_settings("https://127.0.0.1:1", "https://127.0.0.1:1", "https://127.0.0.1:1");
    tweak(&mut s);
    start_gateway_with(s).await
}

/// A bucket of `burst` requests refilled at one an hour: no refill can happen during a
/// test, so every 429 below follows from the requests sent, not from timing.
fn hourly(s: &mut gateway::config::Settings, burst: u32) {
    s.rate_limit.burst = burst;
    s.rate_limit.refill_interval_ms = Some(3_600_000);
}

fn assert_limited(status: StatusCode, headers: &reqwest::header::HeaderMap, what: &str) {
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{what}");
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry_after > 60, "{what}: Retry-After {retry_after}, the bucket refills hourly");
}

/// The gateway binary with nothing but `env` (and PATH, and `APP_ENVIRONMENT=development`
/// unless `env` sets it), its stdout and stderr captured.
fn spawn_gateway(env: &[(&str, &str)]) -> std::process::Child {
    let mut command = std::process::Command::new(system_tests::processes::binary("gateway"));
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("APP_ENVIRONMENT", "development")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    command.spawn().expect("start the gateway binary")
}

/// Everything the process wrote to stdout and stderr, once it has exited.
async fn exit_and_output(child: std::process::Child) -> (std::process::ExitStatus, String) {
    // The deadline measures nothing: it only turns a process that never exits into a failure.
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || child.wait_with_output().expect("wait for the gateway")),
    )
    .await
    .expect("the gateway exits")
    .expect("the waiting thread");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status, text)
}

/// `auth.jwt_secret` is a `SecretString`: the gateway logs its settings at start-up
/// (debug level on, every log line captured) with the secret as `[REDACTED]`, and the
/// secret appears in no line of its output.
#[tokio::test]
async fn the_gateway_logs_its_settings_at_start_up_without_the_jwt_secret() {
    const SECRET: &str = "process-test-hs256-secret-9f8e7d6c5b4a39281706";
    let port = sagaworks_test_support::free_port().to_string();
    let child = spawn_gateway(&[
        ("APP_HTTP__PORT", &port),
        ("APP_AUTH__JWT_SECRET", SECRET),
        ("APP_TELEMETRY__LOG_LEVEL", "debug"),
        ("APP_TELEMETRY__LOG_FORMAT", "json"),
        ("APP_ORDER__URL", "http://127.0.0.1:1"),
        ("APP_INVENTORY__URL", "http://127.0.0.1:1"),
        ("APP_PAYMENT__URL", "http://127.0.0.1:1"),
    ]);
    let http = anonymous();
    let ready = format!("http://127.0.0.1:{port}/health/ready");
    sagaworks_test_support::eventually("the gateway to be ready", Duration::from_secs(60), || async {
        let res = http.get(&ready).send().await.ok()?;
        (res.status() == StatusCode::OK).then_some(())
    })
    .await;
    // A token signed with the secret passes the guard (and fails further on: no backends).
    let token = sign_hs256(SECRET, &claims("ops", &["admin"]));
    let (status, _, _) =
        send(http.get(format!("http://127.0.0.1:{port}/v1/products")).bearer_auth(&token)).await;
    assert_ne!(status, StatusCode::UNAUTHORIZED, "the configured secret verifies tokens");
    let sent = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert!(sent.is_ok_and(|s| s.success()), "SIGTERM sent");
    let (exit, output) = exit_and_output(child).await;
    assert!(exit.success(), "{exit}\n{output}");

    let settings_line = output
        .lines()
        .find(|line| line.contains("gateway settings"))
        .unwrap_or_else(|| panic!("no settings line in the start-up logs:\n{output}"));
    assert!(!output.contains(SECRET), "the JWT secret is in the gateway's output:\n{output}");
    assert!(settings_line.contains("jwt_secret") && settings_line.contains("[REDACTED]"), "{settings_line}");
}

/// `environment` (APP_ENVIRONMENT): outside `development` the gateway refuses to start
/// with the development secret, a secret shorter than 32 bytes, auth turned off, no
/// issuer or audience, a JWKS URL that is not https, or TLS off, with an error naming
/// the variables (never the secret); in development all of these start.
#[tokio::test]
async fn the_gateway_refuses_every_unsafe_setting_in_production_and_accepts_it_in_development() {
    use gateway::config::{DEV_ONLY_INSECURE_JWT_SECRET, Environment};
    let short = "0123456789abcdef0123456789abcde"; // 31 bytes
    let strong = "a-production-secret-of-more-than-32-bytes-3f9c1e";
    type Tweak<'a> = &'a dyn Fn(&mut gateway::config::Settings);
    let build = |environment: Environment, tweak: Tweak| {
        let mut s = gateway_settings("https://127.0.0.1:1", "https://127.0.0.1:1", "https://127.0.0.1:1");
        s.environment = environment;
        s.auth.issuer = Some("https://idp.example/".into());
        s.auth.audience = Some("sagaworks".into());
        s.auth.jwt_secret = Some(strong.into());
        tweak(&mut s);
        gateway::startup::Application::build(s)
    };
    let http = |s: &mut gateway::config::Settings| {
        for client in [&mut s.order, &mut s.inventory, &mut s.payment] {
            client.url = client.url.replace("https://", "http://");
        }
    };
    let refused: [(&str, Tweak, &[&str]); 9] = [
        (
            "the development secret",
            &|s| s.auth.jwt_secret = Some(DEV_ONLY_INSECURE_JWT_SECRET.into()),
            &["APP_AUTH__JWT_SECRET", "APP_ENVIRONMENT", "development-only"],
        ),
        (
            "a 31-byte secret",
            &|s| s.auth.jwt_secret = Some(short.into()),
            &["APP_AUTH__JWT_SECRET", "APP_ENVIRONMENT", "31 bytes"],
        ),
        ("auth turned off", &|s| s.auth.enabled = false, &["APP_AUTH__ENABLED", "APP_ENVIRONMENT"]),
        ("no issuer", &|s| s.auth.issuer = None, &["APP_AUTH__ISSUER", "APP_ENVIRONMENT"]),
        ("no audience", &|s| s.auth.audience = None, &["APP_AUTH__AUDIENCE", "APP_ENVIRONMENT"]),
        (
            "a JWKS over http",
            &|s| {
                s.auth.jwt_secret = None;
                s.auth.jwks_url = Some("http://idp.example/jwks.json".into());
            },
            &["APP_AUTH__JWKS_URL", "APP_ENVIRONMENT"],
        ),
        (
            "TLS off",
            &|s| {
                s.tls = Default::default();
                http(s);
            },
            &["tls", "APP_ENVIRONMENT"],
        ),
        (
            "rate limits off",
            &|s| s.rate_limit.enabled = false,
            &["rate_limit.enabled is refused", "APP_ENVIRONMENT"],
        ),
        (
            "a leeway over five minutes",
            &|s| s.auth.leeway_secs = gateway::config::MAX_LEEWAY_SECS + 1,
            &["auth.leeway_secs is refused", "APP_ENVIRONMENT", "300 s"],
        ),
    ];
    for (what, tweak, names) in refused {
        let err =
            build(Environment::Production, tweak).await.err().unwrap_or_else(|| panic!("{what} accepted"));
        let message = err.to_string();
        for name in names {
            assert!(message.contains(name), "{what}: {message}");
        }
        assert!(!message.contains(DEV_ONLY_INSECURE_JWT_SECRET) && !message.contains(short), "{message}");
        assert!(build(Environment::Development, tweak).await.is_ok(), "{what} is fine in development");
    }
    let accepted: [(&str, Tweak); 3] = [
        ("a strong secret", &|s| s.auth.jwt_secret = Some(strong.into())),
        ("a leeway of five minutes", &|s| s.auth.leeway_secs = gateway::config::MAX_LEEWAY_SECS),
        ("RS256 only", &|s| {
            s.auth.jwt_secret = None;
            s.auth.jwks_json = Some(RS256_JWKS.into());
        }),
    ];
    for (what, tweak) in accepted {
        assert!(build(Environment::Production, tweak).await.is_ok(), "{what} in production");
    }

    // The real binary, configured the way the k8s prod overlay configures it but with the
    // development secret: it exits non-zero with the error, before serving anything.
    let port = sagaworks_test_support::free_port().to_string();
    let child = spawn_gateway(&[
        ("APP_HTTP__PORT", &port),
        ("APP_ENVIRONMENT", "production"),
        ("APP_AUTH__JWT_SECRET", DEV_ONLY_INSECURE_JWT_SECRET),
    ]);
    let (exit, output) = exit_and_output(child).await;
    assert!(!exit.success(), "the gateway started with the development secret in production:\n{output}");
    assert!(output.contains("APP_AUTH__JWT_SECRET") && output.contains("APP_ENVIRONMENT"), "{output}");
}

/// A JWKS outage that hangs (the provider accepts and never answers): one fetch runs at a
/// time, outside any lock, so tokens of a cached key go on being verified while it hangs,
/// and a second token of an unknown kid waits for that fetch instead of starting another.
#[tokio::test]
async fn a_hanging_jwks_fetch_holds_up_neither_cached_keys_nor_starts_a_second_fetch() {
    use system_tests::auth::{RS256_KID_2, RS256_PRIVATE_PEM_2, sign_rs256_with};
    let stack = Stack::start().await;
    let jwks = JwksServer::start(RS256_JWKS).await;
    let gateway = gateway(&stack, |s| {
        s.auth.jwt_secret = None;
        s.auth.jwks_url = Some(jwks.url.clone());
        s.auth.jwks_unknown_kid_refetch_ms = 0;
    })
    .await;
    let http = anonymous();
    let products = url(&gateway, "/v1/products");
    let admin = claims("ops", &["admin"]);
    let known = sign_rs256(Some(RS256_KID), &admin);
    let (status, _, body) = send(http.get(&products).bearer_auth(&known)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(jwks.hits(), 1);

    jwks.hang();
    let unknown = sign_rs256_with(RS256_PRIVATE_PEM_2, Some(RS256_KID_2), &admin);
    let first = tokio::spawn(send(http.get(&products).bearer_auth(&unknown)));
    sagaworks_test_support::eventually(
        "the fetch for the new kid to reach the provider",
        Duration::from_secs(30),
        || {
            let hits = jwks.hits();
            async move { (hits == 2).then_some(()) }
        },
    )
    .await;
    let second = tokio::spawn(send(http.get(&products).bearer_auth(&unknown)));
    for i in 0..20 {
        let (status, _, body) = send(http.get(&products).bearer_auth(&known)).await;
        assert_eq!(status, StatusCode::OK, "cached key, request {i}: {body}");
    }
    assert!(!first.is_finished(), "the cached key was served while the fetch still hangs");

    // The hanging fetch times out: both unknown-kid tokens are refused, after one fetch.
    for pending in [first, second] {
        let (status, headers, body) = pending.await.unwrap();
        assert_unauthenticated(status, &headers, &body, "the new kid while the provider hangs");
    }
    assert_eq!(jwks.hits(), 2, "one fetch for both tokens of the new kid");
}

/// Behind a trusted proxy (127.0.0.1 here, plus 10.0.0.0/8), an anonymous client is
/// the right-most `X-Forwarded-For` address that is not a trusted proxy: two clients
/// behind the same proxy get a bucket each, text a client prepends does not move it to
/// another bucket, trusted hops in the chain are stepped over, and the proxy's own
/// requests have their own bucket.
#[tokio::test]
async fn anonymous_clients_behind_a_trusted_proxy_get_a_bucket_each() {
    let limited = gateway_alone(|s| {
        hourly(s, 2);
        s.rate_limit.trusted_proxies = vec!["127.0.0.1".into(), "10.0.0.0/8".into()];
    })
    .await;
    let http = anonymous();
    let products = url(&limited, "/v1/products");
    let via_proxy = |forwarded_for: &str| http.get(&products).header("x-forwarded-for", forwarded_for);

    for client in ["198.51.100.1", "198.51.100.2"] {
        for i in 0..2 {
            let (status, _, body) = send(via_proxy(client)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{client} request {i} is within its budget: {body}");
        }
        let (status, headers, _) = send(via_proxy(client)).await;
        assert_limited(status, &headers, &format!("{client}'s third request"));
    }
    let (status, headers, _) = send(via_proxy("203.0.113.77, 198.51.100.1")).await;
    assert_limited(status, &headers, "198.51.100.1 with a made-up address prepended");
    let (status, headers, _) = send(via_proxy("198.51.100.2, 10.1.2.3")).await;
    assert_limited(status, &headers, "198.51.100.2 behind a second trusted proxy");
    let (status, _, _) = send(http.get(&products)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the proxy's own requests: a bucket of their own");
}

/// `X-Forwarded-For` from a peer that is not a trusted proxy is ignored: a client
/// cannot spoof its way into a fresh bucket, whatever address it claims (even one of
/// the trusted proxies').
#[tokio::test]
async fn a_spoofed_x_forwarded_for_from_an_untrusted_peer_does_not_escape_its_bucket() {
    let limited = gateway_alone(|s| {
        hourly(s, 2);
        s.rate_limit.trusted_proxies = vec!["192.0.2.0/24".into()];
    })
    .await;
    let http = anonymous();
    let products = url(&limited, "/v1/products");
    let claiming = |forwarded_for: &str| http.get(&products).header("x-forwarded-for", forwarded_for);

    for (i, claim) in ["198.51.100.1", "198.51.100.2"].into_iter().enumerate() {
        let (status, _, body) = send(claiming(claim)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "request {i} is within the budget: {body}");
    }
    for claim in ["198.51.100.3", "192.0.2.1", "203.0.113.9, 192.0.2.1"] {
        let (status, headers, _) = send(claiming(claim)).await;
        assert_limited(status, &headers, &format!("claiming {claim}"));
    }
    let (status, headers, _) = send(http.get(&products)).await;
    assert_limited(status, &headers, "without the header");
}

/// A verified token's subject is its bucket: one customer exhausting its budget leaves
/// another's untouched, a different forwarded address does not help the exhausted one,
/// and anonymous requests from the same address are counted apart.
#[tokio::test]
async fn authenticated_subjects_have_a_bucket_each() {
    let stack = Stack::start().await;
    let limited = gateway(&stack, |s| {
        hourly(s, 2);
        s.rate_limit.trusted_proxies = vec!["127.0.0.1".into()];
    })
    .await;
    let (alice, bob) = (stack.customer(1_000).await, stack.customer(1_000).await);
    let http = anonymous();
    let orders_of = |customer: &str| {
        http.get(url(&limited, &format!("/v1/orders?customer_id={customer}")))
            .bearer_auth(customer_token(customer))
    };

    for i in 0..2 {
        let (status, _, body) = send(orders_of(&alice)).await;
        assert_eq!(status, StatusCode::OK, "alice request {i}: {body}");
    }
    let (status, headers, _) = send(orders_of(&alice)).await;
    assert_limited(status, &headers, "alice's third request");
    let (status, headers, _) = send(orders_of(&alice).header("x-forwarded-for", "198.51.100.1")).await;
    assert_limited(status, &headers, "alice from another address");

    for i in 0..2 {
        let (status, _, body) = send(orders_of(&bob)).await;
        assert_eq!(status, StatusCode::OK, "bob request {i}, after alice ran out: {body}");
    }
    let (status, headers, _) = send(orders_of(&bob)).await;
    assert_limited(status, &headers, "bob's third request");
    let (status, _, _) = send(http.get(url(&limited, "/v1/products"))).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "anonymous requests from the same address: their own bucket"
    );
}

/// Drops the roles and databases a test made on the shared server.
struct DropRoles {
    admin_url: String,
    databases: Vec<String>,
    roles: Vec<String>,
}

impl Drop for DropRoles {
    fn drop(&mut self) {
        let mut sql = String::new();
        for db in &self.databases {
            sql.push_str(&format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE);\n"));
        }
        for role in &self.roles {
            sql.push_str(&format!("DROP ROLE IF EXISTS \"{role}\";\n"));
        }
        let _ = psql(&self.admin_url, &sql);
    }
}

fn psql(url: &str, sql: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new("psql")
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("psql (scripts/install-deps installs it)");
    child.stdin.take().expect("stdin").write_all(sql.as_bytes()).expect("feed psql");
    child.wait_with_output().expect("psql runs")
}

/// `scripts/dev-up` gives each service two login roles (services.toml's `database.role`
/// and `<role>_owner`), made by dev-up's own SQL, read from the script and run on the
/// test server for fresh names. Neither is a superuser or may create roles or databases;
/// the owner runs the service's real migrations; the runtime role, which the service
/// serves as, reads and writes what they created but cannot create, change or drop
/// anything; and neither reaches another service's database.
#[tokio::test]
async fn dev_up_service_roles_are_unprivileged_split_and_reach_only_their_own_database() {
    use sqlx::Connection;
    use sqlx::postgres::{PgConnectOptions, PgConnection};
    use std::str::FromStr;
    let listed = system_tests::services::ServicesToml::workspace();
    let services: Vec<&str> = listed.with_database().map(|(s, _)| s.name.as_str()).collect();
    let mut roles: Vec<&str> = listed.with_database().map(|(_, db)| db.role.as_str()).collect();
    roles.sort_unstable();
    roles.dedup();
    assert_eq!(roles.len(), services.len(), "services.toml: a role per service");
    assert!(!roles.contains(&"postgres"), "services.toml: no service logs in as postgres");
    let root = system_tests::services::workspace_root();
    let script = std::fs::read_to_string(root.join("scripts/dev-up")).expect("scripts/dev-up");
    let start = script.find("<<SQL").expect("dev-up creates the roles in a <<SQL here-document");
    let body = &script[start..][script[start..].find('\n').expect("here-document") + 1..];
    let sql = &body[..body.find("\nSQL\n").expect("the here-document ends with SQL")];
    assert!(
        script.contains(
            r#"role="$(sw_db_role "$svc")" owner="$(sw_db_owner "$svc")" db="$(sw_db_name "$svc" "$DBP")""#
        ),
        "dev-up's role and database names (services.toml)"
    );
    assert!(
        script.contains(r#""APP_DATABASE__URL=postgres://$(sw_db_role "$svc")@"#)
            && script.contains(r#""APP_DATABASE__OWNER_URL=postgres://$(sw_db_owner "$svc")@"#),
        "dev-up starts each service as its runtime role, migrating as the owner"
    );

    let admin_url = sagaworks_test_support::TestDatabase::admin_url();
    let prefix = format!("sw_roles_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let names = |svc: &str| {
        (format!("{prefix}_{svc}_svc"), format!("{prefix}_{svc}_svc_owner"), format!("{prefix}_{svc}"))
    };
    let _cleanup = DropRoles {
        admin_url: admin_url.clone(),
        databases: services.iter().map(|s| names(s).2).collect(),
        roles: services.iter().flat_map(|s| [names(s).0, names(s).1]).collect(),
    };
    for &svc in &services {
        let (role, owner, db) = names(svc);
        let sql = sql.replace("${role}", &role).replace("${owner}", &owner).replace("${db}", &db);
        let out = psql(&admin_url, &sql);
        assert!(out.status.success(), "dev-up's SQL for {svc}: {}", String::from_utf8_lossy(&out.stderr));
    }

    let admin = PgConnectOptions::from_str(&admin_url).expect("SW_TEST_PG_URL");
    let url = |role: &str, db: &str| {
        let mut url = reqwest::Url::parse(&admin_url).expect("SW_TEST_PG_URL is a URL");
        url.set_username(role).unwrap();
        url.set_password(None).unwrap();
        url.set_path(db);
        url.to_string()
    };
    let denied = |result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>, what: &str| match result {
        Err(sqlx::Error::Database(e)) => assert_eq!(e.code().as_deref(), Some("42501"), "{what}: {e}"),
        other => panic!("{what}: not refused: {other:?}"),
    };
    for &svc in &services {
        let (role, owner, db) = names(svc);
        // The service's real migrations, as the owner (what `migrate = true` does at start-up).
        let settings = sagaworks_config::DatabaseSettings {
            url: url(&role, &db),
            owner_url: url(&owner, &db),
            ..Default::default()
        };
        let mut migrators = match svc {
            "order" => order::startup::migrators(),
            "inventory" => inventory::startup::migrators(),
            "payment" => payment::startup::migrators(),
            other => panic!("no migrators known for {other}"),
        };
        sagaworks_runtime::db::migrate_as_owner(&settings, &mut migrators)
            .await
            .unwrap_or_else(|e| panic!("{svc}'s migrations as {owner}: {e}"));

        for who in [&role, &owner] {
            let mut conn = PgConnection::connect_with(&admin.clone().username(who).database(&db))
                .await
                .unwrap_or_else(|e| panic!("{who} connects to {db}: {e}"));
            let privileges: (bool, bool, bool, bool, bool) = sqlx::query_as(
                "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls \
                 FROM pg_roles WHERE rolname = current_user",
            )
            .fetch_one(&mut conn)
            .await
            .expect("its own attributes");
            assert_eq!(
                privileges,
                (false, false, false, false, false),
                "{who}: super, createrole, createdb, replication, bypassrls"
            );
            conn.close().await.ok();
        }

        let mut runtime =
            PgConnection::connect_with(&admin.clone().username(&role).database(&db)).await.unwrap();
        let outbox_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(&mut runtime)
            .await
            .unwrap_or_else(|e| panic!("{role} reads the migrated outbox: {e}"));
        assert_eq!(outbox_rows, 0);
        sqlx::query("DELETE FROM outbox").execute(&mut runtime).await.expect("DML on the migrated tables");
        denied(sqlx::query("CREATE TABLE intruder (id int)").execute(&mut runtime).await, "CREATE TABLE");
        denied(sqlx::query("DROP TABLE outbox").execute(&mut runtime).await, "DROP TABLE");
        denied(sqlx::query("ALTER TABLE outbox ADD COLUMN x int").execute(&mut runtime).await, "ALTER TABLE");
        denied(sqlx::query("TRUNCATE outbox").execute(&mut runtime).await, "TRUNCATE");
        runtime.close().await.ok();

        for &other in services.iter().filter(|o| **o != svc) {
            let (_, _, other_db) = names(other);
            for who in [&role, &owner] {
                let refused =
                    PgConnection::connect_with(&admin.clone().username(who).database(&other_db)).await;
                match refused {
                    Err(sqlx::Error::Database(e)) => {
                        assert_eq!(e.code().as_deref(), Some("42501"), "{who} -> {other_db}: {e}");
                    }
                    Err(e) => panic!("{who} -> {other_db}: not a permission error: {e}"),
                    Ok(_) => panic!("{who} connected to {other_db}"),
                }
            }
        }
    }
}

/// A backend (inventory here; order and payment share `ServiceHost`) in production
/// refuses TLS off, fault injection and a plaintext or anonymous Kafka at start-up,
/// naming the setting; development takes each, and production with TLS on, no faults
/// and its own Kafka user over SASL_SSL starts.
#[tokio::test]
async fn a_backend_refuses_tls_off_fault_injection_and_a_plaintext_kafka_in_production() {
    use sagaworks_config::Environment;
    let db = sagaworks_test_support::TestDatabase::create("prod_inventory").await;
    let broker = sagaworks_test_support::Broker::start().await;
    let safe = inventory::config::Settings {
        environment: Environment::Production,
        tls: sagaworks_test_support::certs::tls("inventory"),
        grpc: sagaworks_config::ListenSettings::new("127.0.0.1", 0),
        http: sagaworks_config::ListenSettings::new("127.0.0.1", 0),
        database: db.settings(),
        kafka: broker.kafka_settings_as("inventory"),
        ..Default::default()
    };
    type Tweak<'a> = &'a dyn Fn(&mut inventory::config::Settings);
    let unsafe_settings: [(&str, Tweak, &str); 5] = [
        ("TLS off", &|s| s.tls = Default::default(), "tls is refused"),
        ("fault injection", &|s| s.fault.enabled = true, "fault.enabled is refused"),
        (
            "plaintext Kafka",
            &|s| s.kafka.security_protocol = sagaworks_config::KafkaSecurity::Plaintext,
            "kafka.security_protocol is refused",
        ),
        (
            "plaintext Kafka through the extra properties",
            &|s| {
                s.kafka.properties.insert("security.protocol".into(), "PLAINTEXT".into());
            },
            "kafka.security_protocol is refused",
        ),
        ("no Kafka password", &|s| s.kafka.sasl_password.clear(), "kafka.sasl_password is refused"),
    ];
    for (what, tweak, says) in unsafe_settings {
        let mut settings = safe.clone();
        tweak(&mut settings);
        let err = inventory::startup::Application::build(settings.clone())
            .await
            .err()
            .unwrap_or_else(|| panic!("{what} accepted in production"));
        let message = err.to_string();
        assert!(message.contains(says) && message.contains("APP_ENVIRONMENT"), "{what}: {message}");
        settings.environment = Environment::Development;
        assert!(
            inventory::startup::Application::build(settings).await.is_ok(),
            "{what}: fine in development"
        );
    }
    assert!(inventory::startup::Application::build(safe).await.is_ok(), "production, TLS on, no faults");
}

/// A backend's settings one test hook or weak setting away from production-safe.
type BackendTweak<S> = (&'static str, Box<dyn Fn(&mut S)>);

/// The tweaks every backend shares (the `HostSettings` fields and the outbox relay), each
/// with the setting production must name when it refuses it.
macro_rules! host_tweaks {
    ($settings:ty) => {{
        use sagaworks_config::KafkaSecurity;
        let protocol = "kafka.properties.\"security.protocol\"";
        let property = |key: &str, value: &str| (key.to_string(), value.to_string());
        let tweaks: Vec<BackendTweak<$settings>> = vec![
            ("tls", Box::new(|s| s.tls = Default::default())),
            ("fault.enabled", Box::new(|s| s.fault.enabled = true)),
            (
                "outbox.crash_point",
                Box::new(|s| s.outbox.crash_point = sagaworks_outbox::RelayCrashPoint::AfterProduce),
            ),
            ("kafka.security_protocol", Box::new(|s| s.kafka.security_protocol = KafkaSecurity::Plaintext)),
            (
                "kafka.security_protocol",
                Box::new(move |s| {
                    s.kafka.properties.extend([property("security.protocol", "SASL_PLAINTEXT")])
                }),
            ),
            ("kafka.sasl_password", Box::new(|s| s.kafka.sasl_password.clear())),
            (
                protocol,
                Box::new(move |s| {
                    s.kafka.security_protocol = KafkaSecurity::Plaintext;
                    s.kafka.properties.extend([property("security.protocol", "SASL_SSL")]);
                }),
            ),
            (protocol, Box::new(move |s| s.kafka.properties.extend([property("security.protocol", "SSL")]))),
            (
                "kafka.sasl_password",
                Box::new(|s| s.kafka.sasl_password = "dev-only-order-kafka-password".into()),
            ),
            (
                "database.url",
                Box::new(|s| {
                    s.database.url = "postgres://svc:inventory-dev-password@db:5432/sagaworks".into()
                }),
            ),
            (
                "database.owner_url",
                Box::new(|s| {
                    s.database.owner_url = "postgres://owner:dev-only-payment-owner-password@db/x".into()
                }),
            ),
        ];
        tweaks
    }};
}

/// A backend's production-safe settings: TLS on, its own Kafka user over SASL_SSL,
/// passwords of its own.
trait ProductionSafe {
    fn production_safe(service: &str) -> Self;
}

macro_rules! impl_production_safe {
    ($($settings:ty),*) => {$(
        impl ProductionSafe for $settings {
            fn production_safe(service: &str) -> Self {
                let mut s = Self::default();
                s.environment = sagaworks_config::Environment::Production;
                s.tls = sagaworks_test_support::certs::tls(service);
                s.kafka.security_protocol = sagaworks_config::KafkaSecurity::SaslSsl;
                s.kafka.sasl_username = service.into();
                s.kafka.sasl_password = "this-deployments-own-kafka-password".into();
                s.database.url = format!("postgres://{service}_svc:its-own-password@db:5432/sagaworks_{service}");
                s.database.owner_url = format!("postgres://{service}_svc_owner:its-own-too@db:5432/sagaworks_{service}");
                s
            }
        }
    )*};
}
impl_production_safe!(order::config::Settings, inventory::config::Settings, payment::config::Settings);

/// Each tweak of `tweaks` on `safe`: refused in production by the host's check (what
/// `ServiceHost::build` runs first) with an error naming the setting, taken in development.
fn assert_each_refused<S: Clone>(
    service: &str,
    safe: &S,
    tweaks: Vec<BackendTweak<S>>,
    check: impl Fn(&S) -> Result<(), sagaworks_runtime::HostError>,
    develop: impl Fn(&mut S),
) {
    let check = |s: &S| check(s).map_err(|e| e.to_string());
    assert_eq!(check(safe), Ok(()), "{service}: the safe settings");
    for (setting, tweak) in tweaks {
        let mut settings = safe.clone();
        tweak(&mut settings);
        let err = check(&settings).expect_err(&format!("{service}: {setting} accepted in production"));
        let message = err.to_string();
        assert!(
            message.contains(&format!("{setting} is refused")) && message.contains("APP_ENVIRONMENT"),
            "{service}, {setting}: {message}"
        );
        develop(&mut settings);
        assert_eq!(check(&settings), Ok(()), "{service}: {setting} is fine in development");
    }
}

/// Production refuses every test hook and weak setting of every backend, naming it: TLS
/// off, `/fault`, the outbox's, the consumer's and the saga's crash points and faults,
/// a plaintext Kafka (also through `properties."security.protocol"`), SASL without the
/// service's user (also through the properties), `ssl` without a client certificate, a
/// committed development password for Kafka or the database. (The gateway's are in the
/// test above; an inventory built for real in the one below.) Then the payment binary,
/// started in production with its outbox crash point, exits non-zero naming it.
#[tokio::test]
async fn every_backend_refuses_each_test_hook_and_weak_setting_in_production() {
    use sagaworks_config::Environment::Development;
    use sagaworks_outbox::ConsumerCrashPoint;

    let safe = order::config::Settings::production_safe("order");
    let mut tweaks = host_tweaks!(order::config::Settings);
    tweaks.push((
        "consumer.crash_point",
        Box::new(|s| s.consumer.crash_point = ConsumerCrashPoint::BeforeOffsetCommit),
    ));
    tweaks.push(("saga.crash_point", Box::new(|s| s.saga.crash_point = "after_call:charge_payment".into())));
    tweaks.push(("saga.faults", Box::new(|s| s.saga.faults = "fail:charge_payment".into())));
    assert_each_refused("order", &safe, tweaks, |s| s.host().check(), |s| s.environment = Development);

    let safe = inventory::config::Settings::production_safe("inventory");
    let mut tweaks = host_tweaks!(inventory::config::Settings);
    tweaks.push((
        "consumer.crash_point",
        Box::new(|s| s.consumer.crash_point = ConsumerCrashPoint::BeforeOffsetCommit),
    ));
    assert_each_refused("inventory", &safe, tweaks, |s| s.host().check(), |s| s.environment = Development);

    let safe = payment::config::Settings::production_safe("payment");
    let tweaks = host_tweaks!(payment::config::Settings);
    assert_each_refused("payment", &safe, tweaks, |s| s.host().check(), |s| s.environment = Development);

    // The binary: the check runs before it touches its database or the broker.
    let tls = sagaworks_test_support::certs::tls("payment");
    let out = std::process::Command::new(system_tests::processes::binary("payment"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("APP_ENVIRONMENT", "production")
        .env("APP_TLS__CA_FILE", &tls.ca_file)
        .env("APP_TLS__CERT_FILE", &tls.cert_file)
        .env("APP_TLS__KEY_FILE", &tls.key_file)
        .env("APP_KAFKA__SECURITY_PROTOCOL", "sasl_ssl")
        .env("APP_KAFKA__SASL_USERNAME", "payment")
        .env("APP_KAFKA__SASL_PASSWORD", "this-deployments-own-kafka-password")
        .env("APP_OUTBOX__CRASH_POINT", "after_produce")
        .output()
        .expect("the payment binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "payment started in production with a crash point:\n{stderr}");
    assert!(
        stderr.contains("outbox.crash_point is refused") && stderr.contains("APP_ENVIRONMENT"),
        "{stderr}"
    );
}

/// The public edge bounds what one client can hold: a connection that does not finish
/// its headers is closed after `header_read_timeout_ms`, a request not answered within
/// `request_timeout_ms` gets a 504 problem+json, and connections beyond
/// `max_connections` wait until one closes.
#[tokio::test]
async fn the_gateway_bounds_header_time_request_time_and_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (hung, _held) = system_tests::unanswering_server().await;
    let mut settings = gateway_settings(&hung, &hung, &hung);
    // The downstream never answers and the client would wait a minute for it.
    settings.order.timeout_ms = 60_000;
    settings.order.routes.clear();
    settings.api.order_wait_ms = 100;
    settings.server.header_read_timeout_ms = 300;
    settings.server.request_timeout_ms = 500;
    let gateway = start_gateway_with(settings).await;
    let addr = format!("127.0.0.1:{}", gateway.http_port);

    // Slowloris: half a request's headers, then nothing. The server closes the connection.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(30), slow.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the connection is still open long after the header-read timeout");

    // A request that outlives request_timeout_ms: 504 problem+json, not a minute's wait.
    let order = uuid::Uuid::now_v7();
    let req = anonymous().get(url(&gateway, &format!("/v1/orders/{order}"))).bearer_auth(admin_token());
    let (status, headers, body) = send(req).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(body["detail"].as_str().is_some_and(|d| d.contains("longer than the gateway allows")), "{body}");

    // Two connections held (each served once, then idle): a third is not served until
    // one of them closes.
    let mut settings = gateway_settings(&hung, &hung, &hung);
    settings.server.max_connections = 2;
    let capped = start_gateway_with(settings).await;
    let addr = format!("127.0.0.1:{}", capped.http_port);
    let hold = || async {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        c.write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 512];
        let n = c.read(&mut buf).await.unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
            "a held connection is served"
        );
        c
    };
    let (first, _second) = (hold().await, hold().await);
    let url = format!("http://{addr}/health/live");
    let third = tokio::spawn(async move { reqwest::Client::new().get(url).send().await.map(|r| r.status()) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!third.is_finished(), "a third connection was served while two were held");
    drop(first);
    assert_eq!(third.await.unwrap().unwrap(), StatusCode::OK, "served once a connection closed");
}

/// Kafka with a SASL_SSL listener, a SCRAM user per service and the ACLs of services.toml
/// (scripts/kafka's secure mode, which creates the topics beforehand): a service writes its
/// own topics and reads what it consumes in its own consumer group; the broker refuses it
/// another service's topic (also one it consumes), a topic it does not consume, creating a
/// topic it reads, a group whose name only starts with its own, a wrong password and a
/// plaintext client.
#[tokio::test]
async fn kafka_refuses_a_service_that_writes_another_services_topic() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use sagaworks_outbox::kafka::{TopicSettings, client_config, ensure_topics, topic_name};
    let broker = sagaworks_test_support::Broker::secured().await;
    let (admin, payment, inventory) = (
        broker.kafka_settings_as("admin"),
        broker.kafka_settings_as("payment"),
        broker.kafka_settings_as("inventory"),
    );
    let topic = |aggregate: &str| topic_name(&admin, aggregate);
    let one = TopicSettings { partitions: 1, replication_factor: 1 };
    // The topics exist beforehand: a client without Create finds them and asks nothing.
    ensure_topics(&payment, &[topic("payment")], one).await.expect("payment finds its topic");
    ensure_topics(&inventory, &[topic("order")], one).await.expect("inventory finds the topic it reads");

    let send = |kafka: sagaworks_config::KafkaSettings, topic: String| async move {
        let producer: FutureProducer =
            client_config(&kafka, &[("acks", "all"), ("message.timeout.ms", "8000")]).create().unwrap();
        let record = FutureRecord::to(&topic).key("k").payload("{}");
        producer.send(record, Duration::from_secs(8)).await.map(|_| ()).map_err(|(e, _)| e)
    };
    send(payment.clone(), topic("payment")).await.expect("payment writes its own topic");
    let refused =
        send(payment.clone(), topic("order")).await.expect_err("payment may not write order's topic");
    assert_eq!(
        refused,
        KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed),
        "{refused:?}"
    );
    // Inventory reads `order` (and writes its .dlq), but may not write it.
    let refused = send(inventory.clone(), topic("order")).await.expect_err("inventory may not write order");
    assert_eq!(
        refused,
        KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed),
        "{refused:?}"
    );
    // Nor create it: a consumer has no Create on what it reads.
    {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let client: AdminClient<rdkafka::client::DefaultClientContext> =
            client_config(&inventory, &[]).create().unwrap();
        let order = topic("order");
        let new = NewTopic::new(&order, 1, TopicReplication::Fixed(1));
        let created = client.create_topics([&new], &AdminOptions::new()).await.unwrap();
        assert_eq!(
            created,
            vec![Err((order.clone(), RDKafkaErrorCode::TopicAuthorizationFailed))],
            "not TopicAlreadyExists: inventory may not create topics"
        );
    }
    send(admin.clone(), topic("order")).await.expect("admin writes order");

    // Inventory consumes `order`, not `payment`, in its group `<prefix>.inventory` only.
    let consume_in = |kafka: sagaworks_config::KafkaSettings, topic: String, group: String| {
        let consumer: BaseConsumer =
            client_config(&kafka, &[("group.id", &group), ("auto.offset.reset", "earliest")])
                .create()
                .unwrap();
        consumer.subscribe(&[&topic]).unwrap();
        // Up to 30 s of polls: the first error or message decides (`false`: neither came).
        for _ in 0..300 {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Err(e)) => return Err(e),
                Some(Ok(_)) => return Ok(true),
                None => {}
            }
        }
        Ok(false)
    };
    let consume = |kafka: &sagaworks_config::KafkaSettings, topic: String, group: &str| {
        let (kafka, group) = (kafka.clone(), format!("{}.{group}", kafka.topic_prefix));
        tokio::task::spawn_blocking(move || consume_in(kafka, topic, group))
    };
    let read = consume(&inventory, topic("order"), "inventory").await.unwrap();
    assert!(read.expect("inventory reads order in its group"), "no message within 30 s");
    let refused = consume(&inventory, topic("payment"), "inventory")
        .await
        .unwrap()
        .expect_err("inventory may not read payment's topic");
    assert!(format!("{refused:?}").contains("TopicAuthorizationFailed"), "{refused:?}");
    // A group named like inventory's plus a suffix is not inventory's.
    let refused = consume(&inventory, topic("order"), "inventory-x")
        .await
        .unwrap()
        .expect_err("inventory may not use a group that only starts with its name");
    assert!(format!("{refused:?}").contains("GroupAuthorizationFailed"), "{refused:?}");

    let wrong =
        sagaworks_config::KafkaSettings { sasl_password: "not-the-password".into(), ..payment.clone() };
    let refused = send(wrong, topic("payment")).await.expect_err("a wrong password is refused");
    assert!(
        format!("{refused:?}").contains("Authentication")
            || format!("{refused:?}").contains("MessageTimedOut"),
        "{refused:?}"
    );
    let plaintext = sagaworks_config::KafkaSettings {
        security_protocol: sagaworks_config::KafkaSecurity::Plaintext,
        ..payment
    };
    send(plaintext, topic("payment")).await.expect_err("a plaintext client is refused");
}
