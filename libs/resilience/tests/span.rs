//! Breaker transitions and rejections are events inside the caller's span, so
//! they show on that span in a trace (tracing-opentelemetry exports events as
//! span events).

use sagaworks_proto::inventory::v1::GetStockRequest;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_resilience::{BreakerSettings, ClientSettings, RetrySettings, channel};
use std::sync::{Arc, Mutex};
use tracing::Instrument;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, registry::LookupSpan};

/// An event's message and the name of the span it happened in.
type Recorded = (String, Option<String>);

/// Records each event's message with the name of the span it happened in.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Recorded>>>);

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let span = ctx.event_span(event).map(|s| s.name().to_string());
        self.0.lock().unwrap().push((message.0, span));
    }
}

#[tokio::test]
async fn breaker_transitions_and_rejections_are_events_on_the_callers_span() {
    let recorder = Recorder::default();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));

    // Nothing listens on this port: every attempt is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let settings = ClientSettings {
        url: format!("http://127.0.0.1:{port}"),
        connect_timeout_ms: 200,
        retry: RetrySettings { max_attempts: 1, ..Default::default() },
        breaker: BreakerSettings { sliding_window_size: 2, minimum_calls: 2, ..Default::default() },
        ..Default::default()
    };
    let mut client = InventoryServiceClient::new(channel("inventory", &settings, None).unwrap());
    for _ in 0..3 {
        let call = client.get_stock(GetStockRequest { product_id: "p".into() });
        assert!(call.instrument(tracing::info_span!("place_order")).await.is_err());
    }

    let events = recorder.0.lock().unwrap().clone();
    let in_caller = |message: &str| {
        events.iter().any(|(m, span)| m.contains(message) && span.as_deref() == Some("place_order"))
    };
    assert!(in_caller("circuit breaker state changed"), "{events:#?}");
    assert!(in_caller("rejected"), "the open circuit's rejection: {events:#?}");
}
