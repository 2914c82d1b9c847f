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
    ctes: Vec<String>,
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
            ctes: Vec::new(),
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
        format!("${}", self.count)
    }

    /// The CTE every part selects from: it returns one row exactly when the
    /// transition is to be written.
    pub fn guard(&self) -> &str {
        &self.guard
    }

    /// Adds `name AS (body)`. `name` must be unique in the statement; the
    /// engine's own parts are named `saga_*`.
    pub fn with(&mut self, name: &str, body: impl AsRef<str>) {
        self.ctes.push(format!("{name} AS ({})", body.as_ref()));
    }

    /// Adds the outbox row of `event`, inserted once per row of the guard.
    pub fn event(&mut self, event: PendingEvent) {
        self.events += 1;
        let name = format!("event_{}", self.events);
        let cte = PendingEvent::cte(&name, self.count + 1, Some(&self.guard));
        self.ctes.push(cte);
        // PendingEvent binds its values through the Bind trait below.
        let this = std::mem::replace(self, Statement::new(""));
        *self = event.bind(this);
    }

    /// `WITH <parts> <select>` and its values.
    pub fn finish(self, select: &str) -> Result<(String, PgArguments), sqlx::Error> {
        if let Some(e) = self.error {
            return Err(sqlx::Error::Encode(e.into()));
        }
        let sql = if self.ctes.is_empty() {
            select.to_string()
        } else {
            format!("WITH {}\n{select}", self.ctes.join(",\n"))
        };
        Ok((sql, self.args))
    }
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
}
