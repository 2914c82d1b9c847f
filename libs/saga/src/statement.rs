//! The one SQL statement a saga transition commits.
//!
//! Every transition (a step's result, the saga's next state, the next step's
//! attempt, the host's business writes and outbox events) is one statement:
//! a chain of data-modifying common table expressions, atomic without a
//! transaction and one round trip. The engine writes its own parts first;
//! the host adds its writes with [`Statement::with`] and its events with
//! [`Statement::event`]. Every host part must select from
//! [`Statement::guard`], the engine's lease-guarded update of the instance,
//! so that a driver that lost its lease writes nothing at all:
//!
//! ```ignore
//! let id = w.bind(order_id);
//! let guard = w.guard();
//! w.with("confirm", format!("UPDATE orders SET status = 'CONFIRMED' FROM {guard} WHERE orders.id = {id}"));
//! w.event(outbox.pending(NewEvent::new("order", order_id, "OrderConfirmed", payload)?)?);
//! ```
//!
//! Placeholders are numbered in the order values are bound, so the same
//! sequence of parts gives the same SQL text, which sqlx prepares once per
//! connection.

use sagaworks_outbox::PendingEvent;
use sagaworks_outbox::writer::Bind;
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, Postgres};

/// A statement under construction: its CTEs and their bound values.
pub struct Statement {
    /// `WITH a AS (...),\nb AS (...)`, written in place (a transition is
    /// built for every step of every saga: no part is formatted twice).
    sql: String,
    args: PgArguments,
    count: usize,
    guard: String,
    events: usize,
    error: Option<String>,
}

impl Statement {
    /// A statement whose parts are guarded by the CTE named `guard` (a host
    /// that starts a saga in its own statement names its own first CTE).
    pub fn new(guard: &str) -> Self {
        Self {
            sql: String::new(),
            args: PgArguments::default(),
            count: 0,
            guard: guard.into(),
            events: 0,
            error: None,
        }
    }

    /// Binds `value` and returns its placeholder (`$n`).
    pub fn bind<'q, T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(
        &mut self,
        value: T,
    ) -> String {
        if let Err(e) = self.args.add(value)
            && self.error.is_none()
        {
            self.error = Some(e.to_string());
        }
        self.count += 1;
        placeholder(self.count)
    }

    /// The CTE every part selects from: it returns one row exactly when the
    /// transition is to be written.
    pub fn guard(&self) -> &str {
        &self.guard
    }

    /// Adds `name AS (body)`. `name` must be unique in the statement; the
    /// engine's own parts are named `saga_*`.
    pub fn with(&mut self, name: &str, body: impl AsRef<str>) {
        let body = body.as_ref();
        self.sql.reserve(name.len() + body.len() + 10);
        self.next_part();
        self.sql.push_str(name);
        self.sql.push_str(" AS (");
        self.sql.push_str(body);
        self.sql.push(')');
    }

    /// `WITH ` before the first part, `,\n` between parts.
    fn next_part(&mut self) {
        self.sql.push_str(if self.sql.is_empty() { "WITH " } else { ",\n" });
    }

    /// Adds the outbox row of `event`, inserted once per row of the guard.
    pub fn event(&mut self, event: PendingEvent) {
        self.events += 1;
        let name = format!("event_{}", self.events);
        let cte = PendingEvent::cte(&name, self.count + 1, Some(&self.guard));
        self.next_part();
        self.sql.push_str(&cte);
        // PendingEvent binds its values through the Bind trait below.
        let this = std::mem::replace(self, Statement::new(""));
        *self = event.bind(this);
    }

    /// `WITH <parts> <select>` and its values.
    pub fn finish(self, select: &str) -> Result<(String, PgArguments), sqlx::Error> {
        if let Some(e) = self.error {
            return Err(sqlx::Error::Encode(e.into()));
        }
        let mut sql = self.sql;
        if !sql.is_empty() {
            sql.push('\n');
        }
        sql.push_str(select);
        Ok((sql, self.args))
    }
}

/// `$n`, without the formatting machinery (a statement binds dozens).
fn placeholder(n: usize) -> String {
    let mut digits = [0u8; 20];
    let (mut i, mut n) = (digits.len(), n);
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut p = String::with_capacity(1 + digits.len() - i);
    p.push('$');
    p.extend(digits[i..].iter().map(|&d| d as char));
    p
}

impl<'q> Bind<'q> for Statement {
    fn bind_value<T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(mut self, value: T) -> Self {
        self.bind(value);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_follow_the_binding_order() {
        let mut w = Statement::new("s");
        let a = w.bind(1_i64);
        let b = w.bind("x");
        w.with("one", format!("UPDATE t SET a = {a} FROM s WHERE b = {b}"));
        let (sql, args) = w.finish("SELECT 1 FROM s").unwrap();
        assert_eq!(sql, "WITH one AS (UPDATE t SET a = $1 FROM s WHERE b = $2)\nSELECT 1 FROM s");
        assert_eq!(args.len(), 2);
    }

    #[test]
    fn placeholders_are_dollar_and_the_number() {
        for n in [1, 9, 10, 99, 100, 12_345, usize::MAX] {
            assert_eq!(placeholder(n), format!("${n}"));
        }
    }

    #[test]
    fn parts_are_joined_in_order_and_an_empty_statement_is_its_select() {
        let mut w = Statement::new("a");
        w.with("a", "SELECT 1");
        w.with("b", String::from("SELECT 2 FROM a"));
        assert_eq!(
            w.finish("SELECT * FROM b").unwrap().0,
            "WITH a AS (SELECT 1),\nb AS (SELECT 2 FROM a)\nSELECT * FROM b"
        );
        assert_eq!(Statement::new("a").finish("SELECT 3").unwrap().0, "SELECT 3");
    }
}
