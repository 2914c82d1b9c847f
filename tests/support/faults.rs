//! Fault injection and observation helpers for the resilience tests.
//!
//! * [`restart_inventory_with_faults`] / [`start_payment_on`]: replace a participant of a
//!   [`Stack`] by one on the same port (and database), the inventory with
//!   `[fault] enabled = true`.
//! * [`set_fault`] / [`clear_fault`]: `PUT` / `DELETE /fault` on a service's HTTP port.
//! * [`metrics`] and [`sample`]: read a service's `/metrics`.

use crate::{Running, Stack, local};
use reqwest::StatusCode;
use sagaworks_config::KafkaSettings;
use sagaworks_test_support::TestDatabase;
use serde_json::Value;

/// Kills the stack's inventory and starts it again on the same gRPC port and database,
/// with fault injection enabled.
pub async fn restart_inventory_with_faults(stack: &mut Stack) {
    stack.inventory.kill();
    let settings = inventory::config::Settings {
        tls: sagaworks_test_support::certs::tls("inventory"),
        grpc: local(stack.inventory.grpc_port),
        http: local(0),
        database: stack.inventory_db.settings(),
        kafka: stack.kafka_for("inventory"),
        fault: sagaworks_runtime::FaultSettings { enabled: true },
        ..Default::default()
    };
    stack.inventory = Running::start_on_same_port::<crate::Inventory>("inventory", settings).await;
}

/// Starts payment on `grpc_port` (where a killed one ran) as soon as the port is free.
pub async fn start_payment_on(db: &TestDatabase, kafka: &KafkaSettings, grpc_port: u16) -> Running {
    let settings = payment::config::Settings {
        tls: sagaworks_test_support::certs::tls("payment"),
        grpc: local(grpc_port),
        http: local(0),
        database: db.settings(),
        kafka: kafka.clone(),
        ..Default::default()
    };
    Running::start_on_same_port::<crate::Payment>("payment", settings).await
}

fn fault_url(http_port: u16) -> String {
    format!("http://127.0.0.1:{http_port}/fault")
}

/// `PUT /fault` on the service listening on `http_port`; returns the HTTP status.
pub async fn put_fault(http_port: u16, fault: &Value) -> StatusCode {
    let res =
        reqwest::Client::new().put(fault_url(http_port)).json(fault).send().await.expect("service answers");
    res.status()
}

/// Sets a fault; panics unless the service accepted it.
pub async fn set_fault(http_port: u16, fault: Value) {
    assert_eq!(put_fault(http_port, &fault).await, StatusCode::OK, "fault {fault} accepted");
}

/// `DELETE /fault`.
pub async fn clear_fault(http_port: u16) {
    let res = reqwest::Client::new().delete(fault_url(http_port)).send().await.expect("service answers");
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
}

/// The Prometheus text of the service listening on `http_port`.
pub async fn metrics(http_port: u16) -> String {
    let url = format!("http://127.0.0.1:{http_port}/metrics");
    reqwest::get(url).await.expect("metrics answer").text().await.expect("metrics text")
}

/// The value of the sample `series` (name with labels, exactly as rendered) in `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The saga step named `name` of an order (as the gateway returns it).
pub fn step<'a>(order: &'a Value, name: &str) -> Option<&'a Value> {
    order["saga"]["steps"].as_array()?.iter().find(|s| s["name"] == name)
}
