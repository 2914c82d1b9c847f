//! The one SQL statement a saga transition commits.
//!
//! Every transition (a step's result, the saga's next state, the next step's
//! attempt, the host's business writes and outbox events) is one statement:
//! a chain of data-modifying common table expressions, atomic without a
//! transaction and one round trip. Its first write is the **guard**
//! ([`Statement::guard`]): in a transition, the lease-guarded update of the
//! instance, which returns one row exactly when this driver still holds the
//! lease; in a start, the host's own insert ([`crate::Engine::start_with`]).
//! Declaring it returns its [`Guard`]. The host adds its writes with
//! [`Statement::guarded`] and its events with [`Statement::event`]; both
//! select from the guard, so a driver that lost its lease writes nothing at
//! all:
//!
//! ```ignore
//! let (id, status) = (w.bind(order_id), w.bind("CONFIRMED"));
//! w.guarded("confirm", |g| g.update("orders").set(format!("status = {status}")).filter(format!("orders.id = {id}")));
//! w.event(outbox.stage(&OrderConfirmed { order_id, .. })?);
//! ```
//!
//! A [`Write`] can only be built from a [`Guard`], and renders it into the
//! SQL (`UPDATE .. FROM guard`, `INSERT .. SELECT .. FROM guard`,
//! `DELETE .. USING guard`): a host part cannot leave it out. A part that
//! must not be guarded says so with [`Statement::unguarded`]. A statement
//! has one guard, declared before the parts that select from it; a guarded
//! part or an event before it, or a second guard, makes [`Statement::finish`]
//! fail.
//!
//! **One write per row.** All parts run as one statement, on one snapshot: PostgreSQL
//! applies only one of two updates of the same row (which one is not defined), and no part
//! sees another's changes. A step's `record` and the saga's `on_end`, committed together
//! when the step ends the saga, must therefore not both update one row: put one of them in
//! a row of its own, or write both changes in one part. Debug builds check it: every
//! guarded update and delete also lists the rows it targets, and a statement in which
//! two of them (or one twice) target one row fails with
//! `two writes of one row in one statement: <parts>`, before anything is written.
//!
//! Placeholders are numbered in the order values are bound, so the same
//! sequence of parts gives the same SQL text, which sqlx prepares once per
//! connection.

use sagaworks_outbox::PendingEvent;
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, Postgres};
use std::borrow::Cow;

/// A statement under construction: its CTEs and their bound values.
#[derive(Default)]
pub struct Statement {
    /// `WITH a AS (...),\nb AS (...)`, written in place (a transition is
    /// built for every step of every saga: no part is formatted twice).
    sql: String,
    args: PgArguments,
    count: usize,
    guard: Option<Guard>,
    events: usize,
    error: Option<String>,
    /// Debug builds: `SELECT part, tableoid, ctid ..` of the rows each guarded
    /// update or delete targets, joined by `UNION ALL` (see the module docs).
    #[cfg(debug_assertions)]
    targets: String,
}

impl Statement {
    /// An empty statement: bind values, then declare its guard ([`Statement::guard`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds `value` and returns its placeholder (`$n`).
    pub fn bind<'q, T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(
        &mut self,
        value: T,
    ) -> String {
        if let Err(e) = self.args.add(value) {
            self.fail(e.to_string());
        }
        self.count += 1;
        placeholder(self.count)
    }

    /// Adds the statement's guard, `name AS (body)`: a write (or a read) whose
    /// rows say whether the guarded parts are written, once per row. Its
    /// [`Guard`] is what the guarded parts select from, and what a host
    /// hands back to [`crate::Engine::start_with`]. One per statement, before
    /// the parts that select from it.
    pub fn guard(&mut self, name: &'static str, body: impl AsRef<str>) -> Guard {
        let guard = Guard(name);
        match self.guard {
            Some(first) => self.fail(format!("a second guard {name} after {first}: a statement has one")),
            None => self.guard = Some(guard),
        }
        self.with(name, body);
        guard
    }

    /// The statement's guard, once declared.
    pub fn guard_of(&self) -> Option<Guard> {
        self.guard
    }

    /// Adds `name AS (<write>)`, a write that happens exactly when the
    /// transition is written: `build` gets the statement's [`Guard`] and
    /// returns the [`Write`] made from it. `name` must be unique in the
    /// statement; the engine's own parts are named `saga_*`.
    pub fn guarded<'w>(&mut self, name: &str, build: impl FnOnce(Guard) -> Write<'w>) {
        let Some(guard) = self.guard else {
            return self.fail(format!("the guarded part {name} comes before the statement's guard"));
        };
        let write = build(guard);
        #[cfg(debug_assertions)]
        write.targets_into(&mut self.targets, name, guard.0);
        // Rendered in place, like every other part.
        self.next_part();
        self.sql.push_str(name);
        self.sql.push_str(" AS (");
        write.render_into(&mut self.sql, guard.0);
        self.sql.push(')');
    }

    /// Adds `name AS (body)` without the guard: a part that is written
    /// whatever the guard returns, e.g. a read that the guarded parts select
    /// from, or a write that selects from a guarded part's `RETURNING`.
    pub fn unguarded(&mut self, name: &str, body: impl AsRef<str>) {
        self.with(name, body)
    }

    /// Adds `name AS (body)`.
    fn with(&mut self, name: &str, body: impl AsRef<str>) {
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

    /// Keeps the first error, which [`Statement::finish`] returns.
    fn fail(&mut self, error: String) {
        self.error.get_or_insert(error);
    }

    /// Adds the outbox row of `event`, inserted once per row of the guard.
    pub fn event(&mut self, event: PendingEvent) {
        let Some(guard) = self.guard else {
            return self.fail("an event comes before the statement's guard".into());
        };
        self.events += 1;
        let name = format!("event_{}", self.events);
        let cte = PendingEvent::cte(&name, self.count + 1, Some(guard.0));
        self.next_part();
        self.sql.push_str(&cte);
        let before = self.args.len();
        if let Err(e) = event.add_to(&mut self.args) {
            self.fail(e.to_string());
        }
        self.count += self.args.len() - before;
    }

    /// `WITH <parts> <select>` and its values.
    pub fn finish(self, select: &str) -> Result<(String, PgArguments), sqlx::Error> {
        if let Some(e) = self.error {
            return Err(sqlx::Error::Encode(e.into()));
        }
        let mut sql = self.sql;
        #[cfg(debug_assertions)]
        if !self.targets.is_empty() {
            return Ok((one_write_per_row(sql, &self.targets, select), self.args));
        }
        if !sql.is_empty() {
            sql.push('\n');
        }
        sql.push_str(select);
        Ok((sql, self.args))
    }
}

/// Debug builds: `sql` with the rows its guarded updates and deletes target
/// (`targets`), and `select` run only when no row is targeted twice; else the
/// statement fails (the cast of the message to a boolean) and writes nothing.
#[cfg(debug_assertions)]
fn one_write_per_row(mut sql: String, targets: &str, select: &str) -> String {
    sql.push_str(",\nsaga_targets AS (");
    sql.push_str(targets);
    sql.push_str(")\nSELECT saga_result.* FROM (");
    sql.push_str(select);
    sql.push_str(
        ") AS saga_result
WHERE (SELECT CAST(COALESCE('two writes of one row in one statement: ' || string_agg(parts, '; '), 'true') AS boolean)
       FROM (SELECT string_agg(part, ', ' ORDER BY part) AS parts FROM saga_targets GROUP BY tab, row_id HAVING count(*) > 1)
            AS saga_twice)",
    );
    sql
}

/// The statement's guard, returned by [`Statement::guard`] and handed to the
/// closure of [`Statement::guarded`]: the only way to start a [`Write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guard(&'static str);

impl Guard {
    /// `UPDATE <table> SET <set> FROM <guard>[, <from>] [WHERE <filter>]`.
    pub fn update<'w>(self, table: &'w str) -> Write<'w> {
        Write::new(Kind::Update, table)
    }

    /// `INSERT INTO <table> SELECT <select> FROM <guard>[, <from>] [WHERE <filter>] [<on_conflict>]`;
    /// `table` may list the columns: `"items (id, name)"`.
    pub fn insert<'w>(self, table: &'w str) -> Write<'w> {
        Write::new(Kind::Insert, table)
    }

    /// `DELETE FROM <table> USING <guard>[, <from>] [WHERE <filter>]`.
    pub fn delete<'w>(self, table: &'w str) -> Write<'w> {
        Write::new(Kind::Delete, table)
    }
}

impl std::fmt::Display for Guard {
    /// The guard's CTE name, e.g. for a subquery in a filter.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Update,
    Insert,
    Delete,
}

/// A guarded write under construction (see [`Guard`]): the guard is always
/// the first item of its `FROM` (or `USING`), so the write affects nothing
/// when the guard returns no row.
#[derive(Debug, Clone)]
#[must_use = "a write does nothing until returned to Statement::guarded"]
pub struct Write<'w> {
    kind: Kind,
    table: &'w str,
    /// `SET` of an update, the select list of an insert.
    values: Cow<'w, str>,
    from: Vec<Cow<'w, str>>,
    filter: Option<Cow<'w, str>>,
    tail: Option<Cow<'w, str>>,
}

impl<'w> Write<'w> {
    fn new(kind: Kind, table: &'w str) -> Self {
        Self { kind, table, values: Cow::Borrowed(""), from: Vec::new(), filter: None, tail: None }
    }

    /// An update's assignments: `"status = $1, updated_at = now()"`.
    pub fn set(mut self, assignments: impl Into<Cow<'w, str>>) -> Self {
        self.values = assignments.into();
        self
    }

    /// An insert's select list: `"$1, $2, now()"` (one row per row of the guard
    /// and of [`Write::from`]).
    pub fn select(mut self, values: impl Into<Cow<'w, str>>) -> Self {
        self.values = values.into();
        self
    }

    /// A further `FROM` item after the guard, e.g. `"UNNEST($1::uuid[]) AS p (id)"`.
    pub fn from(mut self, item: impl Into<Cow<'w, str>>) -> Self {
        self.from.push(item.into());
        self
    }

    /// The `WHERE` condition.
    pub fn filter(mut self, condition: impl Into<Cow<'w, str>>) -> Self {
        self.filter = Some(condition.into());
        self
    }

    /// What follows an insert's select: `"ON CONFLICT (..) DO NOTHING"`, `"RETURNING id"`.
    pub fn then(mut self, tail: impl Into<Cow<'w, str>>) -> Self {
        self.tail = Some(tail.into());
        self
    }

    /// Debug builds: `SELECT '<part>', tableoid, ctid` of the rows an update
    /// or a delete targets (the same join as the write, on the same
    /// snapshot), appended to `targets` with `UNION ALL`. An insert adds
    /// nothing: PostgreSQL refuses an insert that meets a row another part
    /// inserted or upserted itself.
    #[cfg(debug_assertions)]
    fn targets_into(&self, targets: &mut String, part: &str, guard: &str) {
        if self.kind == Kind::Insert {
            return;
        }
        // `orders`, `orders o` or `orders AS o`: the row's columns are qualified by the last word.
        let table = self.table.split_whitespace().last().unwrap_or(self.table);
        if !targets.is_empty() {
            targets.push_str("\nUNION ALL ");
        }
        targets.push_str("SELECT '");
        targets.push_str(&part.replace('\'', "''"));
        targets.push_str("'::text AS part, ");
        for column in ["tableoid AS tab, ", "ctid AS row_id FROM "] {
            targets.push_str(table);
            targets.push('.');
            targets.push_str(column);
        }
        targets.push_str(self.table);
        targets.push_str(", ");
        targets.push_str(guard);
        for item in &self.from {
            targets.push_str(", ");
            targets.push_str(item);
        }
        if let Some(filter) = &self.filter {
            targets.push_str(" WHERE ");
            targets.push_str(filter);
        }
    }

    fn render_into(&self, sql: &mut String, guard: &str) {
        let from_word = match self.kind {
            Kind::Update => {
                sql.push_str("UPDATE ");
                sql.push_str(self.table);
                sql.push_str(" SET ");
                sql.push_str(&self.values);
                " FROM "
            }
            Kind::Insert => {
                sql.push_str("INSERT INTO ");
                sql.push_str(self.table);
                sql.push_str(" SELECT ");
                sql.push_str(&self.values);
                " FROM "
            }
            Kind::Delete => {
                sql.push_str("DELETE FROM ");
                sql.push_str(self.table);
                " USING "
            }
        };
        sql.push_str(from_word);
        sql.push_str(guard);
        for item in &self.from {
            sql.push_str(", ");
            sql.push_str(item);
        }
        if let Some(filter) = &self.filter {
            sql.push_str(" WHERE ");
            sql.push_str(filter);
        }
        if let Some(tail) = &self.tail {
            sql.push(' ');
            sql.push_str(tail);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts of `w`'s SQL, without the select and (debug builds) the check after them.
    fn parts(w: Statement) -> String {
        let (sql, _) = w.finish("SELECT 1").unwrap();
        let end = [",\nsaga_targets AS (", "\nSELECT 1"].iter().filter_map(|m| sql.find(m)).min().unwrap();
        sql[..end].to_string()
    }

    #[test]
    fn placeholders_follow_the_binding_order() {
        let mut w = Statement::new();
        let a = w.bind(1_i64);
        let b = w.bind("x");
        let s = w.guard("s", "SELECT 1");
        assert_eq!(w.guard_of(), Some(s));
        w.guarded("one", |g| g.update("t").set(format!("a = {a}")).filter(format!("b = {b}")));
        assert_eq!(parts(w), "WITH s AS (SELECT 1),\none AS (UPDATE t SET a = $1 FROM s WHERE b = $2)");
    }

    #[test]
    fn an_event_takes_the_next_ten_placeholders_and_values_and_later_binds_follow_them() {
        use sagaworks_outbox::{NewEvent, OutboxWriter};
        let mut w = Statement::new();
        let a = w.bind(1_i64);
        w.guard("s", format!("SELECT {a}"));
        let event = NewEvent::new("order", "o-1", "OrderConfirmed", serde_json::json!({"n": 1})).unwrap();
        w.event(OutboxWriter::new("test").stage(event).unwrap());
        assert_eq!(w.bind("after"), "$12", "the event's values are $2..$11");
        let (sql, args) = w.finish("SELECT 1").unwrap();
        assert!(
            sql.contains("SELECT $2, $3, $4, $5, $6, $7, $8, 'application/json', $9, $10, $11 FROM s"),
            "{sql}"
        );
        assert_eq!(args.len(), 12, "one value per placeholder");
    }

    #[test]
    fn every_guarded_write_selects_from_the_guard() {
        let mut w = Statement::new();
        let id = w.bind(1_i64);
        let _ = w.guard("g", "SELECT 1");
        w.guarded("u", |g| g.update("t").set("a = 1").filter(format!("t.id = {id}")));
        w.guarded("i", |g| {
            g.insert("t (id, a)")
                .select("p.id, 2")
                .from("UNNEST($9::int[]) AS p (id)")
                .then("ON CONFLICT DO NOTHING")
        });
        w.guarded("d", |g| g.delete("t").filter(format!("t.a = (SELECT 1 FROM {g})")));
        assert_eq!(
            parts(w),
            "WITH g AS (SELECT 1),\n\
             u AS (UPDATE t SET a = 1 FROM g WHERE t.id = $1),\n\
             i AS (INSERT INTO t (id, a) SELECT p.id, 2 FROM g, UNNEST($9::int[]) AS p (id) ON CONFLICT DO NOTHING),\n\
             d AS (DELETE FROM t USING g WHERE t.a = (SELECT 1 FROM g))"
        );
    }

    #[test]
    #[cfg(debug_assertions)]
    fn debug_builds_list_the_rows_updates_and_deletes_target() {
        let mut w = Statement::new();
        let _ = w.guard("g", "SELECT 1");
        w.guarded("u", |g| g.update("t x").set("a = 1").from("s").filter("x.id = s.id"));
        w.guarded("i", |g| g.insert("t (id)").select("2"));
        w.guarded("d", |g| g.delete("t"));
        let (sql, _) = w.finish("SELECT 1 FROM g").unwrap();
        let (_, check) = sql.split_once(",\nsaga_targets AS (").unwrap();
        assert!(
            check.starts_with(
                "SELECT 'u'::text AS part, x.tableoid AS tab, x.ctid AS row_id FROM t x, g, s WHERE x.id = s.id\n\
                 UNION ALL SELECT 'd'::text AS part, t.tableoid AS tab, t.ctid AS row_id FROM t, g)\n\
                 SELECT saga_result.* FROM (SELECT 1 FROM g) AS saga_result\nWHERE "
            ),
            "{check}"
        );
    }

    #[test]
    fn a_statement_has_one_guard_before_its_guarded_parts() {
        let mut w = Statement::new();
        w.guarded("early", |g| g.delete("t"));
        let _ = w.guard("g", "SELECT 1");
        let e = w.finish("SELECT 1").unwrap_err().to_string();
        assert!(e.contains("the guarded part early comes before the statement's guard"), "{e}");

        let mut w = Statement::new();
        let _ = w.guard("g", "SELECT 1");
        let _ = w.guard("h", "SELECT 2");
        let e = w.finish("SELECT 1").unwrap_err().to_string();
        assert!(e.contains("a second guard h after g"), "{e}");
    }

    #[test]
    fn placeholders_are_dollar_and_the_number() {
        for n in [1, 9, 10, 99, 100, 12_345, usize::MAX] {
            assert_eq!(placeholder(n), format!("${n}"));
        }
    }

    #[test]
    fn parts_are_joined_in_order_and_an_empty_statement_is_its_select() {
        let mut w = Statement::new();
        w.with("a", "SELECT 1");
        w.with("b", String::from("SELECT 2 FROM a"));
        assert_eq!(
            w.finish("SELECT * FROM b").unwrap().0,
            "WITH a AS (SELECT 1),\nb AS (SELECT 2 FROM a)\nSELECT * FROM b"
        );
        assert_eq!(Statement::new().finish("SELECT 3").unwrap().0, "SELECT 3");
    }
}
