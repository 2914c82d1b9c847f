//! Jaeger v2 and the OpenTelemetry Collector as processes, wired as in compose
//! (services -> Collector -> Jaeger), on free loopback ports and the committed
//! configurations (`deploy/observability/otel-collector.yaml`,
//! `deploy/observability/jaeger.yaml`), so a test reads back from Jaeger's
//! HTTP API (`/api/v3`) what the services exported.
//!
//! The binaries are those `scripts/lib/tracing.sh` builds once per machine
//! from the Go module proxy: `SW_JAEGER_BIN` and `SW_OTELCOL_BIN` when set
//! (scripts/test sets them), else `sw_jaeger_bin` / `sw_otelcol_bin`, which
//! build what is missing.

use crate::otlp::{ReceivedLink, ReceivedSpan, SpanKind, StatusCode};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// Jaeger and a Collector in front of it; both are killed when dropped.
pub struct Tracing {
    jaeger: Child,
    collector: Child,
    otlp_port: u16,
    query_port: u16,
    http: reqwest::Client,
}

impl Tracing {
    /// Starts Jaeger, then the Collector exporting to it, and waits until both are healthy.
    pub async fn start() -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let config = |name: &str| root.join("deploy/observability").join(name);
        let port = |p: u16| p.to_string();
        let (jaeger_otlp, query_port, jaeger_health) =
            (crate::free_port(), crate::free_port(), crate::free_port());
        let jaeger = spawn(
            &binary("SW_JAEGER_BIN", "sw_jaeger_bin"),
            &config("jaeger.yaml"),
            &[
                ("JAEGER_LISTEN_HOST", "127.0.0.1".into()),
                ("JAEGER_OTLP_GRPC_PORT", port(jaeger_otlp)),
                ("JAEGER_QUERY_HTTP_PORT", port(query_port)),
                ("JAEGER_QUERY_GRPC_PORT", port(crate::free_port())),
                ("JAEGER_HEALTH_PORT", port(jaeger_health)),
                ("JAEGER_METRICS_PORT", port(crate::free_port())),
            ],
        );
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        wait_healthy(&http, "Jaeger", &format!("http://127.0.0.1:{jaeger_health}/status")).await;
        let (otlp_port, collector_health) = (crate::free_port(), crate::free_port());
        let collector = spawn(
            &binary("SW_OTELCOL_BIN", "sw_otelcol_bin"),
            &config("otel-collector.yaml"),
            &[
                ("OTELCOL_LISTEN_HOST", "127.0.0.1".into()),
                ("OTELCOL_OTLP_GRPC_PORT", port(otlp_port)),
                ("OTELCOL_OTLP_HTTP_PORT", port(crate::free_port())),
                ("OTELCOL_HEALTH_PORT", port(collector_health)),
                ("OTELCOL_METRICS_PORT", port(crate::free_port())),
                ("JAEGER_OTLP_ENDPOINT", format!("127.0.0.1:{jaeger_otlp}")),
            ],
        );
        let tracing = Self { jaeger, collector, otlp_port, query_port, http };
        wait_healthy(&tracing.http, "the Collector", &format!("http://127.0.0.1:{collector_health}/")).await;
        tracing
    }

    /// The Collector's OTLP/gRPC endpoint, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn otlp_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.otlp_port)
    }

    /// The spans Jaeger has of `trace_id` (`GET /api/v3/traces/{trace_id}`); none while it has none.
    pub async fn trace(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.get(&format!("/api/v3/traces/{trace_id}")).await
    }

    /// The spans of every trace with a span of `service` that started since `since`
    /// (`GET /api/v3/traces?query.service_name=...`).
    pub async fn traces_of(&self, service: &str, since: SystemTime) -> Vec<ReceivedSpan> {
        let rfc3339 = |t: SystemTime| {
            let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
            chrono::DateTime::from_timestamp(d.as_secs() as i64, d.subsec_nanos())
                .unwrap()
                .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
        };
        let min = rfc3339(since - Duration::from_secs(1));
        let max = rfc3339(SystemTime::now() + Duration::from_secs(60));
        self.get(&format!(
            "/api/v3/traces?query.service_name={service}&query.start_time_min={min}&query.start_time_max={max}&query.num_traces=1000"
        ))
        .await
    }

    async fn get(&self, path_and_query: &str) -> Vec<ReceivedSpan> {
        let url = format!("http://127.0.0.1:{}{path_and_query}", self.query_port);
        let res = self.http.get(&url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = res.status();
        let body: Value = res.json().await.unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"));
        // Jaeger answers 404 (not found) while it has no such trace.
        if status == reqwest::StatusCode::NOT_FOUND {
            return Vec::new();
        }
        assert!(status.is_success(), "GET {url}: {status} {body}");
        spans_of(&body["result"])
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        for child in [&mut self.collector, &mut self.jaeger] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn binary(var: &str, function: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return PathBuf::from(path);
    }
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lib/tracing.sh");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(". '{}' && {function}", lib.display()))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash for {function}: {e}"));
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success() && !path.is_empty(),
        "{function} (scripts/lib/tracing.sh) failed: set {var}"
    );
    PathBuf::from(path)
}

fn spawn(bin: &Path, config: &Path, env: &[(&str, String)]) -> Child {
    Command::new(bin)
        .arg(format!("--config={}", config.display()))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()))
}

async fn wait_healthy(http: &reqwest::Client, what: &str, url: &str) {
    let start = Instant::now();
    loop {
        if http.get(url).send().await.is_ok_and(|r| r.status().is_success()) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{what} not healthy at {url}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The spans of an OTLP/JSON `TracesData` (Jaeger's `/api/v3` answer), ids in hex.
fn spans_of(traces: &Value) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in traces["resourceSpans"].as_array().into_iter().flatten() {
        let resource = attributes(&resource_spans["resource"]["attributes"]);
        let service_name = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans["scopeSpans"].as_array().into_iter().flatten() {
            for span in scope["spans"].as_array().into_iter().flatten() {
                let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
                out.push(ReceivedSpan {
                    trace_id: text(&span["traceId"]),
                    span_id: text(&span["spanId"]),
                    parent_span_id: text(&span["parentSpanId"]),
                    name: text(&span["name"]),
                    kind: match span["kind"].as_i64().unwrap_or(0) {
                        1 => SpanKind::Internal,
                        2 => SpanKind::Server,
                        3 => SpanKind::Client,
                        4 => SpanKind::Producer,
                        5 => SpanKind::Consumer,
                        _ => SpanKind::Unspecified,
                    },
                    service_name: service_name.clone(),
                    resource: resource.clone(),
                    attributes: attributes(&span["attributes"]),
                    // A number, or the enum's name.
                    status: match (span["status"]["code"].as_i64(), span["status"]["code"].as_str()) {
                        (Some(1), _) | (_, Some("STATUS_CODE_OK")) => StatusCode::Ok,
                        (Some(2), _) | (_, Some("STATUS_CODE_ERROR")) => StatusCode::Error,
                        _ => StatusCode::Unset,
                    },
                    status_message: text(&span["status"]["message"]),
                    links: span["links"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|l| ReceivedLink { trace_id: text(&l["traceId"]), span_id: text(&l["spanId"]) })
                        .collect(),
                });
            }
        }
    }
    out
}

/// OTLP/JSON key-value attributes, values rendered as text (`42`, `true`, `grpc`).
fn attributes(list: &Value) -> BTreeMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|kv| {
            let value = kv["value"].as_object()?.values().next()?;
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Some((kv["key"].as_str()?.to_string(), text))
        })
        .collect()
}
