//! W3C trace-context propagation: the current `traceparent`, and moving the context in
//! and out of carriers (HTTP headers, gRPC metadata, outbox rows, Kafka headers).
//!
//! `inject`/`extract` use the global propagator that [`init`](crate::init) installs
//! (W3C TraceContext); [`current_traceparent`] and [`context_from_traceparent`] always
//! speak W3C, because that is what an outbox row stores.
//!
//! Kafka: the relay calls [`headers_to_inject`] (or [`headers_for`]) and adds each pair
//! as a header; a consumer passes the message's headers to [`context_from_pairs`] and
//! links its span to the result (see [`messaging`](crate::messaging)). This crate does
//! not depend on rdkafka.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::collections::HashMap;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub(crate) use opentelemetry_http::{HeaderExtractor, HeaderInjector};

/// The W3C header carrying trace id, parent span id and flags.
pub(crate) const TRACEPARENT: &str = "traceparent";
/// The W3C header carrying vendor-specific trace state.
pub(crate) const TRACESTATE: &str = "tracestate";

/// The OpenTelemetry context of the current `tracing` span (or, when that has none, the
/// context attached with the OpenTelemetry API).
pub(crate) fn current_context() -> Context {
    let cx = tracing::Span::current().context();
    if cx.span().span_context().is_valid() { cx } else { Context::current() }
}

/// The W3C `traceparent` of the current span (`00-<trace id>-<span id>-<flags>`), or
/// `None` outside a span. Unsampled spans have one too (flags `00`), so the sampling
/// decision travels downstream.
pub fn current_traceparent() -> Option<String> {
    current_w3c().0
}

/// The W3C `tracestate` of the current span, or `None` when it is empty or there is no span.
pub fn current_tracestate() -> Option<String> {
    current_w3c().1
}

/// [`current_traceparent`] and [`current_tracestate`] together, from one look-up of
/// the current context (what an outbox row stores).
pub fn current_w3c() -> (Option<String>, Option<String>) {
    w3c_of(&current_context())
}

/// The `traceparent` and non-empty `tracestate` of `cx` (none when it has no valid span context).
fn w3c_of(cx: &Context) -> (Option<String>, Option<String>) {
    let mut fields = W3c::default();
    TraceContextPropagator::new().inject_context(cx, &mut fields);
    (fields.traceparent, fields.tracestate.filter(|state| !state.is_empty()))
}

/// The trace id (32 lower-case hex digits) of the current span, or `None` outside a span.
pub fn current_trace_id() -> Option<String> {
    let cx = current_context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// Makes `span` a child of the span a stored `traceparent` names. Call it
/// before `span` is first entered (later, tracing-opentelemetry ignores it);
/// an invalid `traceparent` leaves `span` where it was.
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    let _ = span.set_parent(context_from_traceparent(traceparent, None));
}

/// The remote context described by a stored `traceparent` (and optional `tracestate`).
/// An invalid `traceparent` gives an empty context, so spans parented on it start a new trace.
pub fn context_from_traceparent(traceparent: &str, tracestate: Option<&str>) -> Context {
    let mut carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.trim().to_owned())]);
    if let Some(state) = tracestate {
        carrier.insert(TRACESTATE.to_owned(), state.to_owned());
    }
    TraceContextPropagator::new().extract(&carrier)
}

/// True when `value` (trimmed) follows the W3C `traceparent` syntax to the letter:
/// `version-traceid-parentid-flags`, each of exactly 2, 32, 16 and 2 lower-case hex
/// digits, a version other than `ff`, ids that are not all zeros, and for version `00`
/// nothing after the flags (a later version may append `-` and more). The propagator
/// is laxer (it pads a short id, for one), which is fine for the contexts the services
/// write themselves but not for what an outside client sends.
pub(crate) fn is_well_formed_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.trim().split('-').collect();
    let [version, trace_id, parent_id, flags, rest @ ..] = parts.as_slice() else {
        return false;
    };
    let hex = |field: &str, len: usize| {
        field.len() == len && field.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let zeros = |field: &str| field.bytes().all(|b| b == b'0');
    hex(version, 2)
        && *version != "ff"
        && (*version != "00" || rest.is_empty())
        && hex(trace_id, 32)
        && !zeros(trace_id)
        && hex(parent_id, 16)
        && !zeros(parent_id)
        && hex(flags, 2)
}

/// Writes `cx` into `carrier` with the global propagator.
pub(crate) fn inject_context(cx: &Context, carrier: &mut impl Injector) {
    opentelemetry::global::get_text_map_propagator(|propagator| propagator.inject_context(cx, carrier))
}

/// Reads a remote context from `carrier` with the global propagator (empty when there is none).
pub(crate) fn extract(carrier: &impl Extractor) -> Context {
    opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(carrier))
}

/// The headers (`traceparent`, and `tracestate` when non-empty) that carry the current
/// context, e.g. into a Kafka record. Empty outside a span.
pub fn headers_to_inject() -> Vec<(String, String)> {
    headers_for(&current_context())
}

/// The headers that carry `cx`.
pub fn headers_for(cx: &Context) -> Vec<(String, String)> {
    let mut pairs = Pairs::default();
    inject_context(cx, &mut pairs);
    pairs.0
}

/// The remote context in a list of byte-valued headers (Kafka headers). Header names
/// are matched case-insensitively; values that are not UTF-8 are ignored.
pub fn context_from_pairs<'a>(pairs: impl Iterator<Item = (&'a str, &'a [u8])>) -> Context {
    // Borrowed, not copied: a message carries a dozen headers, the propagator reads two.
    let carrier = BorrowedPairs(
        pairs.filter_map(|(key, value)| Some((key, std::str::from_utf8(value).ok()?))).collect(),
    );
    extract(&carrier)
}

/// Header pairs as an extraction carrier, names matched case-insensitively.
struct BorrowedPairs<'a>(Vec<(&'a str, &'a str)>);

impl Extractor for BorrowedPairs<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| *v)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| *k).collect()
    }
}

/// The two W3C fields, as an injection carrier.
#[derive(Default)]
struct W3c {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl Injector for W3c {
    fn set(&mut self, key: &str, value: String) {
        match key {
            TRACEPARENT => self.traceparent = Some(value),
            TRACESTATE => self.tracestate = Some(value),
            _ => {}
        }
    }
}

/// An ordered list of header pairs as an injection carrier; empty values (an empty
/// `tracestate`) are left out.
#[derive(Default)]
struct Pairs(Vec<(String, String)>);

impl Injector for Pairs {
    fn set(&mut self, key: &str, value: String) {
        self.0.retain(|(k, _)| k != key);
        if !value.is_empty() {
            self.0.push((key.to_owned(), value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_parses_into_a_remote_sampled_context() {
        let cx = context_from_traceparent(TP, Some("vendor=1"));
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_id(), TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap());
        assert_eq!(sc.span_id(), SpanId::from_hex("00f067aa0ba902b7").unwrap());
        assert_eq!(sc.trace_state().header(), "vendor=1");
        assert_eq!(w3c_of(&cx), (Some(TP.to_owned()), Some("vendor=1".to_owned())));
    }

    #[test]
    fn garbage_traceparent_gives_an_empty_context() {
        for bad in ["", "nope", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "zz-4bf9-00f0-01"]
        {
            assert!(!context_from_traceparent(bad, None).span().span_context().is_valid(), "{bad:?}");
        }
    }

    #[test]
    fn only_a_traceparent_of_the_w3c_syntax_is_well_formed() {
        assert!(is_well_formed_traceparent(TP));
        assert!(is_well_formed_traceparent(&format!(" {TP} ")));
        assert!(is_well_formed_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
        assert!(is_well_formed_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later"));
        for bad in [
            "",
            "nope",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47366-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(!is_well_formed_traceparent(bad), "{bad:?}");
        }
    }

    #[test]
    fn pairs_round_trip_through_the_w3c_propagator() {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let sc = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::from_key_value([("k", "v")]).unwrap(),
        );
        let headers = headers_for(&Context::new().with_remote_span_context(sc.clone()));
        assert_eq!(headers[0], (TRACEPARENT.to_owned(), TP.to_owned()));
        assert_eq!(headers[1], (TRACESTATE.to_owned(), "k=v".to_owned()));

        let mut kafka: Vec<(&str, &[u8])> = vec![("ce_id", b"1"), ("Traceparent", b"\xff")];
        kafka.extend(headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes())));
        let back = context_from_pairs(kafka.into_iter());
        assert_eq!(back.span().span_context().trace_id(), sc.trace_id());
        assert_eq!(back.span().span_context().span_id(), sc.span_id());
        assert_eq!(back.span().span_context().trace_state().header(), "k=v");
    }

    #[test]
    fn an_empty_tracestate_is_not_a_header() {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let headers = headers_for(&context_from_traceparent(TP, None));
        assert_eq!(headers, vec![(TRACEPARENT.to_owned(), TP.to_owned())]);
    }

    #[test]
    fn nothing_to_propagate_outside_a_span() {
        assert_eq!(current_tracestate(), None);
        assert_eq!(current_traceparent(), None);
        assert_eq!(current_trace_id(), None);
        assert!(headers_to_inject().is_empty());
    }
}
