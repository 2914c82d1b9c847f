//! Human output: aligned tables and header lines, each function answering the
//! text to print (so tests can check it). Times are UTC (`2026-12-04
//! 19:00:00`), spans short (`45s`, `12m05s`, `3h04m`, `2d03h`); long errors
//! are cut in tables: `--json` has them whole.
//!
//! Every value that comes from the API goes through [`escape`] before it is
//! printed: a dead letter's key, headers, reason and payload are whatever its
//! writer put there, and a terminal acts on control characters (ANSI and OSC
//! sequences can recolour, hide or rewrite what is on the screen, a bare CR
//! overwrites the line, a newline forges one). They show as escapes instead.

use crate::client::{
    DeadLetter, Discarded, DlqTopic, Error, Problem, Replayed, SagaActionResult, SagaDetail, SagaSummary,
    SagaVersion,
};
use chrono::{DateTime, Utc};
use std::fmt::Write as _;

/// A table of left-aligned columns, two spaces apart, with a header row.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<const N: usize>(headers: [&str; N]) -> Self {
        Self { headers: headers.iter().map(|h| h.to_string()).collect(), rows: Vec::new() }
    }

    /// Adds a row, each cell [`escape`]d. Missing cells are empty, extra ones dropped.
    pub fn row(&mut self, cells: impl IntoIterator<Item = String>) -> &mut Self {
        let mut row: Vec<String> = cells.into_iter().map(|c| escape(&c)).take(self.headers.len()).collect();
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table, one line per row, each ending in a newline; no trailing blanks.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let _ = write!(line, "{cell:<width$}");
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `s` on one line with nothing a terminal acts on: control characters (C0, DEL, C1)
/// and the invisible format characters that reorder or hide text (bidirectional
/// overrides and isolates, zero-width marks) are written as escapes: `\n`, `\r`,
/// `\t`, `\x1b` for the other ASCII ones, `\u{9b}` for the rest. Everything else,
/// backslashes included, is kept as it is.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if c.is_control() || is_invisible_format(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// `value` as pretty JSON (`--json`) with nothing a terminal acts on: serde_json
/// escapes the ASCII control characters in strings itself; the other control and
/// invisible format characters (see [`escape`]) are written as `\uXXXX` here, which
/// reads back as the same JSON.
pub fn json(value: &serde_json::Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if (c.is_control() && !c.is_ascii()) || is_invisible_format(c) {
            // Every such character is in the Basic Multilingual Plane: one \u escape.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// Format characters that change how the text around them shows without showing
/// themselves: bidirectional marks, embeddings, overrides and isolates, zero-width
/// characters, the soft hyphen and the byte order mark.
fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{ad}' | '\u{61c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// At most `max` characters, the last one `…` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut cut: String = s.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// A span of whole seconds, short: `45s`, `12m05s`, `3h04m`, `2d03h`.
pub fn span(secs: i64) -> String {
    let secs = secs.max(0);
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3600..86_400 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{:02}h", secs / 86_400, secs % 86_400 / 3600),
    }
}

/// How long from `start` to `end`: `850ms`, `3.2s`, then as [`span`].
pub fn took(start: Option<DateTime<Utc>>, end: Option<DateTime<Utc>>) -> String {
    let (Some(start), Some(end)) = (start, end) else { return "-".into() };
    let ms = (end - start).num_milliseconds().max(0);
    match ms {
        0..1000 => format!("{ms}ms"),
        1000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => span(ms / 1000),
    }
}

/// A UTC time to the second, or `-`.
pub fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(|| "-".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
}

fn or_dash(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("-").to_string()
}

/// `sagas list`.
pub fn saga_list(sagas: &[SagaSummary]) -> String {
    if sagas.is_empty() {
        return "No sagas.\n".into();
    }
    let mut table = Table::new(["SAGA", "ORDER", "STATUS", "STEP", "ATTEMPTS", "AGE", "IDLE", "LAST ERROR"]);
    for s in sagas {
        let error = s.last_error.as_deref().or(s.failure_reason.as_deref());
        table.row([
            s.saga_id.clone(),
            s.order_id.clone(),
            s.status.clone(),
            or_dash(s.current_step.as_deref()),
            s.attempts.to_string(),
            span(s.age_secs),
            span(s.idle_secs),
            truncate(&or_dash(error), 60),
        ]);
    }
    table.render()
}

/// `sagas versions`: one line per saga and version, newest first.
pub fn saga_versions(versions: &[SagaVersion]) -> String {
    if versions.is_empty() {
        return "No versions.\n".into();
    }
    let mut table =
        Table::new(["SAGA", "VERSION", "UNFINISHED", "STARTS NEW", "REGISTERED", "STATE", "FINGERPRINT"]);
    for v in versions {
        let state = match (v.starts_new, v.unfinished) {
            (true, _) => "current",
            (false, 0) => "drained",
            (false, _) => "draining",
        };
        let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
        table.row([
            v.saga_type.clone(),
            v.version.to_string(),
            v.unfinished.to_string(),
            yes(v.starts_new),
            yes(v.registered),
            state.to_string(),
            or_dash(v.fingerprint.as_deref()),
        ]);
    }
    table.render()
}

/// `sagas show`: header lines, the steps' attempts, the operators' actions.
pub fn saga_detail(detail: &SagaDetail) -> String {
    let saga = &detail.saga;
    let mut out = String::new();
    let mut line = |name: &str, value: String| {
        let _ = writeln!(out, "{name:<9} {}", escape(&value));
    };
    line("saga", saga.saga_id.clone());
    line("order", saga.order_id.clone());
    line("status", saga.status.clone());
    line("step", or_dash(saga.current_step.as_deref()));
    if let Some(reason) = saga.failure_reason.as_deref().filter(|r| !r.is_empty()) {
        line("failure", reason.to_string());
    }
    line("created", time(saga.created_at));
    line("progress", time(detail.progressed_at));
    line("trace", or_dash(detail.trace_url.as_deref().or(detail.trace_id.as_deref())));

    let mut steps = Table::new(["STEP", "ATTEMPT", "STARTED", "ENDED", "TOOK", "OUTCOME", "ERROR"]);
    for step in &saga.steps {
        if step.history.is_empty() {
            steps.row([
                step.name.clone(),
                "-".into(),
                time(step.started_at),
                time(step.finished_at),
                took(step.started_at, step.finished_at),
                step.status.to_lowercase(),
                truncate(&or_dash(step.error.as_deref()), 80),
            ]);
        }
        for attempt in &step.history {
            let outcome = match attempt.outcome.as_str() {
                "" if attempt.ended_at.is_none() => "running".to_string(),
                outcome => or_dash(Some(outcome)),
            };
            steps.row([
                step.name.clone(),
                attempt.attempt.to_string(),
                time(attempt.started_at),
                time(attempt.ended_at),
                took(attempt.started_at, attempt.ended_at),
                outcome,
                truncate(&or_dash(attempt.error.as_deref()), 80),
            ]);
        }
    }
    out.push('\n');
    if steps.is_empty() {
        out.push_str("No steps yet.\n");
    } else {
        out.push_str(&steps.render());
    }

    out.push('\n');
    if detail.actions.is_empty() {
        out.push_str("No operator actions.\n");
    } else {
        let mut actions = Table::new(["AT", "ACTION", "STEP", "ACTOR", "REASON"]);
        for a in &detail.actions {
            actions.row([
                time(a.at),
                a.action.clone(),
                a.step.clone(),
                a.actor.clone(),
                truncate(&a.reason, 80),
            ]);
        }
        out.push_str("Operator actions:\n");
        out.push_str(&actions.render());
    }
    out
}

/// `sagas retry|compensate|resolve`: what was done, then the saga.
pub fn saga_action(action: &str, result: &SagaActionResult) -> String {
    let mut out = if result.replayed {
        format!(
            "{action} of step {}: this Idempotency-Key was used before, nothing was done again; the saga now:\n\n",
            escape(&result.step)
        )
    } else {
        format!("{action} of step {}: done; the saga now:\n\n", escape(&result.step))
    };
    out.push_str(&saga_detail(&result.saga));
    out
}

/// `dlq topics`.
pub fn dlq_topics(topics: &[DlqTopic]) -> String {
    if topics.is_empty() {
        return "No dead-letter topics.\n".into();
    }
    let mut table = Table::new(["TOPIC", "DLQ TOPIC", "MESSAGES", "PENDING"]);
    for t in topics {
        table.row([t.topic.clone(), t.dlq_topic.clone(), t.messages.to_string(), t.pending.to_string()]);
    }
    table.render()
}

/// `dlq list`.
pub fn dead_letter_list(messages: &[DeadLetter]) -> String {
    if messages.is_empty() {
        return "No dead letters.\n".into();
    }
    let mut table =
        Table::new(["ID", "STATE", "KEY", "EVENT TYPE", "GROUP", "ATTEMPTS", "DEAD-LETTERED", "ERROR"]);
    for m in messages {
        table.row([
            m.id.clone(),
            m.state.clone(),
            or_dash(m.key.as_deref()),
            or_dash(m.event_type.as_deref()),
            or_dash(m.group.as_deref()),
            m.attempts.to_string(),
            time(m.dead_lettered_at),
            truncate(&or_dash(Some(&m.error)), 60),
        ]);
    }
    table.render()
}

/// `dlq show`: header lines, the Kafka headers, the payload (pretty when it
/// is JSON) and the operators' actions.
pub fn dead_letter(m: &DeadLetter) -> String {
    let mut out = String::new();
    let mut line = |name: &str, value: String| {
        let _ = writeln!(out, "{name:<14} {}", escape(&value));
    };
    line("id", m.id.clone());
    line("state", m.state.clone());
    line("topic", format!("{} (dead letters in {})", m.topic, m.dlq_topic));
    line("key", or_dash(m.key.as_deref()));
    if let Some(o) = &m.original {
        line("original", format!("{} partition {} offset {}", o.topic, o.partition, o.offset));
    }
    line("group", or_dash(m.group.as_deref()));
    line("event", format!("{} {}", or_dash(m.event_type.as_deref()), or_dash(m.event_id.as_deref())));
    line("reason", or_dash(m.reason.as_deref()));
    line("attempts", m.attempts.to_string());
    line("dead-lettered", time(m.dead_lettered_at));
    line("error", m.error.clone());

    out.push_str("\nHeaders:\n");
    if m.headers.is_empty() {
        out.push_str("  (none)\n");
    }
    for (name, value) in &m.headers {
        let _ = writeln!(out, "  {}: {}", escape(name), escape(value));
    }

    let cut = if m.payload_truncated { ", cut to the first 64 KiB" } else { "" };
    let _ = writeln!(out, "\nPayload ({} bytes{cut}):", m.payload_bytes);
    out.push_str(&payload(&m.payload));
    out.push('\n');

    if !m.actions.is_empty() {
        let mut actions = Table::new(["AT", "ACTION", "ACTOR", "REASON"]);
        for a in &m.actions {
            actions.row([time(a.at), a.action.clone(), a.actor.clone(), truncate(&a.reason, 80)]);
        }
        out.push_str("\nOperator actions:\n");
        out.push_str(&actions.render());
    }
    out
}

/// A payload: pretty-printed when it is JSON (its own line breaks kept, each line
/// [`escape`]d), else [`escape`]d as one line.
pub fn payload(text: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(text).map(|json| serde_json::to_string_pretty(&json)) {
        Ok(Ok(pretty)) => pretty.lines().map(escape).collect::<Vec<_>>().join("\n"),
        _ => escape(text),
    }
}

/// `dlq replay`.
pub fn replay_result(topic: &str, result: &Replayed) -> String {
    let mut out = match result.replayed.len() {
        0 => format!("Nothing pending to replay in {}.\n", escape(topic)),
        n => {
            format!("Replayed {n} message(s) to {}: {}\n", escape(topic), escape(&result.replayed.join(", ")))
        }
    };
    if result.replay {
        out.push_str("(this Idempotency-Key was used before: that earlier answer; nothing was sent again)\n");
    }
    out
}

/// `dlq discard`.
pub fn discard_result(topic: &str, result: &Discarded) -> String {
    let mut out = format!("{} {}: {}\n", escape(topic), escape(&result.id), escape(&result.state));
    if result.replay {
        out.push_str("(this Idempotency-Key was used before: that earlier answer)\n");
    }
    out
}

/// An error answer, for stderr: title and status, detail, invalid fields, when to retry.
pub fn problem(p: &Problem) -> String {
    let mut out = format!("{} (HTTP {})\n", escape(&p.title), p.status);
    if let Some(detail) = &p.detail {
        let _ = writeln!(out, "  {}", escape(detail));
    }
    for e in &p.errors {
        let _ = writeln!(out, "  {}: {}", escape(&e.field), escape(&e.message));
    }
    if let Some(secs) = p.retry_after {
        let _ = writeln!(out, "  retry after {secs}s");
    }
    out
}

/// A failed command, for stderr: `error: ...` and its causes, one per line.
pub fn error(e: &Error) -> String {
    let kind = match e {
        Error::NotFound(_) => "not found",
        Error::Conflict(_) => "conflict (nothing changed)",
        Error::Auth(_) => "not allowed (check the token and its admin role)",
        Error::Unavailable(_) => "unavailable (try again later)",
        Error::Api(_) => "the API answered with an error",
        Error::Network { .. } | Error::Protocol { .. } | Error::Setup(_) => "",
    };
    if let Some(p) = e.problem() {
        return format!("error: {kind}: {}", problem(&p.value));
    }
    let mut out = format!("error: {}", escape(&e.to_string()));
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let _ = write!(out, ": {}", escape(&cause.to_string()));
        source = cause.source();
    }
    if let Error::Network { source, .. } = e
        && source.is_timeout()
    {
        out.push_str(" (no answer in time: see --timeout-secs)");
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Fetched, SagaAttempt, SagaOperatorAction, SagaStep};
    use sagaworks_api::FieldError;
    use sagaworks_api::saga::Saga;

    fn at(s: &str) -> Option<DateTime<Utc>> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn tables_align_columns_without_trailing_blanks() {
        let mut table = Table::new(["ID", "STATUS", "ERROR"]);
        table.row(["1".to_string(), "RUNNING".into(), "timeout calling payment".into()]);
        table.row(["1234".to_string(), "OK".into(), String::new()]);
        table.row(["5".to_string()]);
        assert_eq!(
            table.render(),
            "ID    STATUS   ERROR\n\
             1     RUNNING  timeout calling payment\n\
             1234  OK\n\
             5\n"
        );
    }

    #[test]
    fn truncation_counts_characters() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("exactly10!", 10), "exactly10!");
        assert_eq!(truncate("ünïcödé strïng", 8), "ünïcödé…");
    }

    #[test]
    fn spans_and_durations() {
        assert_eq!(span(-3), "0s");
        assert_eq!(span(45), "45s");
        assert_eq!(span(725), "12m05s");
        assert_eq!(span(3 * 3600 + 4 * 60 + 59), "3h04m");
        assert_eq!(span(2 * 86_400 + 3 * 3600), "2d03h");
        let start = at("2026-12-04T19:00:00Z");
        assert_eq!(took(start, at("2026-12-04T19:00:00.850Z")), "850ms");
        assert_eq!(took(start, at("2026-12-04T19:00:03.240Z")), "3.2s");
        assert_eq!(took(start, at("2026-12-04T19:02:05Z")), "2m05s");
        assert_eq!(took(start, None), "-");
    }

    #[test]
    fn saga_list_table() {
        let sagas = [SagaSummary {
            saga_id: "s-1".into(),
            order_id: "o-1".into(),
            status: "RUNNING".into(),
            current_step: Some("charge_payment".into()),
            attempts: 3,
            last_error: Some("payment: deadline exceeded".into()),
            age_secs: 725,
            idle_secs: 61,
            ..Default::default()
        }];
        assert_eq!(
            saga_list(&sagas),
            "SAGA  ORDER  STATUS   STEP            ATTEMPTS  AGE     IDLE   LAST ERROR\n\
             s-1   o-1    RUNNING  charge_payment  3         12m05s  1m01s  payment: deadline exceeded\n"
        );
        assert_eq!(saga_list(&[]), "No sagas.\n");
    }

    #[test]
    fn saga_detail_shows_attempts_and_actions() {
        let saga = SagaDetail {
            saga: Saga {
                saga_id: "s-1".into(),
                order_id: "o-1".into(),
                status: "RUNNING".into(),
                current_step: Some("charge_payment".into()),
                steps: vec![
                    SagaStep {
                        name: "reserve_stock".into(),
                        history: vec![SagaAttempt {
                            attempt: 1,
                            started_at: at("2026-12-04T19:00:00Z"),
                            ended_at: at("2026-12-04T19:00:00.120Z"),
                            outcome: "succeeded".into(),
                            error: None,
                        }],
                        ..Default::default()
                    },
                    SagaStep {
                        name: "charge_payment".into(),
                        history: vec![SagaAttempt {
                            attempt: 1,
                            started_at: at("2026-12-04T19:00:01Z"),
                            ended_at: None,
                            outcome: String::new(),
                            error: None,
                        }],
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
            trace_url: Some("http://jaeger/trace/abc".into()),
            actions: vec![SagaOperatorAction {
                action: "RETRY".into(),
                step: "charge_payment".into(),
                actor: "ops".into(),
                reason: "provider back".into(),
                at: at("2026-12-04T19:05:00Z"),
            }],
            ..Default::default()
        };
        let text = saga_detail(&saga);
        assert!(
            text.starts_with("saga      s-1\norder     o-1\nstatus    RUNNING\nstep      charge_payment\n"),
            "{text}"
        );
        assert!(text.contains("trace     http://jaeger/trace/abc\n"), "{text}");
        assert!(
            text.contains(
                "STEP            ATTEMPT  STARTED              ENDED                TOOK   OUTCOME    ERROR\n\
             reserve_stock   1        2026-12-04 19:00:00  2026-12-04 19:00:00  120ms  succeeded  -\n\
             charge_payment  1        2026-12-04 19:00:01  -                    -      running    -\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("2026-12-04 19:05:00  RETRY   charge_payment  ops    provider back\n"),
            "{text}"
        );
    }

    #[test]
    fn json_payloads_are_pretty_printed() {
        assert_eq!(payload(r#"{"a":1}"#), "{\n  \"a\": 1\n}");
        assert_eq!(payload("not json"), "not json");
    }

    #[test]
    fn a_dead_letter_shows_headers_and_pretty_payload() {
        let message = DeadLetter {
            id: "0-3".into(),
            topic: "order".into(),
            dlq_topic: "order.dlq".into(),
            key: Some("k".into()),
            error: "bad\nprice".into(),
            headers: [("ce_type".to_string(), "order.placed".to_string())].into(),
            payload: r#"{"total":1}"#.into(),
            payload_bytes: 11,
            state: "pending".into(),
            ..Default::default()
        };
        let text = dead_letter(&message);
        assert!(text.starts_with("id             0-3\nstate          pending\n"), "{text}");
        assert!(text.contains("error          bad\\nprice\n"), "{text}");
        assert!(text.contains("\nHeaders:\n  ce_type: order.placed\n"), "{text}");
        assert!(text.ends_with("\nPayload (11 bytes):\n{\n  \"total\": 1\n}\n"), "{text}");
    }

    /// What a dead letter's writer controls, each field carrying what a terminal acts on:
    /// an ANSI CSI (erase the line, recolour), an OSC 8 hyperlink (text that links
    /// elsewhere), a bare CR (back to the start of the line, to overwrite it), a newline
    /// (a forged line), C1 CSI and a right-to-left override.
    const HOSTILE: [&str; 6] = [
        "\x1b[2K\x1b[31m",
        "\x1b]8;;https://evil.example\x07/sagaworks/order\x1b]8;;\x07",
        "forged\r/sagaworks/order",
        "a\nce_source: /sagaworks/order",
        "\u{9b}2K",
        "\u{202e}redro",
    ];

    /// `text` holds no control character but its own line breaks, no invisible
    /// format character, and exactly `lines` lines.
    fn assert_inert(text: &str, lines: usize) {
        for c in text.chars() {
            assert!(
                c == '\n' || !(c.is_control() || is_invisible_format(c)),
                "{c:?} printed raw in:\n{text}"
            );
        }
        assert_eq!(text.lines().count(), lines, "a forged line in:\n{text}");
    }

    #[test]
    fn escape_writes_every_control_and_invisible_format_character_as_an_escape() {
        assert_eq!(escape(HOSTILE[0]), "\\x1b[2K\\x1b[31m");
        assert_eq!(escape(HOSTILE[1]), "\\x1b]8;;https://evil.example\\x07/sagaworks/order\\x1b]8;;\\x07");
        assert_eq!(escape(HOSTILE[2]), "forged\\r/sagaworks/order");
        assert_eq!(escape(HOSTILE[3]), "a\\nce_source: /sagaworks/order");
        assert_eq!(escape(HOSTILE[4]), "\\u{9b}2K");
        assert_eq!(escape(HOSTILE[5]), "\\u{202e}redro");
        assert_eq!(escape("\t\x00\x7f\u{200b}\u{feff}"), "\\t\\x00\\x7f\\u{200b}\\u{feff}");
        assert_eq!(escape("plain ünïcödé, a \\ and 日本"), "plain ünïcödé, a \\ and 日本");
    }

    #[test]
    fn a_dead_letter_with_terminal_sequences_in_every_field_prints_them_escaped() {
        let hostile = |i: usize| format!("{}{}", HOSTILE[i % HOSTILE.len()], i);
        let message = DeadLetter {
            id: hostile(0),
            topic: hostile(1),
            dlq_topic: hostile(2),
            key: Some(hostile(3)),
            original: Some(crate::client::OriginalPosition { topic: hostile(4), partition: 0, offset: 1 }),
            group: Some(hostile(5)),
            reason: Some(hostile(6)),
            error: hostile(7),
            event_id: Some(hostile(8)),
            event_type: Some(hostile(9)),
            headers: [(hostile(10), hostile(11)), ("ce_source".into(), hostile(12))].into(),
            payload: hostile(13),
            payload_bytes: 1,
            state: hostile(14),
            actions: vec![crate::client::DeadLetterAction {
                action: hostile(15),
                actor: hostile(16),
                reason: hostile(17),
                at: None,
            }],
            ..Default::default()
        };
        let shown = dead_letter(&message);
        // 11 header lines, blank, "Headers:", 2 headers, blank, "Payload", the payload,
        // blank, "Operator actions:", the table's header and one row.
        assert_inert(&shown, 22);
        assert!(shown.contains("\nkey            a\\nce_source: /sagaworks/order3\n"), "{shown}");
        assert!(shown.contains("\n  ce_source: \\x1b[2K\\x1b[31m12\n"), "{shown}");
        assert!(shown.contains("\nreason         \\x1b[2K\\x1b[31m6\n"), "{shown}");

        // A JSON payload keeps its own line breaks; its strings show escaped.
        let json = DeadLetter {
            payload: serde_json::json!({ HOSTILE[1]: HOSTILE[4], "b": HOSTILE[5] }).to_string(),
            ..message.clone()
        };
        let shown = dead_letter(&json);
        assert_inert(&shown, 25);
        assert!(shown.contains("\n  \"b\": \"\\u{202e}redro\"\n"), "{shown}");

        let listed = dead_letter_list(&[message.clone(), json]);
        assert_inert(&listed, 3);
        assert!(listed.contains("a\\nce_source: /sagaworks/order3"), "{listed}");
    }

    #[test]
    fn json_output_escapes_what_serde_json_leaves_raw_and_reads_back_the_same() {
        let value = serde_json::json!({ "k": HOSTILE.concat() });
        let text = json(&value);
        assert_inert(&text, 3);
        assert!(text.contains("\\u009b2K") && text.contains("\\u202eredro"), "{text}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), value);
    }

    #[test]
    fn problems_are_readable() {
        let problem = Fetched {
            value: Problem {
                errors: vec![FieldError { field: "limit".into(), message: "too big".into() }],
                title: "Invalid request".into(),
                ..Problem::new(422, "validation", "").detail("see errors")
            },
            raw: serde_json::Value::Null,
        };
        assert_eq!(
            error(&Error::from_problem(problem)),
            "error: the API answered with an error: Invalid request (HTTP 422)\n  see errors\n  limit: too big\n"
        );
    }
}
