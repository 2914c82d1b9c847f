//! Spans exported over real OTLP/gRPC to an in-process receiver, through real tonic
//! and axum servers. Each test runs in its own process under nextest, so each
//! installs the global subscriber once.

mod common;

use axum::Router;
use axum::body::Body as AxumBody;
use axum::routing::get;
use common::{EXPORT_TIMEOUT, SERVICE, VERSION, init_exporting_to, start_inventory, the};
use opentelemetry::trace::TraceContextExt;
use sagaworks_proto::inventory::v1::GetStockRequest;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_telemetry::grpc::ClientTraceLayer;
use sagaworks_telemetry::messaging::{KafkaMessage, consumer_span, producer_span};
use sagaworks_telemetry::propagation::{
    context_from_pairs, context_from_traceparent, current_trace_id, current_traceparent, current_tracestate,
    headers_to_inject,
};
use sagaworks_telemetry::{TelemetryError, http};
use sagaworks_test_support::otlp::{OtlpReceiver, ReceivedLink, SpanKind, StatusCode};
use tower::{Layer, ServiceExt};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

fn cx_tracestate(cx: &opentelemetry::Context) -> String {
    cx.span().span_context().trace_state().header()
}

const GET_STOCK: &str = "sagaworks.inventory.v1.InventoryService/GetStock";

async fn inventory_client()
-> InventoryServiceClient<sagaworks_telemetry::grpc::ClientTrace<tonic::transport::Channel>> {
    let addr = start_inventory().await;
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    InventoryServiceClient::new(ClientTraceLayer::new("test").layer(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_call_continues_the_callers_trace_from_client_to_server() {
    let receiver = OtlpReceiver::start().await;
    let guard = init_exporting_to(&receiver);
    let mut client = inventory_client().await;

    let root = tracing::info_span!("place_order");
    let product = client
        .get_stock(GetStockRequest { product_id: "p1".into() })
        .instrument(root.clone())
        .await
        .expect("GetStock p1")
        .into_inner();
    assert_eq!(product.sku, "SKU-1");
    let trace_id = root.in_scope(current_trace_id).expect("a trace id inside the root span");
    drop(root);
    guard.shutdown().await.expect("flush");

    let spans = receiver.wait_for("4 spans", EXPORT_TIMEOUT, |s| s.len() >= 4).await;
    let root = the(&spans, "place_order", |_| true);
    let client_span = the(&spans, GET_STOCK, |s| s.kind == SpanKind::Client);
    let server_span = the(&spans, GET_STOCK, |s| s.kind == SpanKind::Server);
    let handler = the(&spans, "load_product", |_| true);

    for span in [root, client_span, server_span, handler] {
        assert_eq!(span.trace_id, trace_id, "{} is in the caller's trace", span.name);
        assert_eq!(span.service_name, SERVICE);
    }
    assert_eq!(root.parent_span_id, "");
    assert_eq!(client_span.parent_span_id, root.span_id);
    assert_eq!(server_span.parent_span_id, client_span.span_id, "server span continues the client span");
    assert_eq!(handler.parent_span_id, server_span.span_id, "handler spans nest under the server span");

    for span in [client_span, server_span] {
        assert_eq!(span.attr("rpc.system"), Some("grpc"));
        assert_eq!(span.attr("rpc.service"), Some("sagaworks.inventory.v1.InventoryService"));
        assert_eq!(span.attr("rpc.method"), Some("GetStock"));
        assert_eq!(span.attr("rpc.grpc.status_code"), Some("0"), "{span:#?}");
        assert_eq!(span.status, StatusCode::Unset);
    }
    assert_eq!(handler.attr("product.id"), Some("p1"));
    assert_eq!(root.resource.get("service.version").map(String::as_str), Some(VERSION));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_grpc_calls_are_errors_on_the_client_and_server_faults_on_the_server() {
    let receiver = OtlpReceiver::start().await;
    let guard = init_exporting_to(&receiver);
    let mut client = inventory_client().await;

    let missing = tracing::info_span!("lookup_missing");
    let status = client
        .get_stock(GetStockRequest { product_id: "nope".into() })
        .instrument(missing.clone())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
    let boom = tracing::info_span!("lookup_boom");
    let status = client
        .get_stock(GetStockRequest { product_id: "boom".into() })
        .instrument(boom.clone())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Internal);
    let missing_trace = missing.in_scope(current_trace_id).unwrap();
    let boom_trace = boom.in_scope(current_trace_id).unwrap();
    drop((missing, boom));
    guard.shutdown().await.expect("flush");

    let spans =
        receiver.wait_for("2 x (root, client, server, handler)", EXPORT_TIMEOUT, |s| s.len() >= 8).await;
    let in_trace =
        |trace: &str, kind| the(&spans, GET_STOCK, |s| s.trace_id == trace && s.kind == kind).clone();

    let client_span = in_trace(&missing_trace, SpanKind::Client);
    assert_eq!(client_span.attr("rpc.grpc.status_code"), Some("5"));
    assert_eq!(client_span.status, StatusCode::Error, "NOT_FOUND fails the client's call");
    let server_span = in_trace(&missing_trace, SpanKind::Server);
    assert_eq!(server_span.attr("rpc.grpc.status_code"), Some("5"));
    assert_eq!(server_span.status, StatusCode::Unset, "NOT_FOUND is not a server fault");
    assert_eq!(server_span.parent_span_id, client_span.span_id);

    let client_span = in_trace(&boom_trace, SpanKind::Client);
    assert_eq!(client_span.attr("rpc.grpc.status_code"), Some("13"));
    assert_eq!(client_span.status, StatusCode::Error);
    let server_span = in_trace(&boom_trace, SpanKind::Server);
    assert_eq!(server_span.attr("rpc.grpc.status_code"), Some("13"));
    assert_eq!(server_span.status, StatusCode::Error, "INTERNAL is a server fault");
    assert!(!server_span.status_message.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_continue_the_incoming_traceparent() {
    let receiver = OtlpReceiver::start().await;
    let guard = init_exporting_to(&receiver);
    let app = Router::new()
        .route("/orders/{id}", get(|| async { current_trace_id().unwrap_or_default() }))
        .route("/fail", get(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }))
        .layer(http::ServerTraceLayer::new("test", http::CallerTrace::Continue));

    let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let request =
        axum::http::Request::get("/orders/42").header("traceparent", incoming).body(AxumBody::empty());
    let response = app.clone().oneshot(request.unwrap()).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
    assert_eq!(&body[..], b"4bf92f3577b34da6a3ce929d0e0e4736", "the handler runs inside the caller's trace");

    let response =
        app.clone().oneshot(axum::http::Request::get("/fail").body(AxumBody::empty()).unwrap()).await;
    assert_eq!(response.unwrap().status(), 500);
    let response = app.oneshot(axum::http::Request::get("/missing").body(AxumBody::empty()).unwrap()).await;
    assert_eq!(response.unwrap().status(), 404);
    guard.shutdown().await.expect("flush");

    let spans = receiver.wait_for("3 server spans", EXPORT_TIMEOUT, |s| s.len() >= 3).await;
    let order = the(&spans, "GET /orders/{id}", |_| true);
    assert_eq!(order.kind, SpanKind::Server);
    assert_eq!(order.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(order.parent_span_id, "00f067aa0ba902b7");
    assert_eq!(order.attr("http.request.method"), Some("GET"));
    assert_eq!(order.attr("url.path"), Some("/orders/42"));
    assert_eq!(order.attr("http.route"), Some("/orders/{id}"));
    assert_eq!(order.attr("http.response.status_code"), Some("200"));
    assert_eq!(order.status, StatusCode::Unset);

    let fail = the(&spans, "GET /fail", |_| true);
    assert_eq!(fail.parent_span_id, "", "no traceparent: a new trace");
    assert_ne!(fail.trace_id, order.trace_id);
    assert_eq!(fail.attr("http.response.status_code"), Some("500"));
    assert_eq!(fail.status, StatusCode::Error);

    let missing = the(&spans, "GET", |_| true);
    assert_eq!(missing.attr("http.route"), None, "no route matched");
    assert_eq!(missing.attr("http.response.status_code"), Some("404"));
    assert_eq!(missing.status, StatusCode::Unset, "4xx is not a server error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_at_the_public_edge_start_a_new_trace_linked_to_the_callers() {
    let receiver = OtlpReceiver::start().await;
    let guard = init_exporting_to(&receiver);
    let app = Router::new()
        .route("/orders/{id}", get(|| async { current_trace_id().unwrap_or_default() }))
        .layer(http::ServerTraceLayer::new("test", http::CallerTrace::Link));
    let get = |id: &str, traceparent: &str| {
        axum::http::Request::get(format!("/orders/{id}"))
            .header("traceparent", traceparent)
            .body(AxumBody::empty())
            .unwrap()
    };

    let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let short = "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01";
    for (id, traceparent) in [("linked", incoming), ("malformed", "00-not-a-trace-01"), ("short", short)] {
        let response = app.clone().oneshot(get(id, traceparent)).await.unwrap();
        assert_eq!(response.status(), 200, "{id}");
        let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
        let trace_id = String::from_utf8(body.to_vec()).unwrap();
        assert_eq!(trace_id.len(), 32, "{id}: the handler runs in a trace");
        assert_ne!(trace_id, "4bf92f3577b34da6a3ce929d0e0e4736", "{id}: not the caller's trace");
    }
    guard.shutdown().await.expect("flush");

    let spans = receiver.wait_for("3 server spans", EXPORT_TIMEOUT, |s| s.len() >= 3).await;
    let linked = the(&spans, "GET /orders/{id}", |s| s.attr("url.path") == Some("/orders/linked"));
    assert_ne!(linked.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736", "a trace of its own");
    assert_eq!(linked.parent_span_id, "", "the root of its trace");
    assert_eq!(
        linked.links,
        vec![ReceivedLink {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            span_id: "00f067aa0ba902b7".into()
        }],
        "linked to the caller's span"
    );
    for id in ["malformed", "short"] {
        let path = format!("/orders/{id}");
        let malformed = the(&spans, "GET /orders/{id}", |s| s.attr("url.path") == Some(path.as_str()));
        assert_eq!(malformed.parent_span_id, "", "{id}");
        assert!(
            malformed.links.is_empty(),
            "{id}: a malformed traceparent is no link: {:?}",
            malformed.links
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_span_starts_a_new_trace_linked_to_the_producer_span() {
    let receiver = OtlpReceiver::start().await;
    let guard = init_exporting_to(&receiver);

    // The business operation stores its traceparent in the outbox row.
    let stored = tracing::info_span!("create_order").in_scope(current_traceparent).expect("traceparent");
    // The relay sends the row inside a producer span parented on the stored context.
    let message = KafkaMessage::new("sagaworks.order").with_key("order-1");
    let producer = producer_span(&message, context_from_traceparent(&stored, None));
    let headers = producer.in_scope(headers_to_inject);
    let producer_ids = producer.context().span().span_context().clone();
    drop(producer);
    // Kafka carries the headers as bytes; a consumer, busy in its poll loop, handles the record.
    let kafka_headers: Vec<(String, Vec<u8>)> = headers
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .chain([("ce_id".into(), b"e-1".to_vec())])
        .collect();
    let poll_loop = tracing::info_span!("poll_loop");
    let consumer = poll_loop.in_scope(|| {
        let producer_cx = context_from_pairs(kafka_headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
        let received = message.with_partition(2).with_offset(7).with_consumer_group("payment");
        consumer_span(&received, &producer_cx)
    });
    consumer.in_scope(|| tracing::info_span!("charge").in_scope(|| {}));
    drop((consumer, poll_loop));
    drop(guard); // flushes too

    let spans = receiver.wait_for("5 spans", EXPORT_TIMEOUT, |s| s.len() >= 5).await;
    let business = the(&spans, "create_order", |_| true);
    let send = the(&spans, "send sagaworks.order", |_| true);
    let process = the(&spans, "process sagaworks.order", |_| true);
    let handler = the(&spans, "charge", |_| true);

    assert_eq!(send.kind, SpanKind::Producer);
    assert_eq!(send.trace_id, business.trace_id, "the send belongs to the business trace");
    assert_eq!(send.parent_span_id, business.span_id);
    assert_eq!(send.span_id, producer_ids.span_id().to_string());
    assert_eq!(send.attr("messaging.operation.type"), Some("send"));
    assert_eq!(send.attr("messaging.kafka.message.key"), Some("order-1"));

    assert_eq!(process.kind, SpanKind::Consumer);
    assert_eq!(process.parent_span_id, "", "not a child of the poll loop or the producer");
    assert_ne!(process.trace_id, business.trace_id);
    assert_eq!(
        process.links,
        vec![ReceivedLink { trace_id: send.trace_id.clone(), span_id: send.span_id.clone() }]
    );
    assert_eq!(process.attr("messaging.system"), Some("kafka"));
    assert_eq!(process.attr("messaging.destination.name"), Some("sagaworks.order"));
    assert_eq!(process.attr("messaging.operation.type"), Some("process"));
    assert_eq!(process.attr("messaging.kafka.message.key"), Some("order-1"));
    assert_eq!(process.attr("messaging.destination.partition.id"), Some("2"));
    assert_eq!(process.attr("messaging.kafka.offset"), Some("7"));
    assert_eq!(process.attr("messaging.consumer.group.name"), Some("payment"));
    assert_eq!(handler.parent_span_id, process.span_id);
    assert_eq!(handler.trace_id, process.trace_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_traceparent_round_trips_and_names_the_nested_span() {
    let receiver = OtlpReceiver::start().await;
    let guard = init_exporting_to(&receiver);

    let outer = tracing::info_span!("outer");
    let (traceparent, trace_id) = outer.in_scope(|| {
        tracing::info_span!("inner")
            .in_scope(|| (current_traceparent().unwrap(), current_trace_id().unwrap()))
    });
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!((parts[0], parts[1], parts[3]), ("00", trace_id.as_str(), "01"));

    let cx = context_from_traceparent(&traceparent, None);
    assert_eq!(cx.span().span_context().trace_id().to_string(), trace_id);
    assert_eq!(cx.span().span_context().span_id().to_string(), parts[2]);
    // Another process continues from the stored traceparent.
    let resumed = tracing::info_span!(parent: None, "resumed");
    resumed.set_parent(context_from_traceparent(&traceparent, Some("sagaworks=1"))).unwrap();
    let (resumed_tracestate, inner_tracestate) = (resumed.in_scope(current_tracestate), cx_tracestate(&cx));
    assert_eq!(resumed_tracestate.as_deref(), Some("sagaworks=1"), "tracestate travels with the context");
    assert_eq!(inner_tracestate, "");
    drop((outer, resumed));
    guard.shutdown().await.expect("flush");

    let spans = receiver.wait_for("3 spans", EXPORT_TIMEOUT, |s| s.len() >= 3).await;
    let outer = the(&spans, "outer", |_| true);
    let inner = the(&spans, "inner", |_| true);
    let resumed = the(&spans, "resumed", |_| true);
    assert_eq!(inner.span_id, parts[2], "traceparent names the current (innermost) span");
    assert_eq!(inner.parent_span_id, outer.span_id);
    assert_eq!(resumed.parent_span_id, inner.span_id);
    assert!(spans.iter().all(|s| s.trace_id == trace_id));
    assert_eq!(inner.kind, SpanKind::Internal);
    assert_eq!(inner.service_name, SERVICE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_init_is_refused_and_the_first_keeps_working() {
    let receiver = OtlpReceiver::start().await;
    let guard = init_exporting_to(&receiver);
    let again = sagaworks_telemetry::init("other", "0.0.0", &Default::default());
    assert!(matches!(again, Err(TelemetryError::AlreadyInitialized)), "{again:?}");

    tracing::info_span!("still_traced").in_scope(|| assert!(current_trace_id().is_some()));
    guard.shutdown().await.expect("flush");
    let spans = receiver.wait_for("the span", EXPORT_TIMEOUT, |s| !s.is_empty()).await;
    assert_eq!(the(&spans, "still_traced", |_| true).service_name, SERVICE);
}

#[tokio::test]
async fn shutdown_flushes_on_a_current_thread_runtime() {
    let receiver = OtlpReceiver::start().await;
    let guard = init_exporting_to(&receiver);
    tracing::info_span!("single_threaded").in_scope(|| tracing::info!("work"));
    tokio::time::timeout(std::time::Duration::from_secs(10), guard.shutdown())
        .await
        .expect("shutdown does not block the only runtime thread")
        .expect("flush");
    assert_eq!(receiver.spans().len(), 1, "everything was exported by the time shutdown returned");
    assert_eq!(receiver.spans()[0].name, "single_threaded");
}

#[tokio::test]
async fn without_an_endpoint_spans_still_carry_ids_for_logs_and_propagation() {
    let guard =
        sagaworks_telemetry::init(SERVICE, VERSION, &Default::default()).expect("init without export");
    let (traceparent, trace_id) =
        tracing::info_span!("local").in_scope(|| (current_traceparent(), current_trace_id()));
    let trace_id = trace_id.expect("trace id without an exporter");
    assert_eq!(trace_id.len(), 32);
    assert!(traceparent.expect("traceparent without an exporter").contains(&trace_id));
    guard.shutdown().await.expect("shutdown without an exporter");
}
