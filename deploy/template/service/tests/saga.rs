//! The fault matrix of this service's saga, generated from its definition
//! (`sagaworks_saga::testing`): one test per step and fault, named
//! `<step>::<fault>`, each against a fresh stack (databases, broker, a real
//! inventory). A step added to `src/saga.rs` brings its cases with no change
//! here.
//!
//! Each case creates one item with the case's faults on the first replica
//! (and, when that replica stops dead, lets a second one resume the saga),
//! then checks the saga's end, the item's status, its events, and the unit
//! at inventory: reserved once for an ACTIVE item, not at all for a REJECTED one.

mod support;

use sagaworks_resilience::ClientSettings;
use sagaworks_saga::testing::{self, Case};
use sagaworks_saga::{SagaStatus, Shape};
use sagaworks_test_support::eventually;
use support::{WAIT, local, spawn_app_with};
use {{name}}::pb::CreateItemRequest;

/// Short: a stopped replica's saga is taken over soon.
const LEASE_MS: u64 = 1_000;

/// Runs `case` on claims that start on `version` (`saga.start_version`).
async fn run_case(case: Case, version: u32) -> Result<(), String> {
    let mut app = spawn_app_with(|s| {
        case.apply(&mut s.saga);
        s.saga.start_version = version;
        s.saga.lease_ms = LEASE_MS;
        s.saga.poll_interval_ms = 50;
        s.saga.retry_base_ms = 10;
        s.saga.retry_max_ms = 100;
    })
    .await;
    let product_id = app.product().await;
    let request = CreateItemRequest { product_id: product_id.clone(), name: case.name(), id: String::new() };
    let item = app.client.clone().create_item(request).await.map_err(|e| e.to_string())?.into_inner();
    if case.crashes() {
        let mut second = app.settings.clone();
        second.saga.crash_point = String::new();
        case.apply_resumed(&mut second.saga);
        (second.grpc, second.http) = (local(), local());
        app.start_replica(second).await;
    }
    let pool = app.pool.clone();
    let (saga, status): (String, String) = eventually("the saga to end", WAIT, || async {
        sqlx::query_as(
            "SELECT i.status, items.status FROM saga_instances i JOIN items ON items.id::text = i.key
             WHERE i.key = $1 AND i.status IN ('COMPLETED', 'COMPENSATED')",
        )
        .bind(&item.id)
        .fetch_optional(&pool)
        .await
        .ok()
        .flatten()
    })
    .await;

    let completed = case.expect.status == SagaStatus::Completed;
    assert_eq!(saga, case.expect.status.as_str());
    assert_eq!(status, if completed { "ACTIVE" } else { "REJECTED" });
    let (version_run, stamped): (i32, bool) = sqlx::query_as(
        "SELECT i.version, EXISTS (SELECT 1 FROM item_activations a WHERE a.item_id::text = i.key)
         FROM saga_instances i WHERE i.key = $1",
    )
    .bind(&item.id)
    .fetch_one(&pool)
    .await
    .map_err(|e| e.to_string())?;
    assert_eq!(version_run as u32, version, "the claim ran on the version it started on");
    // Only version 2 has stamp_activation.
    assert_eq!(stamped, completed && version == 2, "item_activations");
    let events: Vec<String> =
        sqlx::query_scalar("SELECT event_type FROM outbox_ledger WHERE aggregate_id = $1 ORDER BY seq")
            .bind(&item.id)
            .fetch_all(&pool)
            .await
            .map_err(|e| e.to_string())?;
    assert_eq!(events, ["ItemCreated", if completed { "ItemActivated" } else { "ItemRejected" }]);
    let compensations: Vec<String> = sqlx::query_scalar(
        "SELECT st.name FROM saga_instance_steps st JOIN saga_instances i ON i.id = st.saga_id
         WHERE i.key = $1 AND st.name = 'release_unit' AND st.status = 'SUCCEEDED'",
    )
    .bind(&item.id)
    .fetch_all(&pool)
    .await
    .map_err(|e| e.to_string())?;
    assert_eq!(compensations, case.expect.compensations);
    // At rest: one unit reserved for an active item, none for a rejected one, never two.
    let stock = app.stock(&product_id).await;
    let reserved = if completed { 1 } else { 0 };
    assert_eq!((stock.available, stock.reserved, stock.sold), (5 - reserved, reserved, 0), "{stock:?}");
    Ok(())
}

/// The saga's shape: the definition needs an inventory channel, which
/// connects lazily and is never used here.
fn shape(version: u32) -> Shape {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let _guard = runtime.enter();
    let inventory = sagaworks_resilience::channel("inventory", &ClientSettings::with_url("http://127.0.0.1:9"), None)
        .expect("a lazy channel");
    match version {
        1 => {{name}}::saga::definition_v1(inventory).shape(),
        _ => {{name}}::saga::definition(inventory).shape(),
    }
}

/// Every version the service drives has its matrix: version 2's cases as
/// `<step>::<fault>`, version 1's (until it is deleted) as `v1::<step>::<fault>`.
fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = testing::trials("", &shape(2), |case| run_case(case, 2));
    trials.extend(testing::trials("v1::", &shape(1), |case| run_case(case, 1)));
    libtest_mimic::run(&args, trials).exit();
}
