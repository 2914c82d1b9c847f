//! Telemetry for sagaworks services (to be completed: see issue 6).

pub mod propagation {
    /// The W3C `traceparent` of the current span, if it is sampled into a trace.
    pub fn current_traceparent() -> Option<String> {
        None
    }

    /// The trace id (32 hex digits) of the current span.
    pub fn current_trace_id() -> Option<String> {
        None
    }
}
