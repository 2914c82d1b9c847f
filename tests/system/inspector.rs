//! The web inspector (`/admin/` on the gateway) in a real headless Chromium,
//! against the whole system: a stuck saga found under the `stuck` filter, its
//! step timeline drawn box by box, and a dead letter with its error.
//!
//! Chromium runs from the command line (`--dump-dom`, `--screenshot`) with a
//! virtual time budget; the page marks `<main data-state="ready">` once its
//! data is shown, and each page is loaded again (a bounded number of times)
//! until it is. Screenshots go to `target/test-artifacts/inspector-*.png`.
//! Without Chromium the tests fail: run `scripts/install-deps`.

use reqwest::StatusCode;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use system_tests::operations::{send_raw, stuck_before_charge};
use system_tests::{Stack, auth};

/// Page loads before giving up on a page showing what it should.
const LOADS: usize = 8;

// ---------------------------------------------------------------- the browser

/// A headless Chromium with a profile of its own (removed on drop).
struct Browser {
    binary: PathBuf,
    profile: PathBuf,
}

impl Browser {
    /// Panics when there is no Chromium: the test is never skipped.
    fn new() -> Self {
        let binary = std::env::var_os("CHROMIUM").map(PathBuf::from).or_else(|| {
            ["chromium", "chromium-browser", "google-chrome"].into_iter().find_map(|name| {
                let out =
                    std::process::Command::new("sh").args(["-c", &format!("command -v {name}")]).output();
                let path = String::from_utf8_lossy(&out.ok()?.stdout).trim().to_string();
                (!path.is_empty()).then(|| PathBuf::from(path))
            })
        });
        let binary = binary.unwrap_or_else(|| {
            panic!("no Chromium found (chromium on PATH or CHROMIUM=<path>): run scripts/install-deps")
        });
        let profile =
            std::env::temp_dir().join(format!("inspector-chromium-{}", uuid::Uuid::new_v4().simple()));
        Self { binary, profile }
    }

    /// Runs Chromium on `url` with `extra` arguments; its stdout. Headless Chromium now and
    /// then never exits on a busy machine (its virtual time stalls): a run that has not
    /// finished in 90 s is killed and tried once more, which must finish.
    async fn run(&self, url: &str, extra: &[String]) -> String {
        if let Some(out) = self.run_once(url, extra).await {
            return out;
        }
        eprintln!("Chromium did not finish on {url} within 90 s: killed, trying once more");
        self.run_once(url, extra).await.unwrap_or_else(|| panic!("Chromium did not finish on {url} twice"))
    }

    /// One run of Chromium; `None` if it did not finish within 90 s (it is killed).
    async fn run_once(&self, url: &str, extra: &[String]) -> Option<String> {
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            .args(["--no-first-run", "--disable-extensions", "--hide-scrollbars", "--mute-audio"])
            .arg(format!("--user-data-dir={}", self.profile.display()))
            .arg("--virtual-time-budget=5000")
            .args(extra)
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let run = command.output();
        let out = tokio::time::timeout(Duration::from_secs(90), run)
            .await
            .ok()?
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.binary.display()));
        assert!(
            out.status.success(),
            "Chromium failed on {url}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The page's DOM once it is ready and `shows` holds for it.
    async fn page(&self, url: &str, what: &str, shows: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        for _ in 0..LOADS {
            let dom = self.run(url, &["--dump-dom".into()]).await;
            if dom.contains(r#"data-state="ready""#) && shows(&dom) {
                return dom;
            }
            last = dom;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let problem = between(&last, r#"id="problem""#, "</div>").unwrap_or("(none)");
        panic!("the inspector did not show {what} after {LOADS} loads of {url}\nproblem: {problem}\n{last}");
    }

    /// A screenshot of `url` (1400 x 1000) into the test artifacts.
    async fn screenshot(&self, url: &str, name: &str) -> PathBuf {
        let path = artifacts().join(name);
        let _ = std::fs::remove_file(&path);
        let args = [format!("--screenshot={}", path.display()), "--window-size=1400,1000".into()];
        self.run(url, &args).await;
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(size > 10_000, "no screenshot at {} ({size} bytes)", path.display());
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// `target/test-artifacts` (created).
fn artifacts() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = match std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        Some(dir) => root.join(dir),
        None => root.join("target"),
    };
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// The page at `/admin/?{query}`, logged in with an admin token in the fragment.
fn page_url(stack: &Stack, query: &str) -> String {
    format!("{}#token={}", stack.url(&format!("/admin/?{query}")), auth::admin_token())
}

// ---------------------------------------------------------------- reading the DOM

/// The text from `start` (included) to the next `end` (included).
fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(start)?;
    let to = text[from..].find(end)? + from + end.len();
    Some(&text[from..to])
}

/// An attribute's value in a tag's text.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = tag[start..].find('"')?;
    Some(&tag[start..start + len])
}

/// Text as it is serialized in the DOM.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('\u{a0}', "&nbsp;")
}

/// The timeline's boxes: (kind, step, attempt, phase, outcome) each.
fn boxes(dom: &str) -> Vec<(String, String, u32, String, String)> {
    let picture = between(dom, "<svg", "</svg>").expect("the timeline picture");
    picture
        .split(r#"<g class="box "#)
        .skip(1)
        .map(|g| {
            let tag = &g[..g.find('>').unwrap()];
            let get =
                |name| attr(tag, name).unwrap_or_else(|| panic!("box without {name}: {tag}")).to_string();
            (
                get("data-kind"),
                get("data-step"),
                get("data-attempt").parse().unwrap(),
                get("data-phase"),
                get("data-outcome"),
            )
        })
        .collect()
}

/// The boxes the picture must have for `saga` (`GET /v1/admin/sagas/{id}`):
/// one per attempt in each step's history, and each running step's current one.
fn expected_boxes(saga: &Value) -> Vec<(String, String, u32)> {
    let mut expected = vec![];
    for step in saga["steps"].as_array().unwrap() {
        let name = step["name"].as_str().unwrap().to_string();
        for attempt in step["history"].as_array().unwrap() {
            expected.push(("attempt".to_string(), name.clone(), attempt["attempt"].as_u64().unwrap() as u32));
        }
        if step["status"] == "RUNNING" {
            let attempt = step["attempts"].as_u64().unwrap() as u32;
            let waiting = step["history"]
                .as_array()
                .unwrap()
                .last()
                .is_some_and(|a| a["attempt"].as_u64() == Some(attempt as u64));
            expected.push(("current".into(), name, if waiting { attempt + 1 } else { attempt }));
        }
    }
    expected.sort();
    expected
}

fn assert_boxes(dom: &str, saga: &Value) {
    let mut drawn: Vec<(String, String, u32)> =
        boxes(dom).into_iter().map(|(kind, step, attempt, _, _)| (kind, step, attempt)).collect();
    drawn.sort();
    assert_eq!(drawn, expected_boxes(saga), "a box per step attempt: {saga}");
}

// ---------------------------------------------------------------- the system

/// The page's files come without a token, with a strict policy; they are
/// not part of the API document.
async fn assert_served(stack: &Stack) {
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let res = http.get(stack.url("/admin")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::PERMANENT_REDIRECT);
    for (path, content_type) in [
        ("/admin/", "text/html; charset=utf-8"),
        ("/admin/app.js", "text/javascript; charset=utf-8"),
        ("/admin/app.css", "text/css; charset=utf-8"),
    ] {
        // No token: the page is public, its data calls carry the token.
        let res = http.get(stack.url(path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let header =
            |name: &str| res.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        assert_eq!(header("content-type"), content_type, "{path}");
        assert_eq!(header("cache-control"), "no-cache", "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        let csp = header("content-security-policy");
        for directive in
            ["default-src 'self'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'"]
        {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
    }
    // The page routes are not part of the API document.
    let (_, doc) = stack.get("/openapi.json").await;
    assert!(doc["paths"].as_object().unwrap().keys().all(|p| !p.starts_with("/admin")), "{doc}");
}

// ---------------------------------------------------------------- the tests

#[tokio::test]
async fn a_stuck_saga_is_listed_and_its_steps_are_drawn() {
    let browser = Browser::new();
    let (stack, _, _, order_id) = stuck_before_charge().await;
    assert_served(&stack).await;
    let stuck =
        sagaworks_test_support::eventually("the saga to count as stuck", Duration::from_secs(20), || async {
            let (_, page) = stack.get("/v1/admin/sagas?status=stuck").await;
            page["sagas"].as_array().and_then(|s| (s.len() == 1).then(|| s[0].clone()))
        })
        .await;
    assert_eq!(stuck["order_id"], order_id.as_str(), "{stuck}");
    let saga_id = stuck["saga_id"].as_str().unwrap().to_string();

    // The list under the `stuck` filter: the saga, its status and step.
    let url = page_url(&stack, "view=sagas&status=stuck");
    let row_start = format!(r#"data-saga-id="{saga_id}""#);
    let dom = browser.page(&url, "the stuck saga", |dom| dom.contains(&row_start)).await;
    assert!(dom.contains(r#"data-view="sagas""#));
    let row = between(&dom, &row_start, "</tr>").unwrap();
    for shown in ["RUNNING", "charge_payment", "stuck", &format!("?view=saga&amp;id={saga_id}")] {
        assert!(row.contains(shown), "the row shows {shown}: {row}");
    }
    assert_eq!(dom.matches("<tr data-saga-id=").count(), 1, "only the stuck saga");
    browser.screenshot(&url, "inspector-sagas-stuck.png").await;

    // Its detail: a box per step attempt, the running one marked; a table too.
    let (status, saga) = stack.get(&format!("/v1/admin/sagas/{saga_id}")).await;
    assert_eq!(status, StatusCode::OK, "{saga}");
    let url = page_url(&stack, &format!("view=saga&id={saga_id}"));
    let dom = browser.page(&url, "the stuck saga's timeline", |dom| dom.contains("data-attempts=")).await;
    assert_boxes(&dom, &saga);
    let table = between(&dom, r#"id="steps-table""#, "</table>").unwrap();
    assert_eq!(table.matches("<tr data-kind=").count(), expected_boxes(&saga).len(), "{table}");
    let drawn = boxes(&dom);
    assert!(
        drawn.iter().any(|(kind, step, _, phase, outcome)| kind == "current"
            && step == "charge_payment"
            && phase == "forward"
            && outcome == "running"),
        "the step it is stuck in is drawn as running: {drawn:?}"
    );
    assert!(drawn.iter().any(|b| b.1 == "reserve_stock" && b.4 == "succeeded"), "{drawn:?}");
    assert!(dom.contains("succeeded · took "), "durations are shown");
    assert!(dom.contains(&saga_id) && dom.contains(&order_id));
    assert!(drawn.iter().any(|b| b.1 == "check_account" && b.4 == "succeeded"), "{drawn:?}");
    assert_eq!(saga["version"], 2, "{saga}");
    assert!(dom.contains("<dt>Version</dt><dd>v2</dd>"), "the version it runs on is shown");
    for button in ["act-retry", "act-compensate", "act-resolve"] {
        let tag = between(&dom, &format!(r#"id="{button}""#), ">").unwrap();
        assert!(!tag.contains("disabled"), "{button} is enabled for a stuck running saga: {tag}");
    }
    browser.screenshot(&url, "inspector-saga-stuck.png").await;

    // An operator compensates it: the compensations are drawn in their own phase.
    let body = serde_json::json!({ "reason": "customer asked to cancel" });
    let req = stack.http.post(stack.url(&format!("/v1/admin/sagas/{saga_id}/compensate")));
    let res =
        req.header("Idempotency-Key", uuid::Uuid::new_v4().to_string()).json(&body).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let order = stack.settled(&order_id).await;
    assert_eq!(order["status"], "CANCELLED", "{order}");
    let saga =
        sagaworks_test_support::eventually("the saga to be compensated", Duration::from_secs(20), || async {
            let (_, saga) = stack.get(&format!("/v1/admin/sagas/{saga_id}")).await;
            (saga["status"] == "COMPENSATED").then_some(saga)
        })
        .await;
    let dom = browser.page(&url, "the compensated saga", |dom| dom.contains("COMPENSATED")).await;
    assert_boxes(&dom, &saga);
    let drawn = boxes(&dom);
    for (step, phase) in
        [("reserve_stock", "forward"), ("refund_payment", "compensation"), ("release_stock", "compensation")]
    {
        assert!(drawn.iter().any(|b| b.1 == step && b.3 == phase), "{step} is drawn as {phase}: {drawn:?}");
    }
    assert!(drawn.iter().any(|b| b.1 == "charge_payment" && b.4 == "abandoned"), "{drawn:?}");
    let audit = between(&dom, r#"id="audit-table""#, "</table>").unwrap();
    assert!(audit.contains("COMPENSATE") && audit.contains("customer asked to cancel"), "{audit}");
    for button in ["act-retry", "act-compensate", "act-resolve"] {
        let tag = between(&dom, &format!(r#"id="{button}""#), ">").unwrap();
        assert!(tag.contains("disabled"), "{button} is disabled once the saga has finished: {tag}");
    }
    // The README's picture (docs/img/inspector.png) is this artifact, copied by hand.
    browser.screenshot(&url, "inspector-saga.png").await;
}

#[tokio::test]
async fn a_dead_letter_is_shown_with_its_error_and_payload() {
    let browser = Browser::new();
    let stack = Stack::start().await;
    // A poison message: a payload without the CloudEvents headers (no ce_id).
    let key = format!("poison-{}", uuid::Uuid::new_v4().simple());
    let payload = r#"{"order_id":"not-a-cloud-event","note":"<b>bold</b> & raw"}"#;
    send_raw(&stack, &key, payload, &[("ce_type", "OrderPlaced")]).await;

    let path = format!("/v1/admin/dlq/order/messages?key={key}");
    let letters = sagaworks_test_support::eventually(
        "the poison message dead-lettered",
        Duration::from_secs(30),
        || async {
            let (status, page) = stack.get(&path).await;
            assert_ne!(status, StatusCode::NOT_FOUND, "the DLQ routes: {page}");
            page["messages"].as_array().filter(|m| !m.is_empty()).cloned()
        },
    )
    .await;
    let letter = &letters[0];
    let id = letter["id"].as_str().unwrap().to_string();
    let error = letter["error"].as_str().unwrap().to_string();
    assert!(!error.is_empty(), "{letter}");

    // The topics with their counts, and the topic's messages with the error.
    let url = page_url(&stack, &format!("view=dlq&topic=order&key={key}"));
    let row_start = format!(r#"data-message-id="{id}""#);
    let dom = browser.page(&url, "the dead letter", |dom| dom.contains(&row_start)).await;
    let topics = between(&dom, r#"id="dlq-topics""#, "</table>").unwrap();
    assert!(topics.contains(r#"data-topic="order""#) && topics.contains("order.dlq"), "{topics}");
    let row = between(&dom, &row_start, "</tr>").unwrap();
    for shown in [escaped(&error), key.clone(), "pending".into(), "OrderPlaced".into()] {
        assert!(row.contains(&shown), "the row shows {shown}: {row}");
    }
    let original = &letter["original"];
    let position = format!("partition {} · offset {}", original["partition"], original["offset"]);
    assert!(row.contains(&position), "the original position {position}: {row}");
    browser.screenshot(&url, "inspector-dlq.png").await;

    // The message: error, headers, the payload as text (never as markup).
    let url = page_url(&stack, &format!("view=dlq&topic=order&id={id}"));
    let dom = browser.page(&url, "the dead letter's payload", |dom| dom.contains(r#"id="payload""#)).await;
    assert!(dom.contains(&escaped(&error)), "the error is shown");
    let shown = between(&dom, r#"<pre id="payload""#, "</pre>").unwrap();
    assert!(shown.contains("&lt;b&gt;bold&lt;/b&gt; &amp; raw"), "the payload as text: {shown}");
    assert!(!dom.contains("<b>bold</b>"), "no markup from the payload");
    let headers = between(&dom, r#"id="message-headers""#, "</table>").unwrap();
    assert!(headers.contains("dlq_error") && headers.contains("ce_type"), "{headers}");
    for button in ["msg-replay", "msg-replay-key", "msg-discard"] {
        let tag = between(&dom, &format!(r#"id="{button}""#), ">").unwrap();
        assert!(!tag.contains("disabled"), "{button} is enabled for a pending message: {tag}");
    }
    browser.screenshot(&url, "inspector-dlq-message.png").await;

    // Discarded (by another operator): its state and the audit; nothing more to do with it.
    let path = format!("/v1/admin/dlq/order/messages/{id}/discard");
    let req = stack.http.post(stack.url(&path)).header("Idempotency-Key", uuid::Uuid::new_v4().to_string());
    let res = req.json(&serde_json::json!({ "reason": "a test's poison" })).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let dom = browser.page(&url, "the discarded dead letter", |dom| dom.contains("badge discarded")).await;
    let audit = between(&dom, r#"id="message-audit""#, "</table>").unwrap();
    assert!(
        audit.contains("discard") && audit.contains("a test's poison") && audit.contains("test-admin"),
        "{audit}"
    );
    for button in ["msg-replay", "msg-replay-key", "msg-discard"] {
        let tag = between(&dom, &format!(r#"id="{button}""#), ">").unwrap();
        assert!(tag.contains("disabled"), "{button} is disabled once discarded: {tag}");
    }
}

#[tokio::test]
async fn the_api_explorer_at_docs_lists_the_operations_of_the_openapi_document() {
    let browser = Browser::new();
    let nowhere = "https://127.0.0.1:9";
    let gateway = system_tests::start_gateway(nowhere, nowhere, nowhere).await;
    let url = format!("http://127.0.0.1:{}/docs/", gateway.http_port);
    let mut dom = String::new();
    for _ in 0..LOADS {
        dom = browser.run(&url, &["--dump-dom".into()]).await;
        if dom.contains("opblock-summary-path") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Swagger UI rendered the document: an operation block per route and method.
    let paths: Vec<&str> =
        dom.split(r#"data-path=""#).skip(1).filter_map(|rest| rest.split('"').next()).collect();
    for path in ["/v1/orders", "/v1/orders/{order_id}", "/v1/admin/dlq/{topic}/replay", "/v1/products"] {
        assert!(paths.contains(&path), "{path} is not shown; shown: {paths:?}\n{dom}");
    }
    assert!(dom.contains("sagaworks"), "the document's title is shown");
    browser.screenshot(&url, "api-explorer.png").await;
}
