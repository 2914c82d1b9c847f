//! OpenTelemetry end to end: the four services run as real processes, each
//! exporting its spans (under its own `service.name`) to an in-process OTLP
//! receiver, and once through the real Collector into a real Jaeger. One `POST /v1/orders` must be one trace across gateway, order,
//! inventory and payment with correct parentage; the gateway starts it (a
//! client's `traceparent` is only a link, and cannot force sampling); the
//! events it causes are consumed in new traces linked to it; a failing saga
//! shows its error and its compensation.
//!
//! Needs the service binaries built (`cargo build --workspace`, which
//! `scripts/test` does first).

use reqwest::StatusCode;
use sagaworks_test_support::eventually;
use sagaworks_test_support::jaeger::Tracing;
use sagaworks_test_support::otlp::{
    OtlpReceiver, ReceivedLink, ReceivedSpan, SpanKind, StatusCode as SpanStatus,
};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};
use system_tests::auth::customer_token;
use system_tests::processes::ProcessStack;

/// The client's trace context, sampled: the gateway links to it and never continues it.
const CALLER_TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN_ID: &str = "00f067aa0ba902b7";
const CALLER_TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

async fn start(receiver: &OtlpReceiver) -> ProcessStack {
    start_with(receiver, &[]).await
}

/// Every service exports to `receiver`; `extra` goes to every service too.
async fn start_with(receiver: &OtlpReceiver, extra: &[(&str, &str)]) -> ProcessStack {
    let endpoint = receiver.endpoint();
    ProcessStack::start(&[&otel(&endpoint)[..], extra].concat()).await
}

/// The environment that makes a service export to the OTLP receiver at `endpoint`.
fn otel(endpoint: &str) -> [(&str, &str); 2] {
    // Export every 100 ms instead of every 5 s.
    [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), ("OTEL_BSP_SCHEDULE_DELAY", "100")]
}

/// A product (price 250, stock 10) and a customer with `credit_cents`.
async fn catalogue(system: &ProcessStack, credit_cents: i64) -> (String, String) {
    let sku = format!("sku-{}", uuid::Uuid::new_v4().simple());
    let product = json!({ "sku": sku, "name": "Widget", "price_cents": 250, "initial_stock": 10 });
    let res = system.http.post(system.url("/v1/products")).json(&product).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let product: Value = res.json().await.unwrap();
    let customer = json!({ "name": "Ada", "initial_credit_cents": credit_cents });
    let res = system.http.post(system.url("/v1/customers")).json(&customer).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let customer: Value = res.json().await.unwrap();
    (product["id"].as_str().unwrap().to_string(), customer["customer_id"].as_str().unwrap().to_string())
}

/// `POST /v1/orders` as the customer, sending the client's sampled [`CALLER_TRACEPARENT`].
async fn place(system: &ProcessStack, customer: &str, product: &str) -> Value {
    place_with(system, CALLER_TRACEPARENT, customer, product).await
}

/// `POST /v1/orders` as the customer, sending `traceparent`.
async fn place_with(system: &ProcessStack, traceparent: &str, customer: &str, product: &str) -> Value {
    let body = json!({ "customer_id": customer, "items": [{ "product_id": product, "quantity": 2 }] });
    let res = system
        .http
        .post(system.url("/v1/orders"))
        .bearer_auth(customer_token(customer))
        .header("traceparent", traceparent)
        .json(&body)
        .send()
        .await
        .expect("the gateway answers");
    assert_eq!(res.status(), StatusCode::CREATED);
    res.json().await.unwrap()
}

/// The trace id an order stores: the gateway's, never the client's.
fn trace_of(order: &Value) -> String {
    let trace_id = order["trace_id"].as_str().unwrap_or_else(|| panic!("the order names its trace: {order}"));
    assert_eq!(trace_id.len(), 32, "{trace_id}");
    assert_ne!(trace_id, CALLER_TRACE_ID, "the client's traceparent does not choose the order's trace");
    trace_id.to_owned()
}

/// The spans of one trace, navigable by parentage.
struct Trace<'a> {
    spans: Vec<&'a ReceivedSpan>,
    by_id: HashMap<&'a str, &'a ReceivedSpan>,
}

impl<'a> Trace<'a> {
    fn of(all: &'a [ReceivedSpan], trace_id: &str) -> Self {
        let spans: Vec<&ReceivedSpan> = all.iter().filter(|s| s.trace_id == trace_id).collect();
        let by_id = spans.iter().map(|s| (s.span_id.as_str(), *s)).collect();
        Self { spans, by_id }
    }

    fn find(&self, pred: impl Fn(&ReceivedSpan) -> bool) -> Vec<&'a ReceivedSpan> {
        self.spans.iter().copied().filter(|s| pred(s)).collect()
    }

    /// The only span matching `pred`; panics with the trace's span names otherwise.
    fn one(&self, what: &str, pred: impl Fn(&ReceivedSpan) -> bool) -> &'a ReceivedSpan {
        let found = self.find(pred);
        assert_eq!(found.len(), 1, "expected one {what}, found {}; trace: {:#?}", found.len(), self.names());
        found[0]
    }

    fn parent(&self, span: &ReceivedSpan) -> Option<&'a ReceivedSpan> {
        self.by_id.get(span.parent_span_id.as_str()).copied()
    }

    /// True when `ancestor` is `span`'s parent, grand-parent, ...
    fn descends_from(&self, span: &ReceivedSpan, ancestor: &ReceivedSpan) -> bool {
        let mut current = self.parent(span);
        while let Some(s) = current {
            if s.span_id == ancestor.span_id {
                return true;
            }
            current = self.parent(s);
        }
        false
    }

    fn services(&self) -> BTreeSet<&'a str> {
        self.spans.iter().map(|s| s.service_name.as_str()).collect()
    }

    fn names(&self) -> Vec<String> {
        self.spans.iter().map(|s| format!("{}: {} ({:?})", s.service_name, s.name, s.kind)).collect()
    }

    /// The `saga.step` span of `step`.
    fn step(&self, step: &str) -> &'a ReceivedSpan {
        self.one(&format!("saga.step {step}"), |s| {
            s.name == "saga.step" && s.attr("saga.step.name") == Some(step)
        })
    }

    /// The client span of `method` under `step`, and the participant's server span under it.
    fn call(&self, step: &ReceivedSpan, service: &str, method: &str) -> (&'a ReceivedSpan, &'a ReceivedSpan) {
        let name = format!("sagaworks.{service}.v1.{}/{method}", service_type(service));
        let client = self.one(&format!("order's {name} client span"), |s| {
            s.service_name == "order" && s.kind == SpanKind::Client && s.name == name
        });
        assert!(self.descends_from(client, step), "{name} runs inside its step");
        assert_eq!(client.attr("rpc.system"), Some("grpc"));
        let server = self.one(&format!("{service}'s {name} server span"), |s| {
            s.service_name == service && s.kind == SpanKind::Server && s.name == name
        });
        assert_eq!(server.parent_span_id, client.span_id, "{service}'s server span continues order's call");
        (client, server)
    }
}

fn service_type(service: &str) -> &'static str {
    match service {
        "inventory" => "InventoryService",
        "payment" => "PaymentService",
        "order" => "OrderService",
        other => panic!("no service {other}"),
    }
}

/// The gateway part of an order's trace: HTTP server span (the root, linked to
/// the client's span) -> gRPC client span -> order's CreateOrder server span -> saga span.
fn assert_gateway_to_saga<'a>(trace: &Trace<'a>, trace_id: &str) -> &'a ReceivedSpan {
    let http =
        trace.one("gateway HTTP server span", |s| s.service_name == "gateway" && s.kind == SpanKind::Server);
    assert_eq!(http.name, "POST /v1/orders");
    assert_eq!(http.parent_span_id, "", "the gateway's request is the root of the order's trace");
    assert_eq!(
        http.links,
        vec![ReceivedLink { trace_id: CALLER_TRACE_ID.into(), span_id: CALLER_SPAN_ID.into() }],
        "the gateway's request links to the client's span"
    );
    assert_eq!(http.trace_id, trace_id);
    assert_eq!(http.attr("http.request.method"), Some("POST"));
    assert_eq!(http.attr("http.response.status_code"), Some("201"));
    let create = "sagaworks.order.v1.OrderService/CreateOrder";
    let client = trace.one("gateway CreateOrder client span", |s| {
        s.service_name == "gateway" && s.kind == SpanKind::Client && s.name == create
    });
    assert!(trace.descends_from(client, http), "the gateway calls order while handling the request");
    let server = trace.one("order CreateOrder server span", |s| {
        s.service_name == "order" && s.kind == SpanKind::Server && s.name == create
    });
    assert_eq!(server.parent_span_id, client.span_id, "order's server span continues the gateway's call");
    assert_eq!(server.attr("rpc.system"), Some("grpc"));
    assert_eq!(server.attr("rpc.grpc.status_code"), Some("0"));
    let saga = trace.one("saga span", |s| s.service_name == "order" && s.name == "saga");
    assert!(trace.descends_from(saga, server), "the saga driven from CreateOrder is part of its trace");
    saga
}

/// The `db.*` span of a participant's business transaction, under `server`.
fn assert_db_span(trace: &Trace<'_>, server: &ReceivedSpan, name: &str) {
    let db = trace.one(name, |s| s.name == name && s.service_name == server.service_name);
    assert!(trace.descends_from(db, server), "{name} runs inside {}", server.name);
    assert_eq!(db.attr("db.system"), Some("postgresql"));
    assert_eq!(db.kind, SpanKind::Client);
    assert!(db.attr("db.operation.name").is_some() && db.attr("db.collection.name").is_some());
}

/// True when the order's timeline (filled by order's consumer) lists `event_type`.
fn has_event(order: &Value, event_type: &str) -> bool {
    order["timeline"].as_array().is_some_and(|t| t.iter().any(|e| e["event_type"] == event_type))
}

/// Consumer spans (of `service`) linked to `producer`.
fn consumers_of<'a>(
    all: &'a [ReceivedSpan],
    producer: &ReceivedSpan,
    service: &str,
) -> Vec<&'a ReceivedSpan> {
    all.iter()
        .filter(|s| s.service_name == service && s.kind == SpanKind::Consumer)
        .filter(|s| s.links.iter().any(|l| l.trace_id == producer.trace_id && l.span_id == producer.span_id))
        .collect()
}

/// The producer span (`send <prefix>.order`) of the event written by `step`.
fn order_event_producer<'a>(trace: &Trace<'a>, step: &ReceivedSpan) -> &'a ReceivedSpan {
    trace.one("the order event's producer span", |s| {
        s.kind == SpanKind::Producer && s.service_name == "order" && trace.descends_from(s, step)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_order_is_one_trace_across_all_services_and_its_events_link_to_it() {
    let receiver = OtlpReceiver::start().await;
    let system = start(&receiver).await;
    let (product, customer) = catalogue(&system, 10_000).await;

    let order = place(&system, &customer, &product).await;
    assert_eq!(order["status"], "CONFIRMED", "{order}");
    let trace_id = &trace_of(&order);
    let order_id = order["order_id"].as_str().unwrap().to_string();
    let fetched = system.get_until(&format!("/v1/orders/{order_id}"), |o| o["trace_id"].is_string()).await;
    assert_eq!(fetched["trace_id"], *trace_id, "GET /v1/orders/{{id}} names the order's trace: {fetched}");

    // Both consumers of OrderConfirmed did their work: the order's timeline
    // has the event, and inventory turned the reservation into a sale.
    system.get_until(&format!("/v1/orders/{order_id}"), |o| has_event(o, "OrderConfirmed")).await;
    system.get_until(&format!("/v1/products/{product}"), |p| p["sold"] == 2).await;
    // SIGTERM: each service exports what it has left before it exits.
    system.stop().await;
    let spans = receiver.spans();

    let trace = Trace::of(&spans, trace_id);
    assert_eq!(
        trace.services(),
        BTreeSet::from(["gateway", "inventory", "order", "payment"]),
        "one trace across every service: {:#?}",
        trace.names()
    );
    let saga = assert_gateway_to_saga(&trace, trace_id);
    assert_db_span(
        &trace,
        trace.one("order CreateOrder server span", |s| {
            s.service_name == "order" && s.kind == SpanKind::Server && s.name.ends_with("/CreateOrder")
        }),
        "create orders",
    );

    for (step, outcome) in [
        ("check_account", "succeeded"),
        ("reserve_stock", "succeeded"),
        ("charge_payment", "succeeded"),
        ("confirm_order", "succeeded"),
    ] {
        let span = trace.step(step);
        assert_eq!(span.parent_span_id, saga.span_id, "{step} is a step of the saga");
        assert_eq!(span.attr("saga.step.outcome"), Some(outcome));
        assert_ne!(span.status, SpanStatus::Error, "{step}");
    }
    trace.call(trace.step("check_account"), "payment", "GetAccount");
    let (_, reserve) = trace.call(trace.step("reserve_stock"), "inventory", "ReserveStock");
    assert_db_span(&trace, reserve, "reserve reservations");
    let (_, charge) = trace.call(trace.step("charge_payment"), "payment", "Charge");
    assert_db_span(&trace, charge, "charge payments");
    assert!(
        trace.find(|s| s.name == "saga.step" && s.attr("saga.step.compensation") == Some("true")).is_empty()
    );

    // OrderConfirmed: sent in the order's trace, consumed in new traces linked to the send.
    let confirm = trace.step("confirm_order");
    let producer = order_event_producer(&trace, confirm);
    assert_eq!(
        producer.parent_span_id, confirm.span_id,
        "the send continues the context stored in the outbox row"
    );
    assert!(producer.name.starts_with("send ") && producer.name.ends_with(".order"), "{}", producer.name);
    assert_eq!(producer.attr("messaging.system"), Some("kafka"));
    assert_eq!(producer.attr("messaging.kafka.message.key"), Some(order_id.as_str()));
    assert!(producer.attr("messaging.kafka.offset").is_some(), "the ack's offset is recorded");
    for service in ["inventory", "order"] {
        // A redelivery (after a rebalance) would add a second, duplicate, processing span.
        let consumers = consumers_of(&spans, producer, service);
        assert!(!consumers.is_empty(), "{service} consumed OrderConfirmed in a span linked to its send");
        for consumer in consumers {
            assert_consumer(consumer, producer, trace_id, &order_id);
        }
    }
    // The inventory handler's work (the reservation becomes a sale) belongs to its consumer span.
    let commits = consumers_of(&spans, producer, "inventory")
        .into_iter()
        .filter(|consumer| {
            let consumed = Trace::of(&spans, &consumer.trace_id);
            consumed
                .find(|s| s.name == "commit reservations")
                .iter()
                .any(|c| consumed.descends_from(c, consumer))
        })
        .count();
    assert_eq!(commits, 1, "inventory commits the reservation once, inside its consumer span");
}

/// The same order's trace, read back from a real Jaeger that a real
/// OpenTelemetry Collector feeds, on the configurations compose and k8s run
/// (services -> Collector -> Jaeger): every service's spans, one root, the
/// saga and its steps with their calls, and the consumers' spans, in traces
/// of their own, linked to the event's send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orders_complete_trace_reads_back_from_jaeger_fed_by_the_collector() {
    let tracing = Tracing::start().await;
    let started = SystemTime::now();
    let system = ProcessStack::start(&otel(&tracing.otlp_endpoint())).await;
    let (product, customer) = catalogue(&system, 10_000).await;
    let order = place(&system, &customer, &product).await;
    assert_eq!(order["status"], "CONFIRMED", "{order}");
    let trace_id = &trace_of(&order);
    let order_id = order["order_id"].as_str().unwrap().to_string();
    system.get_until(&format!("/v1/orders/{order_id}"), |o| has_event(o, "OrderConfirmed")).await;
    system.get_until(&format!("/v1/products/{product}"), |p| p["sold"] == 2).await;
    // SIGTERM: each service exports what it has left; the Collector batches for up to 1 s.
    system.stop().await;

    let spans = eventually("the order's trace in Jaeger, with its event's send", WAIT, || async {
        let spans = tracing.trace(trace_id).await;
        let trace = Trace::of(&spans, trace_id);
        // The send of OrderConfirmed, under the confirm step: the order's first event is sent
        // earlier, and the Collector may hand Jaeger the rest of the trace a batch later.
        let confirm =
            trace.find(|s| s.name == "saga.step" && s.attr("saga.step.name") == Some("confirm_order"));
        let sent = confirm.iter().any(|step| {
            !trace
                .find(|s| {
                    s.kind == SpanKind::Producer && s.service_name == "order" && trace.descends_from(s, step)
                })
                .is_empty()
        });
        (trace.services().len() == 4 && sent).then_some(spans)
    })
    .await;
    let trace = Trace::of(&spans, trace_id);
    assert_eq!(
        trace.services(),
        BTreeSet::from(["gateway", "inventory", "order", "payment"]),
        "{:#?}",
        trace.names()
    );
    // One root: every span but the gateway's request has its parent in the trace.
    let roots = trace.find(|s| trace.parent(s).is_none());
    assert_eq!(roots.len(), 1, "one root: {:#?}", roots.iter().map(|s| &s.name).collect::<Vec<_>>());
    let saga = assert_gateway_to_saga(&trace, trace_id);
    assert_eq!(roots[0].name, "POST /v1/orders");
    for step in ["check_account", "reserve_stock", "charge_payment", "confirm_order"] {
        let span = trace.step(step);
        assert_eq!(span.parent_span_id, saga.span_id, "{step} is a step of the saga");
        assert_eq!(span.attr("saga.step.outcome"), Some("succeeded"));
    }
    let (_, reserve) = trace.call(trace.step("reserve_stock"), "inventory", "ReserveStock");
    assert_db_span(&trace, reserve, "reserve reservations");
    let (_, charge) = trace.call(trace.step("charge_payment"), "payment", "Charge");
    assert_db_span(&trace, charge, "charge payments");
    let producer = order_event_producer(&trace, trace.step("confirm_order"));

    // The consumers' spans: traces of their own, linked to the send.
    let linked = eventually("inventory's and order's consumer spans in Jaeger", WAIT, || async {
        let mut all = tracing.traces_of("inventory", started).await;
        all.extend(tracing.traces_of("order", started).await);
        let found =
            ["inventory", "order"].iter().all(|service| !consumers_of(&all, producer, service).is_empty());
        found.then_some(all)
    })
    .await;
    for service in ["inventory", "order"] {
        for consumer in consumers_of(&linked, producer, service) {
            assert_consumer(consumer, producer, trace_id, &order_id);
        }
    }
}

/// How long Jaeger may take to have what the services exported: only turns a hang into a failure.
const WAIT: Duration = Duration::from_secs(60);

/// A consumer span of the order's event `producer`: a new trace, linked to the send.
fn assert_consumer(consumer: &ReceivedSpan, producer: &ReceivedSpan, trace_id: &str, order_id: &str) {
    let service = &consumer.service_name;
    assert_ne!(consumer.trace_id, trace_id, "{service}: processing is a trace of its own");
    assert!(consumer.parent_span_id.is_empty(), "{service}: the consumer span is a root");
    assert_eq!(consumer.name, producer.name.replacen("send ", "process ", 1));
    assert_eq!(consumer.attr("messaging.operation.type"), Some("process"));
    assert_eq!(consumer.attr("messaging.kafka.message.key"), Some(order_id));
    assert!(consumer.attr("messaging.consumer.group.name").is_some_and(|g| !g.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_saga_trace_shows_the_rejected_charge_and_the_compensation() {
    let receiver = OtlpReceiver::start().await;
    let system = start(&receiver).await;
    // 2 x 250 cents, but only 100 of credit.
    let (product, customer) = catalogue(&system, 100).await;

    let order = place(&system, &customer, &product).await;
    assert_eq!(order["status"], "CANCELLED", "{order}");
    let trace_id = &trace_of(&order);
    assert!(order["failure_reason"].as_str().unwrap_or_default().contains("insufficient funds"), "{order}");
    let order_id = order["order_id"].as_str().unwrap().to_string();

    system.get_until(&format!("/v1/orders/{order_id}"), |o| has_event(o, "OrderCancelled")).await;
    system.stop().await;
    let spans = receiver.spans();
    let trace = Trace::of(&spans, trace_id);
    let saga = assert_gateway_to_saga(&trace, trace_id);
    let steps: BTreeSet<&str> =
        trace.find(|s| s.name == "saga.step").iter().filter_map(|s| s.attr("saga.step.name")).collect();
    assert_eq!(
        steps,
        BTreeSet::from(["charge_payment", "check_account", "release_stock", "reserve_stock"]),
        "a rejected charge took no effect: nothing to refund, the reservation is released"
    );

    let charge_step = trace.step("charge_payment");
    assert_eq!(charge_step.parent_span_id, saga.span_id);
    assert_eq!(charge_step.attr("saga.step.outcome"), Some("rejected"));
    assert_eq!(charge_step.status, SpanStatus::Error, "the rejected step is an error span");
    assert!(charge_step.status_message.contains("insufficient funds"), "{}", charge_step.status_message);
    let (client, server) = trace.call(charge_step, "payment", "Charge");
    assert_eq!(client.status, SpanStatus::Error, "a client span is an error for every non-OK status");
    assert_eq!(client.attr("rpc.grpc.status_code"), Some("9"), "FAILED_PRECONDITION");
    assert_ne!(
        server.status,
        SpanStatus::Error,
        "a business rejection is the caller's problem, not payment's"
    );

    let release = trace.step("release_stock");
    assert_eq!(release.parent_span_id, saga.span_id, "the compensation is a step of the same saga");
    assert_eq!(release.attr("saga.step.compensation"), Some("true"));
    assert_eq!(release.attr("saga.step.outcome"), Some("succeeded"));
    assert_ne!(release.status, SpanStatus::Error);
    let (_, released) = trace.call(release, "inventory", "ReleaseReservation");
    assert_db_span(&trace, released, "release reservations");
    let producer = order_event_producer(&trace, release);
    assert_eq!(producer.attr("messaging.kafka.message.key"), Some(order_id.as_str()), "OrderCancelled");
    // The reserve step still succeeded, in the same trace.
    assert_eq!(trace.step("reserve_stock").attr("saga.step.outcome"), Some("succeeded"));
}

/// A saga another replica resumes stays in its order's trace. The first
/// replica stops dead before the charge (a fault-injected crash) and keeps
/// its lease; when the lease runs out, a second replica resumes the saga,
/// and its `saga` span is a child of the same `CreateOrder` span as the
/// first drive's, so the charge and the confirmation are in the order's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_resumed_by_another_replica_continues_the_orders_trace() {
    let receiver = OtlpReceiver::start().await;
    let lease = ("APP_SAGA__LEASE_MS", "1000");
    let system = start_with(&receiver, &[("APP_SAGA__CRASH_POINT", "before:charge_payment"), lease]).await;
    let (product, customer) = catalogue(&system, 10_000).await;
    let order = place(&system, &customer, &product).await;
    assert_eq!(order["status"], "PENDING", "the first replica stopped before the charge: {order}");
    let trace_id = &trace_of(&order);
    let order_id = order["order_id"].as_str().unwrap().to_string();

    let endpoint = receiver.endpoint();
    let mut replica = system.start_order_replica(&[&otel(&endpoint)[..], &[lease]].concat()).await;
    let order = system.get_until(&format!("/v1/orders/{order_id}"), |o| o["status"] == "CONFIRMED").await;
    assert_eq!(order["trace_id"], *trace_id, "{order}");
    replica.terminate().await;
    system.stop().await;
    let spans = receiver.spans();

    let trace = Trace::of(&spans, trace_id);
    let create = trace.one("order CreateOrder server span", |s| {
        s.service_name == "order" && s.kind == SpanKind::Server && s.name.ends_with("/CreateOrder")
    });
    let drives = trace.find(|s| s.service_name == "order" && s.name == "saga");
    assert_eq!(
        drives.len(),
        2,
        "the first drive and the resumed one, in the order's trace: {:#?}",
        trace.names()
    );
    for drive in &drives {
        assert!(trace.descends_from(drive, create), "every drive of the saga is under CreateOrder");
    }
    assert_eq!(drives[0].parent_span_id, drives[1].parent_span_id, "both drives hang off the same span");
    let charge = trace.step("charge_payment");
    let resumed =
        drives.iter().find(|d| charge.parent_span_id == d.span_id).expect("the charge is a step of a drive");
    assert!(trace.descends_from(trace.step("confirm_order"), resumed), "the resumed drive also confirms");
    trace.call(charge, "payment", "Charge");
}

/// A client's `traceparent` names neither the order's trace nor its parent: the
/// gateway's request span is the root of a new trace and links to the client's span;
/// the order stores that trace, and the internal hops (gRPC to order, the saga, the
/// outbox row's send) continue it. Nothing is exported in the client's trace. A
/// malformed `traceparent` is ignored: the order is placed, in a trace of its own,
/// with no link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_starts_the_orders_trace_and_only_links_the_clients() {
    let receiver = OtlpReceiver::start().await;
    let system = start(&receiver).await;
    let (product, customer) = catalogue(&system, 10_000).await;

    let linked = place(&system, &customer, &product).await;
    assert_eq!(linked["status"], "CONFIRMED", "{linked}");
    let linked_trace = trace_of(&linked);
    let linked_id = linked["order_id"].as_str().unwrap().to_string();
    let stored =
        system.get_until(&format!("/v1/orders/{linked_id}"), |o| has_event(o, "OrderConfirmed")).await;
    assert_eq!(stored["trace_id"], linked_trace.as_str(), "the order stores the gateway's trace: {stored}");

    // A trace id one digit short, and garbage: neither is a context.
    let mut malformed_traces = Vec::new();
    for traceparent in ["00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", "not a traceparent"] {
        let order = place_with(&system, traceparent, &customer, &product).await;
        assert_eq!(order["status"], "CONFIRMED", "{traceparent}: {order}");
        malformed_traces.push(trace_of(&order));
    }
    system.stop().await;
    let spans = receiver.spans();

    let in_clients: Vec<&str> =
        spans.iter().filter(|s| s.trace_id == CALLER_TRACE_ID).map(|s| s.name.as_str()).collect();
    assert!(in_clients.is_empty(), "no span joins the client's trace: {in_clients:?}");
    let trace = Trace::of(&spans, &linked_trace);
    let saga = assert_gateway_to_saga(&trace, &linked_trace);
    let confirm = trace.step("confirm_order");
    assert_eq!(confirm.parent_span_id, saga.span_id);
    let producer = order_event_producer(&trace, confirm);
    assert_eq!(producer.parent_span_id, confirm.span_id, "the outbox row carries the gateway's trace");

    for trace_id in &malformed_traces {
        let trace = Trace::of(&spans, trace_id);
        let http = trace
            .one("gateway HTTP server span", |s| s.service_name == "gateway" && s.kind == SpanKind::Server);
        assert_eq!(http.attr("http.response.status_code"), Some("201"));
        assert_eq!(http.parent_span_id, "", "a trace of its own");
        assert!(http.links.is_empty(), "a malformed traceparent is no link: {:?}", http.links);
        trace.one("order CreateOrder server span", |s| {
            s.service_name == "order" && s.kind == SpanKind::Server && s.name.ends_with("/CreateOrder")
        });
    }
}

/// A client's sampled flag does not force sampling. With a sampler that samples
/// no trace the gateway starts (`parentbased_always_off`, in every service), a
/// request carrying a sampled `traceparent` is still served and its order gets
/// the gateway's trace id, but nothing of it is exported: not the gateway's
/// request, not order's call, not the saga.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_sampled_flag_cannot_force_sampling() {
    let receiver = OtlpReceiver::start().await;
    let system = start_with(&receiver, &[("OTEL_TRACES_SAMPLER", "parentbased_always_off")]).await;
    let (product, customer) = catalogue(&system, 10_000).await;

    let order = place(&system, &customer, &product).await;
    assert_eq!(order["status"], "CONFIRMED", "{order}");
    let trace_id = trace_of(&order);
    let order_id = order["order_id"].as_str().unwrap().to_string();
    system.get_until(&format!("/v1/orders/{order_id}"), |o| has_event(o, "OrderConfirmed")).await;
    // SIGTERM: each service exports whatever it sampled before it exits.
    system.stop().await;
    let spans = receiver.spans();

    let exported: Vec<String> = spans
        .iter()
        .filter(|s| s.trace_id == CALLER_TRACE_ID || s.trace_id == trace_id || s.service_name == "gateway")
        .map(|s| format!("{}: {} in {}", s.service_name, s.name, s.trace_id))
        .collect();
    assert!(exported.is_empty(), "the client's sampled flag made these spans be exported: {exported:#?}");
}
