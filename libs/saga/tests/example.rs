//! A four-step saga hosted by a test "shop": reserve (compensated by
//! release), charge (the pivot, compensated by refund), ship (after the
//! pivot, retried until it succeeds) and confirm (local). The participants
//! are small but real: each keeps its effects in tables of the test's own
//! PostgreSQL database, deduplicates on the step's idempotency key, and
//! leaves a tombstone when a compensation arrives before its forward call.
//!
//! The whole generated fault matrix runs against it ([`testing::trials`]):
//! one case per step and fault, each on a fresh database, each checked for
//! the saga's end, the purchase's status, its one outbox event, and the
//! participants' effects (nothing held, charged or shipped twice; nothing
//! left reserved or charged by a compensated purchase). The `ship` step is
//! one `Action` and one line of the definition, and its cases come with it:
//! a step added to a saga brings its own cases.

use sagaworks_outbox::{NewEvent, OutboxWriter};
use sagaworks_saga::admin::{self, ActionError, ListFilter, StatusFilter};
use sagaworks_saga::definition::StepOptions;
use sagaworks_saga::inspect::DriveError;
use sagaworks_saga::testing::{self, Case};
use sagaworks_saga::{
    Action, Compensation, Definition, End, Engine, Operator, OperatorAction, OperatorRecord, Saga,
    SagaSettings, SagaStatus, StartError, Started, Statement, StepContext, StepError, Versions,
};
use sagaworks_test_support::TestDatabase;
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, PgPool};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const PRICE: i64 = 250;
const STOCK: i64 = 10;
const CREDIT: i64 = 10_000;

/// The saga: a purchase of `quantity` units.
struct Purchase {
    outbox: OutboxWriter,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PurchaseInput {
    purchase_id: Uuid,
    quantity: i64,
}

impl Saga for Purchase {
    const NAME: &'static str = "purchase";
    type Input = PurchaseInput;

    fn on_end(&self, ctx: &StepContext<'_, Self>, end: &End<'_>, w: &mut Statement) -> Result<(), StepError> {
        let (status, event) = match end {
            End::Completed => ("CONFIRMED", "PurchaseConfirmed"),
            End::Compensated { .. } => ("CANCELLED", "PurchaseCancelled"),
        };
        let id = ctx.input().purchase_id;
        let (pid, pstatus) = (w.bind(id), w.bind(status));
        w.guarded("purchase_end", |g| {
            g.update("purchases").set(format!("status = {pstatus}")).filter(format!("purchases.id = {pid}"))
        });
        let event = NewEvent::new("purchase", id, event, serde_json::json!({ "purchase_id": id }))
            .and_then(|e| self.outbox.stage(e))
            .map_err(|e| StepError::Failed(e.to_string()))?;
        w.event(event);
        Ok(())
    }

    /// The purchase's log gets a line per operator action.
    fn on_operator_action(
        &self,
        ctx: &StepContext<'_, Self>,
        action: &OperatorRecord<'_>,
        w: &mut Statement,
    ) -> Result<(), StepError> {
        let line =
            format!("{} {} by {}: {}", action.action.as_str(), action.step, action.actor, action.reason);
        let (id, line) = (w.bind(ctx.input().purchase_id), w.bind(line));
        w.guarded("purchase_log", |g| {
            g.insert("purchase_log (purchase_id, line)").select(format!("{id}, {line}"))
        });
        Ok(())
    }
}

/// Participants' effects live in these tables; each key is applied once.
const SCHEMA: &str = "
    CREATE TABLE purchases (id UUID PRIMARY KEY, status TEXT NOT NULL, total_cents BIGINT NOT NULL DEFAULT 0);
    CREATE TABLE stock (id INT PRIMARY KEY, available BIGINT NOT NULL CHECK (available >= 0), reserved BIGINT NOT NULL);
    CREATE TABLE holds (purchase_id UUID PRIMARY KEY, quantity BIGINT NOT NULL, released BOOLEAN NOT NULL);
    CREATE TABLE wallet (id INT PRIMARY KEY, balance BIGINT NOT NULL CHECK (balance >= 0));
    CREATE TABLE charges (purchase_id UUID PRIMARY KEY, amount BIGINT NOT NULL, refunded BOOLEAN NOT NULL);
    CREATE TABLE shipments (purchase_id UUID PRIMARY KEY);
    CREATE TABLE purchase_log (purchase_id UUID NOT NULL, line TEXT NOT NULL);
    CREATE TABLE calls (seq BIGSERIAL PRIMARY KEY, step TEXT NOT NULL, purchase_id UUID NOT NULL);
";

async fn call(pool: &PgPool, step: &str, id: Uuid) -> Result<(), StepError> {
    sqlx::query("INSERT INTO calls (step, purchase_id) VALUES ($1, $2)")
        .bind(step)
        .bind(id)
        .execute(pool)
        .await
        .map(|_| ())
        .map_err(db)
}

fn db(e: sqlx::Error) -> StepError {
    StepError::Failed(e.to_string())
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct Reserved {
    total_cents: i64,
}

struct Reserve(PgPool);

impl Action<Purchase> for Reserve {
    const NAME: &'static str = "reserve";
    type Output = Reserved;

    async fn run(&self, ctx: &StepContext<'_, Purchase>) -> Result<Reserved, StepError> {
        let PurchaseInput { purchase_id: id, quantity } = *ctx.input();
        call(&self.0, Self::NAME, id).await?;
        let mut tx = self.0.begin().await.map_err(db)?;
        let inserted = sqlx::query(
            "INSERT INTO holds (purchase_id, quantity, released) VALUES ($1, $2, false) ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(quantity)
        .execute(&mut *tx)
        .await
        .map_err(db)?
        .rows_affected();
        if inserted == 1 {
            let moved = sqlx::query(
                "UPDATE stock SET available = available - $1, reserved = reserved + $1 WHERE id = 1 AND available >= $1",
            )
            .bind(quantity)
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
            if moved == 0 {
                return Err(StepError::Rejected("insufficient stock".into()));
            }
        } else {
            let released: bool = sqlx::query_scalar("SELECT released FROM holds WHERE purchase_id = $1")
                .bind(id)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
            if released {
                return Err(StepError::Rejected("released before it was reserved".into()));
            }
        }
        tx.commit().await.map_err(db)?;
        Ok(Reserved { total_cents: quantity * PRICE })
    }

    fn record(
        &self,
        ctx: &StepContext<'_, Purchase>,
        output: &Reserved,
        w: &mut Statement,
    ) -> Result<(), StepError> {
        let (id, total) = (w.bind(ctx.input().purchase_id), w.bind(output.total_cents));
        w.guarded("purchase_total", |g| {
            g.update("purchases").set(format!("total_cents = {total}")).filter(format!("purchases.id = {id}"))
        });
        Ok(())
    }
}

struct Release(PgPool);

impl Compensation<Purchase> for Release {
    const NAME: &'static str = "release";

    async fn run(&self, ctx: &StepContext<'_, Purchase>) -> Result<(), StepError> {
        let id = ctx.input().purchase_id;
        call(&self.0, Self::NAME, id).await?;
        let mut tx = self.0.begin().await.map_err(db)?;
        let held: Option<(i64, bool)> =
            sqlx::query_as("SELECT quantity, released FROM holds WHERE purchase_id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
        match held {
            // A tombstone: nothing was reserved, and a late reserve is refused.
            None => {
                sqlx::query("INSERT INTO holds (purchase_id, quantity, released) VALUES ($1, 0, true)")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            Some((quantity, false)) => {
                sqlx::query("UPDATE holds SET released = true WHERE purchase_id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                sqlx::query(
                    "UPDATE stock SET available = available + $1, reserved = reserved - $1 WHERE id = 1",
                )
                .bind(quantity)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            }
            Some((_, true)) => {}
        }
        tx.commit().await.map_err(db)
    }
}

struct Charge(PgPool);

impl Action<Purchase> for Charge {
    const NAME: &'static str = "charge";
    type Output = ();

    async fn run(&self, ctx: &StepContext<'_, Purchase>) -> Result<(), StepError> {
        let id = ctx.input().purchase_id;
        // Typed data from the step before, also after a crash on another replica.
        let amount = ctx.output::<Reserve>()?.total_cents;
        call(&self.0, Self::NAME, id).await?;
        let mut tx = self.0.begin().await.map_err(db)?;
        let inserted = sqlx::query(
            "INSERT INTO charges (purchase_id, amount, refunded) VALUES ($1, $2, false) ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(amount)
        .execute(&mut *tx)
        .await
        .map_err(db)?
        .rows_affected();
        if inserted == 1 {
            sqlx::query("UPDATE wallet SET balance = balance - $1 WHERE id = 1")
                .bind(amount)
                .execute(&mut *tx)
                .await
                .map_err(|_| StepError::Rejected("insufficient funds".into()))?;
        } else {
            let refunded: bool = sqlx::query_scalar("SELECT refunded FROM charges WHERE purchase_id = $1")
                .bind(id)
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
            if refunded {
                return Err(StepError::Rejected("refunded before it was charged".into()));
            }
        }
        tx.commit().await.map_err(db)
    }
}

struct Refund(PgPool);

impl Compensation<Purchase> for Refund {
    const NAME: &'static str = "refund";

    async fn run(&self, ctx: &StepContext<'_, Purchase>) -> Result<(), StepError> {
        let id = ctx.input().purchase_id;
        call(&self.0, Self::NAME, id).await?;
        let mut tx = self.0.begin().await.map_err(db)?;
        let charged: Option<(i64, bool)> =
            sqlx::query_as("SELECT amount, refunded FROM charges WHERE purchase_id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
        match charged {
            // A tombstone: nothing was charged, and a late charge is refused.
            None => {
                sqlx::query("INSERT INTO charges (purchase_id, amount, refunded) VALUES ($1, 0, true)")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            Some((amount, false)) => {
                sqlx::query("UPDATE charges SET refunded = true WHERE purchase_id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                sqlx::query("UPDATE wallet SET balance = balance + $1 WHERE id = 1")
                    .bind(amount)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            Some((_, true)) => {}
        }
        tx.commit().await.map_err(db)
    }
}

/// The step added to the original three: after the pivot, so it has no
/// compensation and is retried until it succeeds.
struct Ship(PgPool);

impl Action<Purchase> for Ship {
    const NAME: &'static str = "ship";
    type Output = ();

    async fn run(&self, ctx: &StepContext<'_, Purchase>) -> Result<(), StepError> {
        let id = ctx.input().purchase_id;
        call(&self.0, Self::NAME, id).await?;
        sqlx::query("INSERT INTO shipments (purchase_id) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(id)
            .execute(&self.0)
            .await
            .map(|_| ())
            .map_err(db)
    }
}

/// Local: its effect is the saga's end (`Purchase::on_end`).
struct Confirm;

impl Action<Purchase> for Confirm {
    const NAME: &'static str = "confirm";
    type Output = ();
    const LOCAL: bool = true;

    async fn run(&self, _: &StepContext<'_, Purchase>) -> Result<(), StepError> {
        Ok(())
    }
}

/// Version 2's new step, after `ship`: tells the customer.
struct Notify(PgPool);

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct Notified {
    channel: String,
}

impl Action<Purchase> for Notify {
    const NAME: &'static str = "notify";
    type Output = Notified;

    async fn run(&self, ctx: &StepContext<'_, Purchase>) -> Result<Notified, StepError> {
        call(&self.0, Self::NAME, ctx.input().purchase_id).await?;
        Ok(Notified { channel: "email".into() })
    }
}

/// Version 2 of the purchase: `notify` between `ship` and `confirm`. `version`: what it
/// claims to be (a test declares this shape as version 1 to see it refused).
fn definition_v2(pool: &PgPool, version: u32) -> Definition<Purchase> {
    Definition::builder(Purchase { outbox: OutboxWriter::new("shop") })
        .version(version)
        .compensatable(Reserve(pool.clone()), Release(pool.clone()))
        .pivot_compensatable(Charge(pool.clone()), Refund(pool.clone()))
        .options(StepOptions::default().max_attempts(3))
        .retriable(Ship(pool.clone()))
        .retriable(Notify(pool.clone()))
        .retriable(Confirm)
        .build()
        .expect("a valid definition")
}

fn definition(pool: &PgPool) -> Definition<Purchase> {
    Definition::builder(Purchase { outbox: OutboxWriter::new("shop") })
        .compensatable(Reserve(pool.clone()), Release(pool.clone()))
        .pivot_compensatable(Charge(pool.clone()), Refund(pool.clone()))
        // A charge that may have happened is tried three times before it is refunded.
        .options(StepOptions::default().max_attempts(3))
        .retriable(Ship(pool.clone()))
        .retriable(Confirm)
        .build()
        .expect("a valid definition")
}

fn settings() -> SagaSettings {
    SagaSettings {
        lease_ms: 300,
        poll_interval_ms: 20,
        retry_base_ms: 5,
        retry_max_ms: 40,
        ..Default::default()
    }
}

/// A fresh shop database with the saga's and the outbox's tables.
async fn shop() -> (TestDatabase, PgPool) {
    let database = TestDatabase::create("saga_example").await;
    let pool = database.pool().await;
    let mut migrators = [sagaworks_saga::migrator(), sagaworks_outbox::migrator()];
    sagaworks_runtime::db::migrate(&pool, &mut migrators).await.expect("migrations");
    sqlx::raw_sql(SCHEMA).execute(&pool).await.expect("schema");
    sqlx::query("INSERT INTO stock VALUES (1, $1, 0)").bind(STOCK).execute(&pool).await.unwrap();
    sqlx::query("INSERT INTO wallet VALUES (1, $1)").bind(CREDIT).execute(&pool).await.unwrap();
    (database, pool)
}

/// A purchase of `quantity` and its saga, started in one statement (the
/// purchase's insert is the guard of the instance's rows), leased to this
/// replica and holding one of its permits when it has one free.
async fn start_purchase(
    engine: &Engine<Purchase>,
    pool: &PgPool,
    quantity: i64,
) -> (Uuid, Started<Purchase>) {
    let purchase_id = Uuid::now_v7();
    let mut conn = pool.acquire().await.expect("a connection");
    let input = PurchaseInput { purchase_id, quantity };
    let started = engine
        .start_with(&mut conn, purchase_id.to_string(), input, |_, w| {
            let id = w.bind(purchase_id);
            Ok::<_, StartError>(w.guard(
                "purchase",
                format!("INSERT INTO purchases (id, status) VALUES ({id}, 'PENDING') RETURNING id"),
            ))
        })
        .await
        .expect("purchase placed")
        .expect("a new purchase");
    (purchase_id, started)
}

/// Places a purchase and drives its saga (or hands it to the worker).
async fn place(engine: &Engine<Purchase>, pool: &PgPool, quantity: i64, stop: &CancellationToken) -> Uuid {
    let (purchase_id, started) = start_purchase(engine, pool, quantity).await;
    started.run(Duration::from_secs(5), stop).await;
    purchase_id
}

/// A case of version 1's matrix, on a binary with only version 1.
async fn run_case(case: Case) -> Result<(), String> {
    run_case_on(case, |pool| definition(pool).into()).await
}

/// A case of version 2's matrix, on a binary that still drives version 1.
async fn run_case_v2(case: Case) -> Result<(), String> {
    run_case_on(case, |pool| Versions::new(definition_v2(pool, 2)).and(definition(pool))).await
}

async fn run_case_on(case: Case, versions: fn(&PgPool) -> Versions<Purchase>) -> Result<(), String> {
    let (_database, pool) = shop().await;
    let stop = CancellationToken::new();
    let mut faulty = settings();
    case.apply(&mut faulty);
    let first = Engine::new(pool.clone(), versions(&pool), faulty).map_err(|e| e.to_string())?;
    first.register().await.map_err(|e| e.to_string())?;
    tokio::spawn(first.clone().run_worker(stop.clone()));
    let quantity = 2;
    let purchase = place(&first, &pool, quantity, &stop).await;
    if case.crashes() {
        sagaworks_test_support::eventually(
            "the first replica to stop dead",
            Duration::from_secs(30),
            || async { first.has_crashed().then_some(()) },
        )
        .await;
        let mut resumed = settings();
        case.apply_resumed(&mut resumed);
        let second = Engine::new(pool.clone(), versions(&pool), resumed).map_err(|e| e.to_string())?;
        tokio::spawn(second.run_worker(stop.clone()));
    }
    let status: String =
        sagaworks_test_support::eventually("the saga to finish", Duration::from_secs(30), || async {
            sqlx::query_scalar::<_, String>(
                "SELECT status FROM saga_instances WHERE key = $1 AND status IN ('COMPLETED', 'COMPENSATED')",
            )
            .bind(purchase.to_string())
            .fetch_optional(&pool)
            .await
            .unwrap()
        })
        .await;
    stop.cancel();

    let expect = &case.expect;
    assert_eq!(SagaStatus::parse(&status), Some(expect.status), "saga status");
    let version: i32 = sqlx::query_scalar("SELECT version FROM saga_instances WHERE key = $1")
        .bind(purchase.to_string())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version as u32, first.definition().version(), "it ran on the newest version");
    let (purchase_status, total): (String, i64) =
        sqlx::query_as("SELECT status, total_cents FROM purchases WHERE id = $1")
            .bind(purchase)
            .fetch_one(&pool)
            .await
            .unwrap();
    let completed = expect.status == SagaStatus::Completed;
    assert_eq!(purchase_status, if completed { "CONFIRMED" } else { "CANCELLED" });
    let events: Vec<String> = sqlx::query_scalar("SELECT event_type FROM outbox WHERE aggregate_id = $1")
        .bind(purchase.to_string())
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(events, [if completed { "PurchaseConfirmed" } else { "PurchaseCancelled" }], "one end event");

    // Invariants at rest: every effect once, none left behind by a compensated purchase.
    let (available, reserved): (i64, i64) =
        sqlx::query_as("SELECT available, reserved FROM stock").fetch_one(&pool).await.unwrap();
    let balance: i64 = sqlx::query_scalar("SELECT balance FROM wallet").fetch_one(&pool).await.unwrap();
    let shipped: i64 = sqlx::query_scalar("SELECT count(*) FROM shipments").fetch_one(&pool).await.unwrap();
    let live_holds: i64 =
        sqlx::query_scalar("SELECT count(*) FROM holds WHERE NOT released").fetch_one(&pool).await.unwrap();
    if completed {
        assert_eq!(total, quantity * PRICE, "the reservation's total was recorded with its result");
        assert_eq!((available, reserved, live_holds), (STOCK - quantity, quantity, 1), "reserved once");
        assert_eq!(balance, CREDIT - quantity * PRICE, "charged once");
        assert_eq!(shipped, 1, "shipped once");
    } else {
        assert_eq!((available, reserved, live_holds), (STOCK, 0, 0), "nothing stays reserved");
        assert_eq!(balance, CREDIT, "nothing stays charged");
        assert_eq!(shipped, 0, "nothing shipped");
    }
    // The compensations that ran, in order (each at least once).
    let mut ran: Vec<String> =
        sqlx::query_scalar("SELECT step FROM calls WHERE step IN ('release', 'refund') ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    ran.dedup();
    assert_eq!(ran, expect.compensations, "compensations");
    // Steps as recorded: every forward step that took effect SUCCEEDED.
    let succeeded: Vec<String> = sqlx::query_scalar(
        "SELECT st.name FROM saga_instance_steps st JOIN saga_instances i ON i.id = st.saga_id
         WHERE i.key = $1 AND st.status = 'SUCCEEDED'",
    )
    .bind(purchase.to_string())
    .fetch_all(&pool)
    .await
    .unwrap();
    for step in &expect.effective {
        assert!(succeeded.iter().any(|s| s == step), "{step} recorded as succeeded: {succeeded:?}");
    }
    // And none is left running at rest: the failure that ended a step is recorded as final.
    let unfinished: Vec<(String, String)> = sqlx::query_as(
        "SELECT st.name, st.status FROM saga_instance_steps st JOIN saga_instances i ON i.id = st.saga_id
         WHERE i.key = $1 AND (st.status = 'RUNNING' OR st.finished_at IS NULL)",
    )
    .bind(purchase.to_string())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(unfinished.is_empty(), "steps left unfinished at rest: {unfinished:?}");
    Ok(())
}

/// A saga stuck at `step` under `faults`: the first replica drove it until
/// `step` failed once (its worker never polls, so nothing runs after that),
/// then stopped; the backoff is pushed an hour out, as a long one would be.
/// Returns the purchase, its saga id, and a second replica (no faults) whose
/// worker runs until `stop`. No other replica may run meanwhile: one without
/// the faults would take the saga past `step` as soon as the first lets it go.
async fn stuck_at(
    pool: &PgPool,
    faults: &str,
    step: &str,
    stop: &CancellationToken,
) -> (Uuid, Uuid, Engine<Purchase>, JoinHandle<()>) {
    let first_stop = CancellationToken::new();
    let mut faulty = settings();
    faulty.faults = faults.into();
    faulty.poll_interval_ms = 3_600_000;
    let first = Engine::new(pool.clone(), definition(pool), faulty).unwrap();
    let worker = tokio::spawn(first.clone().run_worker(first_stop.clone()));
    let purchase = place(&first, pool, 2, &first_stop).await;
    let saga: Uuid = sqlx::query_scalar("SELECT id FROM saga_instances WHERE key = $1")
        .bind(purchase.to_string())
        .fetch_one(pool)
        .await
        .unwrap();
    sagaworks_test_support::eventually("the step to fail", Duration::from_secs(30), || async {
        let failed: Option<i32> = sqlx::query_scalar(
            "SELECT attempts FROM saga_instance_steps WHERE saga_id = $1 AND name = $2 AND error IS NOT NULL",
        )
        .bind(saga)
        .bind(step)
        .fetch_optional(pool)
        .await
        .unwrap();
        failed.map(|_| ())
    })
    .await;
    first_stop.cancel();
    worker.await.unwrap();
    let pushed = sqlx::query(
        "UPDATE saga_instances SET next_attempt_at = now() + interval '1 hour', lease_owner = NULL,
                lease_expires_at = NULL
         WHERE id = $1 AND current_step = $2 AND status IN ('RUNNING', 'COMPENSATING')",
    )
    .bind(saga)
    .bind(step)
    .execute(pool)
    .await
    .unwrap();
    assert_eq!(pushed.rows_affected(), 1, "stuck at {step}");
    let second = Engine::new(pool.clone(), definition(pool), settings()).unwrap();
    let worker = tokio::spawn(second.clone().run_worker(stop.clone()));
    (purchase, saga, second, worker)
}

fn operator(key: &str) -> Operator {
    Operator { actor: "ops@example".into(), reason: "participant fixed".into(), idempotency_key: key.into() }
}

async fn finished(pool: &PgPool, saga: Uuid) -> String {
    sagaworks_test_support::eventually("the saga to finish", Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, String>(
            "SELECT status FROM saga_instances WHERE id = $1 AND status IN ('COMPLETED', 'COMPENSATED')",
        )
        .bind(saga)
        .fetch_optional(pool)
        .await
        .unwrap()
    })
    .await
}

/// Everything an action may change, to show that a refused one changed nothing.
async fn snapshot(pool: &PgPool, saga: Uuid) -> String {
    sqlx::query_scalar(
        "SELECT row_to_json(i)::text || (SELECT count(*) FROM saga_operator_actions)::text
                || (SELECT COALESCE(json_agg(st ORDER BY name), '[]')::text
                    FROM saga_instance_steps st WHERE saga_id = $1)
                || (SELECT count(*) FROM purchase_log)::text
         FROM saga_instances i WHERE id = $1",
    )
    .bind(saga)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn log(pool: &PgPool, purchase: Uuid) -> Vec<String> {
    sqlx::query_scalar("SELECT line FROM purchase_log WHERE purchase_id = $1")
        .bind(purchase)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// (wallet balance, available, reserved).
async fn money_and_stock(pool: &PgPool) -> (i64, i64, i64) {
    sqlx::query_as("SELECT (SELECT balance FROM wallet), available, reserved FROM stock")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The outcome of the last attempt of `step`, as the library reports it.
async fn last_outcome(pool: &PgPool, saga: Uuid, step: &str) -> Option<String> {
    let instance = sagaworks_saga::InstanceRecord::load(pool, saga).await.unwrap()?;
    let step = instance.steps.into_iter().find(|s| s.name == step)?;
    step.history.last().map(|a| a.outcome.clone())
}

/// A trial on a fresh shop database, on a runtime of its own.
fn db_trial<F, Fut>(name: &str, test: F) -> libtest_mimic::Trial
where
    F: FnOnce(PgPool, CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    libtest_mimic::Trial::test(name, move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        runtime.block_on(async {
            let (_database, pool) = shop().await;
            let stop = CancellationToken::new();
            test(pool, stop.clone()).await;
            stop.cancel();
        });
        runtime.shutdown_background();
        Ok(())
    })
}

/// Operators' actions on stuck instances (`sagaworks_saga::admin`).
fn operator_trials() -> Vec<libtest_mimic::Trial> {
    let resolve_null = || OperatorAction::Resolve { output: serde_json::Value::Null };
    vec![
        db_trial("the_worker_poll_reads_only_unfinished_instances", |pool, _| async move {
            // Many finished instances, a few leased elsewhere, a few runnable.
            sqlx::query(
                "INSERT INTO saga_instances (id, saga_type, key, status, current_step, data, lease_owner, lease_expires_at)
                 SELECT gen_random_uuid(), 'purchase', 'k' || n,
                        CASE WHEN n <= 5000 THEN 'COMPLETED' ELSE 'RUNNING' END,
                        CASE WHEN n <= 5000 THEN NULL ELSE 'reserve' END, '{}',
                        CASE WHEN n BETWEEN 5001 AND 5040 THEN 'elsewhere' END,
                        CASE WHEN n BETWEEN 5001 AND 5040 THEN now() + interval '1 hour' END
                 FROM generate_series(1, 5045) AS n",
            )
            .execute(&pool)
            .await
            .unwrap();
            // No ANALYZE: planned on the estimates a young table has, as
            // when the worker's connection first planned it.
            let mut tx = pool.begin().await.unwrap();
            // As a long-lived connection runs it: the generic plan.
            sqlx::query("SET LOCAL plan_cache_mode = force_generic_plan").execute(&mut *tx).await.unwrap();
            let plan: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
                "EXPLAIN (ANALYZE, FORMAT TEXT) {}",
                testing::LEASE_SQL
            )))
            .bind("me")
            .bind(30.0_f64)
            .bind(32_i64)
            .bind("purchase")
            .fetch_all(&mut *tx)
            .await
            .unwrap();
            tx.rollback().await.unwrap();
            let plan = plan.join("\n");
            assert!(plan.contains("saga_instances_runnable"), "{plan}");
            assert!(
                !plan.contains("saga_type_key"),
                "the poll must not read every instance of its type:\n{plan}"
            );
            assert!(plan.contains("rows=5 "), "the five runnable ones are leased:\n{plan}");
        }),
        db_trial("operator::a_stuck_saga_is_listed_retried_now_and_completes", |pool, stop| async move {
            let (purchase, saga, engine, _) = stuck_at(&pool, "fail:ship:1000", "ship", &stop).await;
            let stuck = ListFilter { status: Some(StatusFilter::Stuck), ..Default::default() };
            let page = admin::list(&pool, "purchase", Duration::ZERO, &stuck).await.unwrap();
            assert_eq!(page.sagas.len(), 1);
            let row = &page.sagas[0];
            assert_eq!((row.instance.id, row.instance.current_step.as_deref()), (saga, Some("ship")));
            assert_eq!(row.attempts, Some(1), "{row:?}");
            assert!(row.last_error.as_deref().is_some_and(|e| e.contains("fault injection")), "{row:?}");
            let page = admin::list(&pool, "purchase", Duration::from_secs(3600), &stuck).await.unwrap();
            assert!(page.sagas.is_empty(), "not stuck by an hour's threshold");

            let acted = engine.act(saga, OperatorAction::RetryNow, &operator("retry-1")).await.unwrap();
            assert_eq!((acted.step.as_str(), acted.replayed), ("ship", false));
            assert_eq!(finished(&pool, saga).await, "COMPLETED");
            let shipped: i64 =
                sqlx::query_scalar("SELECT count(*) FROM shipments").fetch_one(&pool).await.unwrap();
            assert_eq!(shipped, 1);
            // The same key again: nothing is done twice; under another action it is refused.
            let again = engine.act(saga, OperatorAction::RetryNow, &operator("retry-1")).await.unwrap();
            assert!(again.replayed);
            let other = engine.act(saga, OperatorAction::Compensate, &operator("retry-1")).await;
            assert!(matches!(&other, Err(ActionError::Conflict(m)) if m.contains("RETRY")), "{other:?}");
            let recorded = admin::actions(&pool, saga).await.unwrap();
            assert_eq!(recorded.len(), 1);
            assert_eq!((recorded[0].action.as_str(), recorded[0].actor.as_str()), ("RETRY", "ops@example"));
            assert_eq!(log(&pool, purchase).await, ["RETRY ship by ops@example: participant fixed"]);
        }),
        db_trial(
            "operator::compensate_aborts_a_running_saga_and_undoes_what_may_have_happened",
            move |pool, stop| async move {
                // The charge "fails" after charging (the first of 3 attempts allowed).
                let (purchase, saga, engine, _) = stuck_at(&pool, "fail:charge:1000", "charge", &stop).await;
                engine.act(saga, OperatorAction::Compensate, &operator("abort-1")).await.unwrap();
                assert_eq!(finished(&pool, saga).await, "COMPENSATED");
                assert_eq!(money_and_stock(&pool).await, (CREDIT, STOCK, 0), "refunded and released");
                let status: String = sqlx::query_scalar("SELECT status FROM purchases WHERE id = $1")
                    .bind(purchase)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!(status, "CANCELLED");
                let reason: String =
                    sqlx::query_scalar("SELECT failure_reason FROM saga_instances WHERE id = $1")
                        .bind(saga)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                assert_eq!(reason, "compensated by ops@example: participant fixed");
                assert_eq!(last_outcome(&pool, saga, "charge").await.as_deref(), Some("abandoned"));

                // Finished: every action is refused and changes nothing.
                let before = snapshot(&pool, saga).await;
                let actions = [OperatorAction::RetryNow, OperatorAction::Compensate, resolve_null()];
                for (i, action) in actions.into_iter().enumerate() {
                    let refused = engine.act(saga, action, &operator(&format!("late-{i}"))).await;
                    assert!(
                        matches!(&refused, Err(ActionError::Conflict(m)) if m.contains("has finished")),
                        "{refused:?}"
                    );
                }
                assert_eq!(snapshot(&pool, saga).await, before);
            },
        ),
        db_trial(
            "operator::compensate_is_refused_while_compensating_and_past_the_pivot",
            |pool, stop| async move {
                let first = stop.child_token();
                let (_, compensating, engine, worker) =
                    stuck_at(&pool, "late:charge,fail:refund:1000", "refund", &first).await;
                let before = snapshot(&pool, compensating).await;
                let refused = engine.act(compensating, OperatorAction::Compensate, &operator("c-1")).await;
                assert!(
                    matches!(&refused, Err(ActionError::Conflict(m)) if m.contains("compensating already")),
                    "{refused:?}"
                );
                assert_eq!(snapshot(&pool, compensating).await, before);
                first.cancel();
                worker.await.unwrap();

                let (_, shipping, engine, _) = stuck_at(&pool, "fail:ship:1000", "ship", &stop).await;
                let before = snapshot(&pool, shipping).await;
                let refused = engine.act(shipping, OperatorAction::Compensate, &operator("c-2")).await;
                assert!(
                    matches!(&refused, Err(ActionError::Conflict(m)) if m.contains("past its pivot")),
                    "{refused:?}"
                );
                assert_eq!(snapshot(&pool, shipping).await, before);
            },
        ),
        db_trial(
            "operator::resolve_states_a_steps_effect_and_the_saga_goes_on",
            move |pool, stop| async move {
                // Stuck refunding; the operator refunded out of band.
                let first = stop.child_token();
                let (purchase, saga, engine, worker) =
                    stuck_at(&pool, "late:charge,fail:refund:1000", "refund", &first).await;
                engine.act(saga, resolve_null(), &operator("r-1")).await.unwrap();
                assert_eq!(finished(&pool, saga).await, "COMPENSATED");
                assert_eq!(log(&pool, purchase).await, ["RESOLVE refund by ops@example: participant fixed"]);
                assert_eq!(last_outcome(&pool, saga, "refund").await.as_deref(), Some("resolved"));
                assert_eq!(last_outcome(&pool, saga, "release").await.as_deref(), Some("succeeded"));
                first.cancel();
                worker.await.unwrap();

                // A forward step resolved with an output of the wrong type is refused.
                let (_, shipping, engine, _) = stuck_at(&pool, "fail:ship:1000", "ship", &stop).await;
                let shipped = || async {
                    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM shipments")
                        .fetch_one(&pool)
                        .await
                        .unwrap()
                };
                let shipped_before = shipped().await;
                let before = snapshot(&pool, shipping).await;
                let wrong = OperatorAction::Resolve { output: serde_json::json!({ "tracking": 42 }) };
                let refused = engine.act(shipping, wrong, &operator("r-2")).await;
                assert!(
                    matches!(&refused, Err(ActionError::Invalid(m)) if m.contains("not an output of ship")),
                    "{refused:?}"
                );
                assert_eq!(snapshot(&pool, shipping).await, before);
                engine.act(shipping, resolve_null(), &operator("r-3")).await.unwrap();
                assert_eq!(finished(&pool, shipping).await, "COMPLETED");
                assert_eq!(
                    shipped().await,
                    shipped_before,
                    "shipped out of band: the step did not run again"
                );
            },
        ),
        db_trial(
            "operator::the_same_key_committed_concurrently_is_answered_as_a_replay",
            |pool, stop| async move {
                let (_, saga, engine, _) = stuck_at(&pool, "fail:ship:1000", "ship", &stop).await;
                // Another request with the same key commits between this one's replay check and its
                // own write: here, when this one takes the lease.
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "CREATE FUNCTION sneak_in() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
                     INSERT INTO saga_operator_actions (saga_id, action, step, actor, reason, idempotency_key)
                     VALUES ('{saga}', 'RETRY', 'ship', 'other@example', 'concurrent', 'same-key')
                     ON CONFLICT DO NOTHING;
                     RETURN NEW; END $$;
                 CREATE TRIGGER sneak_in BEFORE UPDATE OF lease_owner ON saga_instances
                     FOR EACH ROW WHEN (NEW.lease_owner IS NOT NULL) EXECUTE FUNCTION sneak_in();"
                )))
                .execute(&pool)
                .await
                .unwrap();
                let acted = engine.act(saga, OperatorAction::RetryNow, &operator("same-key")).await;
                assert!(matches!(&acted, Ok(a) if a.replayed && a.step == "ship"), "{acted:?}");
                let recorded = admin::actions(&pool, saga).await.unwrap();
                assert_eq!(recorded.len(), 1, "one action for one key");
                assert_eq!(recorded[0].actor, "other@example");
            },
        ),
        db_trial("operator::an_action_never_races_a_live_driver", |pool, stop| async move {
            let (_, saga, engine, _) = stuck_at(&pool, "fail:ship:1000", "ship", &stop).await;
            sqlx::query(
                "UPDATE saga_instances SET lease_owner = 'elsewhere', lease_expires_at = now() + interval '1 hour'
                 WHERE id = $1",
            )
            .bind(saga)
            .execute(&pool)
            .await
            .unwrap();
            let before = snapshot(&pool, saga).await;
            let refused = engine.act(saga, OperatorAction::RetryNow, &operator("busy-1")).await;
            assert!(matches!(refused, Err(ActionError::Busy { .. })), "{refused:?}");
            assert_eq!(snapshot(&pool, saga).await, before);
            let missing = engine.act(Uuid::now_v7(), OperatorAction::RetryNow, &operator("x")).await;
            assert!(matches!(missing, Err(ActionError::NotFound(_))), "{missing:?}");
            let blank = Operator { reason: " ".into(), ..operator("busy-2") };
            let refused = engine.act(saga, OperatorAction::RetryNow, &blank).await;
            assert!(matches!(refused, Err(ActionError::Invalid(_))), "{refused:?}");
        }),
    ]
}

/// Tests that are not matrix cells.
fn other_trials() -> Vec<libtest_mimic::Trial> {
    use libtest_mimic::Trial;
    vec![
        Trial::test("a_definition_with_a_bad_name_is_refused_when_built", || {
            struct Bad;
            impl Saga for Bad {
                const NAME: &'static str = "bad";
                type Input = ();
            }
            struct Step;
            impl Action<Bad> for Step {
                const NAME: &'static str = "Not A Name";
                type Output = ();
                async fn run(&self, _: &StepContext<'_, Bad>) -> Result<(), StepError> {
                    Ok(())
                }
            }
            let err = Definition::builder(Bad).pivot(Step).build().err().ok_or("built")?;
            let message = err.to_string();
            if !message.contains("\"Not A Name\" is not lower case") {
                return Err(format!("unclear error: {message}").into());
            }
            Ok(())
        }),
        Trial::test("each_step_name_has_its_role", || {
            let shape = shape();
            let roles: Vec<_> =
                shape.names().into_iter().map(|n| (n, shape.role(n).unwrap_or("?"))).collect();
            let want = [
                ("reserve", "compensatable"),
                ("charge", "pivot"),
                ("ship", "retriable"),
                ("confirm", "retriable"),
                ("refund", "compensation"),
                ("release", "compensation"),
            ];
            if roles != want || shape.role("nope").is_some() {
                return Err(format!("{roles:?}").into());
            }
            Ok(())
        }),
        db_trial("a_step_that_lost_its_lease_writes_nothing", |pool, stop| async move {
            // One permit, held by another purchase's saga that is never run: the
            // purchase's saga is created leased to this replica but not driven,
            // and is driven below by hand.
            let engine = Engine::new(
                pool.clone(),
                definition(&pool),
                SagaSettings { max_concurrent: 1, ..settings() },
            )
            .unwrap();
            let (_, busy) = start_purchase(&engine, &pool, 1).await;
            let (purchase, saga) = start_purchase(&engine, &pool, 2).await;
            let saga = saga.id();
            drop(busy);
            // The reservation will wait for the stock row this transaction holds: mid-step.
            let mut stock = pool.begin().await.unwrap();
            sqlx::query("SELECT available FROM stock WHERE id = 1 FOR UPDATE")
                .execute(&mut *stock)
                .await
                .unwrap();
            let driver = tokio::spawn({
                let (engine, stop) = (engine.clone(), stop.clone());
                async move { engine.drive(saga, &stop).await }
            });
            sagaworks_test_support::eventually(
                "the reservation to be running",
                Duration::from_secs(30),
                || async {
                    let calls: i64 = sqlx::query_scalar("SELECT count(*) FROM calls WHERE step = 'reserve'")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                    (calls == 1).then_some(())
                },
            )
            .await;
            // Meanwhile the lease goes to another replica (this one was paused past it).
            sqlx::query("UPDATE saga_instances SET lease_owner = 'other', lease_expires_at = now() + interval '1 hour' WHERE id = $1")
                .bind(saga)
                .execute(&pool)
                .await
                .unwrap();
            stock.rollback().await.unwrap();
            // The step's call returned, but its transition and the host's record of it are not written.
            match driver.await.unwrap() {
                Err(DriveError::LeaseLost(id)) if id == saga => {}
                other => panic!("the late driver must find its lease lost: {other:?}"),
            }
            let total: i64 = sqlx::query_scalar("SELECT total_cents FROM purchases WHERE id = $1")
                .bind(purchase)
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(total, 0, "the step's record (the purchase's total) was written without the lease");
            let step: (String, Option<serde_json::Value>) = sqlx::query_as(
                "SELECT status, output FROM saga_instance_steps WHERE saga_id = $1 AND name = 'reserve'",
            )
            .bind(saga)
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(
                step,
                ("RUNNING".to_string(), None),
                "the step's result was written without the lease"
            );
            let instance: (String, String) =
                sqlx::query_as("SELECT current_step, lease_owner FROM saga_instances WHERE id = $1")
                    .bind(saga)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(instance, ("reserve".to_string(), "other".to_string()));
        }),
        db_trial("a_stopping_worker_hands_its_instance_to_another_at_once", |pool, stop| async move {
            // Leases far longer than the test: only a hand-back lets another replica in.
            let long_lease = || SagaSettings { lease_ms: 600_000, max_concurrent: 1, ..settings() };
            let first_stop = CancellationToken::new();
            let first = Engine::new(pool.clone(), definition(&pool), long_lease()).unwrap();
            let worker = tokio::spawn(first.clone().run_worker(first_stop.clone()));
            // The charge will wait for the wallet row this transaction holds: mid-step.
            let mut wallet = pool.begin().await.unwrap();
            sqlx::query("SELECT balance FROM wallet WHERE id = 1 FOR UPDATE")
                .execute(&mut *wallet)
                .await
                .unwrap();
            // With the replica's one permit taken, the new instance goes to its worker.
            let (_, busy) = start_purchase(&first, &pool, 1).await;
            let purchase = place(&first, &pool, 2, &first_stop).await;
            drop(busy);
            let saga: Uuid = sqlx::query_scalar("SELECT id FROM saga_instances WHERE key = $1")
                .bind(purchase.to_string())
                .fetch_one(&pool)
                .await
                .unwrap();
            sagaworks_test_support::eventually(
                "the first worker to be in the charge",
                Duration::from_secs(30),
                || async {
                    let charging: Option<String> = sqlx::query_scalar(
                        "SELECT lease_owner FROM saga_instances
                         WHERE id = $1 AND EXISTS (SELECT 1 FROM calls WHERE step = 'charge')",
                    )
                    .bind(saga)
                    .fetch_optional(&pool)
                    .await
                    .unwrap()
                    .flatten();
                    charging.filter(|owner| owner == first.owner())
                },
            )
            .await;

            // The first replica stops while its step runs; a second one is up.
            first_stop.cancel();
            let second = Engine::new(pool.clone(), definition(&pool), long_lease()).unwrap();
            tokio::spawn(second.run_worker(stop.clone()));
            wallet.rollback().await.unwrap();
            worker.await.unwrap();

            // Handed back: the second replica finishes it, long before the lease could run out.
            assert_eq!(finished(&pool, saga).await, "COMPLETED");
            let calls: Vec<String> =
                sqlx::query_scalar("SELECT step FROM calls ORDER BY seq").fetch_all(&pool).await.unwrap();
            assert_eq!(calls, ["reserve", "charge", "ship"], "each step once: the charge was not repeated");
            assert_eq!(money_and_stock(&pool).await, (CREDIT - 2 * PRICE, STOCK - 2, 2), "charged once");
        }),
        Trial::test("the_matrix_lists_the_added_ship_step", || {
            let names: Vec<String> = testing::cases(&shape()).iter().map(Case::name).collect();
            for expected in
                ["ship::rejected", "ship::crash_after_call", "refund::compensation_fails_then_succeeds"]
            {
                if !names.iter().any(|n| n == expected) {
                    return Err(format!("no case {expected} in {names:?}").into());
                }
            }
            Ok(())
        }),
    ]
}

/// A definition's shape, which needs no database: a lazy pool never connects.
fn shape_of(definition: impl FnOnce(&PgPool) -> Definition<Purchase>) -> sagaworks_saga::Shape {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let _guard = runtime.enter();
    let pool = sqlx::PgPool::connect_lazy("postgres://unused").expect("a lazy pool");
    definition(&pool).shape()
}

fn shape() -> sagaworks_saga::Shape {
    shape_of(definition)
}

/// A version 1 instance stopped dead at `crash_point` (with `faults`) by a v1-only
/// replica; returns its purchase and saga id. Its lease expires within `lease_ms`.
async fn stranded_v1(pool: &PgPool, crash_point: &str, faults: &str) -> (Uuid, Uuid) {
    let mut faulty = settings();
    faulty.crash_point = crash_point.into();
    faulty.faults = faults.into();
    let v1 = Engine::new(pool.clone(), definition(pool), faulty).unwrap();
    v1.register().await.expect("v1 registers");
    let stop = CancellationToken::new();
    let purchase = place(&v1, pool, 1, &stop).await;
    sagaworks_test_support::eventually("the v1 replica to stop dead", Duration::from_secs(30), || async {
        v1.has_crashed().then_some(())
    })
    .await;
    let (saga, version): (Uuid, i32) =
        sqlx::query_as("SELECT id, version FROM saga_instances WHERE key = $1")
            .bind(purchase.to_string())
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(version, 1, "started on v1");
    (purchase, saga)
}

async fn calls_of(pool: &PgPool, purchase: Uuid, step: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM calls WHERE purchase_id = $1 AND step = $2")
        .bind(purchase)
        .bind(step)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Changing the saga while instances are in flight (docs/design.md, "Changing a saga").
fn version_trials() -> Vec<libtest_mimic::Trial> {
    vec![
        db_trial(
            "versions::v1_instances_mid_flight_finish_on_v1_and_new_ones_start_on_v2",
            |pool, stop| async move {
                // At each of v1's steps, and in compensation (the charge rejected, stopped before
                // the release).
                let mut stranded = vec![];
                for (point, faults, ends) in [
                    ("before:reserve", "", "COMPLETED"),
                    ("before:charge", "", "COMPLETED"),
                    ("before:ship", "", "COMPLETED"),
                    ("before:confirm", "", "COMPLETED"),
                    ("before:release", "reject:charge", "COMPENSATED"),
                ] {
                    let (purchase, saga) = stranded_v1(&pool, point, faults).await;
                    stranded.push((point, purchase, saga, ends));
                }

                // A binary that dropped v1 is refused, naming the version and the count.
                let v2_only = Engine::new(pool.clone(), definition_v2(&pool, 2), settings()).unwrap();
                let refused =
                    v2_only.register().await.expect_err("v2 alone is refused while v1 instances run");
                assert!(
                    matches!(&refused, sagaworks_saga::VersionError::Unregistered { unregistered, .. }
                    if unregistered.get(&1) == Some(&5) && unregistered.len() == 1),
                    "{refused:?}"
                );
                assert!(refused.to_string().contains("v1: 5"), "{refused}");
                // The escape hatch starts it; it then leaves the v1 instances alone.
                let forced = Engine::new(
                    pool.clone(),
                    definition_v2(&pool, 2),
                    SagaSettings { force_start: true, ..settings() },
                )
                .unwrap();
                forced.register().await.expect("force_start starts");

                // A binary with both finishes v1's on v1's shape and starts new ones on v2.
                let both = Engine::new(
                    pool.clone(),
                    Versions::new(definition_v2(&pool, 2)).and(definition(&pool)),
                    settings(),
                )
                .unwrap();
                both.register().await.expect("v1 and v2 register");
                assert_eq!(both.definition().version(), 2, "the newest starts new instances");
                let listed = both.versions().await.unwrap();
                let view: Vec<_> =
                    listed.iter().map(|v| (v.version, v.unfinished, v.registered, v.starts_new)).collect();
                assert_eq!(view, [(2, 0, true, true), (1, 5, true, false)], "{listed:?}");
                assert_eq!(listed[1].fingerprint, definition(&pool).fingerprint());
                tokio::spawn(both.clone().run_worker(stop.clone()));
                let new = place(&both, &pool, 1, &stop).await;
                for (point, purchase, saga, ends) in stranded {
                    assert_eq!(finished(&pool, saga).await, ends, "the v1 instance stopped {point}");
                    assert_eq!(calls_of(&pool, purchase, "notify").await, 0, "v1 has no notify ({point})");
                    let version: i32 = sqlx::query_scalar("SELECT version FROM saga_instances WHERE id = $1")
                        .bind(saga)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                    assert_eq!(version, 1, "{point}");
                }
                let saga: Uuid = sqlx::query_scalar("SELECT id FROM saga_instances WHERE key = $1")
                    .bind(new.to_string())
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!(finished(&pool, saga).await, "COMPLETED");
                assert_eq!(calls_of(&pool, new, "notify").await, 1, "v2 notifies");
                let (version, output): (i32, serde_json::Value) = sqlx::query_as(
                    "SELECT i.version, s.output FROM saga_instances i
                 JOIN saga_instance_steps s ON s.saga_id = i.id AND s.name = 'notify' WHERE i.id = $1",
                )
                .bind(saga)
                .fetch_one(&pool)
                .await
                .unwrap();
                assert_eq!((version, output), (2, serde_json::json!({ "channel": "email" })));
                // Drained: v1 has nothing unfinished, so v2 alone starts now.
                let listed = both.versions().await.unwrap();
                let view: Vec<_> = listed.iter().map(|v| (v.version, v.unfinished)).collect();
                assert_eq!(view, [(2, 0), (1, 0)]);
                v2_only.register().await.expect("v2 alone once v1 is drained");
            },
        ),
        db_trial(
            "versions::start_version_picks_the_version_new_instances_start_on",
            |pool, stop| async move {
                let versions = || Versions::new(definition_v2(&pool, 2)).and(definition(&pool));
                let unknown =
                    Engine::new(pool.clone(), versions(), SagaSettings { start_version: 3, ..settings() });
                let refused = unknown.err().expect("an unregistered start_version is refused").to_string();
                assert!(refused.contains("saga.start_version: version 3"), "{refused}");
                // Draining v2 (a rollback): v1 starts new instances, v2's would still finish.
                let back =
                    Engine::new(pool.clone(), versions(), SagaSettings { start_version: 1, ..settings() })
                        .unwrap();
                back.register().await.unwrap();
                let purchase = place(&back, &pool, 1, &stop).await;
                let (saga, version): (Uuid, i32) =
                    sqlx::query_as("SELECT id, version FROM saga_instances WHERE key = $1")
                        .bind(purchase.to_string())
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                assert_eq!(version, 1);
                tokio::spawn(back.clone().run_worker(stop.clone()));
                assert_eq!(finished(&pool, saga).await, "COMPLETED");
                assert_eq!(calls_of(&pool, purchase, "notify").await, 0, "on v1's shape");
                let starts: Vec<_> =
                    back.versions().await.unwrap().iter().map(|v| (v.version, v.starts_new)).collect();
                assert_eq!(starts, [(2, false), (1, true)]);
            },
        ),
        db_trial(
            "versions::a_changed_shape_under_an_unchanged_version_is_refused_while_it_has_instances",
            |pool, _stop| async move {
                let v1 = Engine::new(pool.clone(), definition(&pool), settings()).unwrap();
                v1.register().await.expect("v1 registers");
                let (_, saga) = stranded_v1(&pool, "before:ship", "").await;
                // v2's shape declared as version 1: its instances would be read through it.
                let relabelled = Engine::new(pool.clone(), definition_v2(&pool, 1), settings()).unwrap();
                let refused = relabelled.register().await.expect_err("a changed shape is refused");
                assert!(
                    matches!(&refused, sagaworks_saga::VersionError::ShapeChanged { version: 1, unfinished: 1, stored, now, .. }
                    if *stored == definition(&pool).fingerprint() && *now == definition_v2(&pool, 1).fingerprint()),
                    "{refused:?}"
                );
                assert!(refused.to_string().contains("version 1's shape changed"), "{refused}");
                // With the instance finished on the real v1, nothing can be misread: accepted.
                tokio::spawn(v1.clone().run_worker(_stop.clone()));
                assert_eq!(finished(&pool, saga).await, "COMPLETED");
                relabelled.register().await.expect("no unfinished instance of it: recorded");
                let stored: String = sqlx::query_scalar(
                    "SELECT fingerprint FROM saga_versions WHERE saga_type = 'purchase' AND version = 1",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                assert_eq!(stored, definition_v2(&pool, 1).fingerprint());
            },
        ),
    ]
}

/// The statement a transition commits, on its own.
fn statement_trials() -> Vec<libtest_mimic::Trial> {
    vec![db_trial("a_start_whose_guard_returns_no_row_creates_nothing", |pool, _| async move {
        let engine = Engine::new(pool.clone(), definition(&pool), settings()).unwrap();
        let (purchase, first) = start_purchase(&engine, &pool, 1).await;
        drop(first);
        // The same purchase again: its insert conflicts, the guard returns no row.
        let mut conn = pool.acquire().await.unwrap();
        let input = PurchaseInput { purchase_id: purchase, quantity: 1 };
        let again = engine
            .start_with(&mut conn, "another key", input, |_, w| {
                let id = w.bind(purchase);
                let insert = format!(
                    "INSERT INTO purchases (id, status) VALUES ({id}, 'PENDING') \
                     ON CONFLICT DO NOTHING RETURNING id"
                );
                Ok::<_, StartError>(w.guard("purchase", insert))
            })
            .await
            .unwrap();
        assert!(again.is_none(), "a start whose guard returned no row must not be started");
        let instances: i64 =
            sqlx::query_scalar("SELECT count(*) FROM saga_instances").fetch_one(&pool).await.unwrap();
        assert_eq!(instances, 1, "no instance for the second start");
    })]
}

/// What debug builds check of a statement.
#[cfg(debug_assertions)]
fn debug_trials() -> Vec<libtest_mimic::Trial> {
    vec![db_trial("two_writes_of_one_row_in_one_statement_fail_in_debug_builds", |pool, _| async move {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        sqlx::query("INSERT INTO purchases (id, status) VALUES ($1, 'PENDING'), ($2, 'PENDING')")
            .bind(a)
            .bind(b)
            .execute(&pool)
            .await
            .unwrap();
        // The status of `first` and the total of `second`, as two guarded updates.
        let write = |first: Uuid, second: Uuid| {
            let mut w = Statement::new();
            let (first, second) = (w.bind(first), w.bind(second));
            let _ = w.guard("g", "SELECT 1");
            w.guarded("purchase_status", |g| {
                g.update("purchases").set("status = 'CONFIRMED'").filter(format!("purchases.id = {first}"))
            });
            w.guarded("purchase_total", |g| {
                g.update("purchases AS p").set("total_cents = 500").filter(format!("p.id = {second}"))
            });
            let (sql, args) = w.finish("SELECT 1 FROM g").unwrap();
            sqlx::query_with(AssertSqlSafe(sql), args).execute(&pool)
        };
        let purchase = |id: Uuid| {
            sqlx::query_as::<_, (String, i64)>("SELECT status, total_cents FROM purchases WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
        };

        // One row each: both written.
        write(a, b).await.expect("one write per row");
        assert_eq!(purchase(a).await.unwrap(), ("CONFIRMED".to_string(), 0));
        assert_eq!(purchase(b).await.unwrap(), ("PENDING".to_string(), 500));

        // Both on `b`: PostgreSQL would apply one of them; the check refuses the statement.
        let error = write(b, b).await.expect_err("two writes of one row must fail").to_string();
        assert!(
            error.contains("two writes of one row in one statement: purchase_status, purchase_total"),
            "{error}"
        );
        assert_eq!(purchase(b).await.unwrap(), ("PENDING".to_string(), 500), "nothing was written");
    })]
}

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = testing::trials("matrix::", &shape(), run_case);
    // Every registered version has its matrix.
    trials.extend(testing::trials("matrix_v2::", &shape_of(|pool| definition_v2(pool, 2)), run_case_v2));
    trials.extend(version_trials());
    trials.extend(other_trials());
    trials.extend(operator_trials());
    trials.extend(statement_trials());
    #[cfg(debug_assertions)]
    trials.extend(debug_trials());
    libtest_mimic::run(&args, trials).exit();
}
