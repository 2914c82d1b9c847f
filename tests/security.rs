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
    for path in &own {
        let (status, _, body) = send(as_alice(http.get(stack.url(path)))).await;
        assert_eq!(status, StatusCode::OK, "alice {path}: {body}");
        let (status, _, body) = send(as_bob(http.get(stack.url(path)))).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "bob {path}: {body}");
        assert_eq!(body["type"], "https://sagaworks.dev/problems/forbidden");
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
    let mut settings = gateway_settings("http://127.0.0.1:1", "http://127.0.0.1:1", "http://127.0.0.1:1");
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
