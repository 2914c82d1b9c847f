//! Log lines that carry the OpenTelemetry `trace_id` and `span_id` of the span they
//! are logged in, so a log search by trace id finds every line of a request.
//!
//! [`WithTraceIds`] wraps one of `tracing-subscriber`'s event formatters: for JSON it
//! adds `"trace_id"` and `"span_id"` as the first keys of the object, for text it
//! appends `trace_id=… span_id=…` to the line. The ids come from the nearest span in
//! the event's scope that the OpenTelemetry layer has started (every entered span).

use opentelemetry::trace::{SpanId, TraceContextExt, TraceId};
use std::fmt;
use std::sync::{Arc, OnceLock};
use tracing::dispatcher::WeakDispatch;
use tracing::{Dispatch, Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{self as fmt_layer, FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// The shape of a log line, from `telemetry.log_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogStyle {
    Json,
    Pretty,
    Compact,
}

impl LogStyle {
    pub(crate) fn from_setting(format: &str) -> Self {
        match format.trim().to_ascii_lowercase().as_str() {
            "json" => Self::Json,
            "pretty" => Self::Pretty,
            _ => Self::Compact,
        }
    }
}

/// The log layer for `style`, writing lines to `writer` (ANSI colours off: lines
/// are usually collected, and the trace ids are appended to the formatted text).
pub(crate) fn layer<S, W>(style: LogStyle, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let dispatch = DispatchSlot::default();
    let layer = fmt_layer::layer().with_writer(writer).with_ansi(false);
    match style {
        LogStyle::Json => layer
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .map_event_format(WithTraceIds::wrap(style, &dispatch))
            .and_then(dispatch)
            .boxed(),
        LogStyle::Pretty => {
            layer.pretty().map_event_format(WithTraceIds::wrap(style, &dispatch)).and_then(dispatch).boxed()
        }
        LogStyle::Compact => {
            layer.compact().map_event_format(WithTraceIds::wrap(style, &dispatch)).and_then(dispatch).boxed()
        }
    }
}

/// The dispatcher the log layer was registered with, kept by a layer of its
/// own: the formatter asks the OTel layer in it for a span's context, and
/// cannot ask `tracing::dispatcher::get_default` while an event is being
/// dispatched (re-entered, it answers "none" where scoped dispatchers exist).
/// Weak: the dispatcher owns this layer.
#[derive(Debug, Clone, Default)]
struct DispatchSlot(Arc<OnceLock<WeakDispatch>>);

impl DispatchSlot {
    fn get(&self) -> Option<Dispatch> {
        self.0.get()?.upgrade()
    }
}

impl<S: Subscriber> Layer<S> for DispatchSlot {
    fn on_register_dispatch(&self, dispatch: &Dispatch) {
        let _ = self.0.set(dispatch.downgrade());
    }
}

/// An event formatter that adds the trace and span id to what `inner` writes.
#[derive(Debug, Clone)]
struct WithTraceIds<F> {
    inner: F,
    style: LogStyle,
    dispatch: DispatchSlot,
}

impl<F> WithTraceIds<F> {
    fn wrap(style: LogStyle, dispatch: &DispatchSlot) -> impl FnOnce(F) -> Self {
        let dispatch = dispatch.clone();
        move |inner| Self { inner, style, dispatch }
    }
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let ids = self.dispatch.get().and_then(|dispatch| ids_in_scope(ctx, &dispatch));
        let Some((trace_id, span_id)) = ids else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner.format_event(ctx, Writer::new(&mut line), event)?;
        match self.style {
            LogStyle::Json => match line.strip_prefix('{') {
                Some(rest) => {
                    let sep = if rest.trim_start().starts_with('}') { "" } else { "," };
                    write!(writer, "{{\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"{sep}{rest}")
                }
                None => writer.write_str(&line),
            },
            LogStyle::Pretty | LogStyle::Compact => {
                let body = line.trim_end_matches('\n');
                writeln!(writer, "{body} trace_id={trace_id} span_id={span_id}")
            }
        }
    }
}

/// The ids of the innermost span of the event's scope that has a valid
/// (sampled or not) OTel span context.
fn ids_in_scope<S, N>(ctx: &FmtContext<'_, S, N>, dispatch: &Dispatch) -> Option<(TraceId, SpanId)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    ctx.event_scope()?.find_map(|span| {
        let cx = tracing_opentelemetry::get_otel_context(&span.id(), dispatch)?;
        let span = cx.span();
        let context = span.span_context();
        context.is_valid().then(|| (context.trace_id(), context.span_id()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// A `MakeWriter` that collects everything written into one buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Buffer {
        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap().lines().map(str::to_owned).collect()
        }
    }

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// Logs one line outside any span and one inside a span; returns the lines and the span's ids.
    fn log_with(style: LogStyle) -> (Vec<String>, String, String) {
        let buffer = Buffer::default();
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
            .with(layer(style, buffer.clone()));
        let ids = tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside");
            let span = tracing::info_span!("work", order_id = 7);
            let _entered = span.enter();
            tracing::info!(answer = 42, "inside");
            let sc = crate::propagation::current_context();
            let sc = opentelemetry::trace::TraceContextExt::span(&sc).span_context().clone();
            (sc.trace_id().to_string(), sc.span_id().to_string())
        });
        (buffer.lines(), ids.0, ids.1)
    }

    #[test]
    fn json_lines_inside_a_span_carry_its_trace_and_span_id() {
        let (lines, trace_id, span_id) = log_with(LogStyle::Json);
        assert_eq!(lines.len(), 2, "{lines:?}");
        let outside: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(outside["message"], "outside");
        assert!(outside.get("trace_id").is_none(), "no span, no trace id: {outside}");

        let inside: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(trace_id.len(), 32);
        assert_eq!(inside["trace_id"], trace_id.as_str(), "{}", lines[1]);
        assert_eq!(inside["span_id"], span_id.as_str());
        assert_eq!(inside["message"], "inside");
        assert_eq!(inside["answer"], 42);
        assert_eq!(inside["span"]["order_id"], 7);
    }

    #[test]
    fn text_lines_inside_a_span_end_with_trace_and_span_id() {
        let (lines, trace_id, span_id) = log_with(LogStyle::Compact);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].ends_with("outside"), "{}", lines[0]);
        assert!(!lines[0].contains("trace_id="), "{}", lines[0]);
        assert!(lines[1].contains("inside"), "{}", lines[1]);
        assert!(lines[1].ends_with(&format!(" trace_id={trace_id} span_id={span_id}")), "{}", lines[1]);
    }

    #[test]
    fn pretty_output_ends_with_trace_and_span_id() {
        let (lines, trace_id, span_id) = log_with(LogStyle::Pretty);
        let ids = format!(" trace_id={trace_id} span_id={span_id}");
        assert_eq!(lines.iter().filter(|l| l.ends_with(&ids)).count(), 1, "{lines:#?}");
    }

    #[test]
    fn log_format_setting_picks_the_style() {
        assert_eq!(LogStyle::from_setting("json"), LogStyle::Json);
        assert_eq!(LogStyle::from_setting(" JSON "), LogStyle::Json);
        assert_eq!(LogStyle::from_setting("pretty"), LogStyle::Pretty);
        assert_eq!(LogStyle::from_setting("text"), LogStyle::Compact);
    }
}
