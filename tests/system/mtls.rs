//! Mutual TLS and the per-method allow-lists between the services (libs/mtls): a
//! call reaches a method only over TLS, with a certificate of the services' CA whose
//! identity services.toml admits for that method. Every refused call changes nothing.

use sagaworks_proto::inventory::v1 as inv;
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_proto::order::v1 as ord;
use sagaworks_proto::order::v1::order_service_client::OrderServiceClient;
use sagaworks_proto::payment::v1 as pay;
use sagaworks_proto::payment::v1::payment_service_client::PaymentServiceClient;
use sagaworks_test_support::certs;
use system_tests::faults::{metrics, sample};
use system_tests::{Stack, channel_as};
use tonic::Code;
use uuid::Uuid;

fn reserve(product: &str) -> inv::ReserveStockRequest {
    let id = Uuid::now_v7().to_string();
    inv::ReserveStockRequest {
        idempotency_key: format!("{id}:reserve_stock"),
        reservation_id: id,
        order_id: Uuid::now_v7().to_string(),
        items: vec![inv::ReserveItem { product_id: product.into(), quantity: 1 }],
    }
}

/// A channel to `url` with TLS as `caller` would set it up, from the certificate in `tls`.
async fn connect(
    tls: &sagaworks_mtls::TlsSettings,
    caller: &str,
    downstream: &str,
    url: &str,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let identity = sagaworks_mtls::Identity::load(tls, caller).unwrap().unwrap();
    tonic::transport::Endpoint::from_shared(url.to_owned())
        .unwrap()
        .tls_config(identity.client_tls(downstream))
        .unwrap()
        .connect()
        .await
}

#[tokio::test]
async fn plaintext_and_certificates_of_another_ca_do_not_get_past_the_handshake() {
    let stack = Stack::start().await;
    let product = stack.product(100, 10).await;
    let url = stack.inventory.grpc_url();

    let plaintext = url.replace("https://", "http://");
    let refused = match InventoryServiceClient::connect(plaintext).await {
        Err(e) => format!("connect: {e:?}"),
        Ok(mut client) => {
            let status =
                client.reserve_stock(reserve(&product)).await.expect_err("a plaintext call is refused");
            assert_ne!(status.code(), Code::Ok);
            format!("{status:?}")
        }
    };
    assert!(!refused.is_empty());

    // The right name, signed by a CA the services do not trust.
    let foreign = certs::foreign_tls("order");
    let call = async {
        let mut client = InventoryServiceClient::new(connect(&foreign, "order", "inventory", &url).await?);
        client.reserve_stock(reserve(&product)).await.map_err(|s| s.into())
    };
    let result: Result<_, Box<dyn std::error::Error>> = call.await;
    assert!(result.is_err(), "a certificate of another CA is refused");

    assert_eq!(stack.stock(&product).await, (10, 0, 0), "nothing was reserved");
}

#[tokio::test]
async fn the_client_checks_that_the_server_is_the_service_it_meant_to_call() {
    let stack = Stack::start().await;
    // Inventory's port, but the caller means payment: inventory's certificate does not name it.
    let wrong = connect(&certs::tls("order"), "order", "payment", &stack.inventory.grpc_url()).await;
    let err = match wrong {
        Err(e) => format!("{e:?}"),
        Ok(channel) => {
            let status = PaymentServiceClient::new(channel)
                .get_account(pay::GetAccountRequest { customer_id: Uuid::now_v7().to_string() })
                .await
                .expect_err("the server is not payment");
            format!("{status:?}")
        }
    };
    assert!(err.contains("certificate") || err.contains("Certificate"), "{err}");
}

#[tokio::test]
async fn each_method_admits_only_the_callers_services_toml_declares() {
    let stack = Stack::start().await;
    let product = stack.product(100, 10).await;
    let customer = stack.customer(1_000).await;
    let (inventory_url, payment_url, order_url) =
        (stack.inventory.grpc_url(), stack.payment.grpc_url(), stack.order.grpc_url());

    // A certificate of the right CA whose identity no policy names.
    let mut intruder = InventoryServiceClient::new(channel_as("intruder", "inventory", &inventory_url).await);
    let denied = intruder.reserve_stock(reserve(&product)).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    // The gateway may read stock, but not reserve it.
    let mut gateway = InventoryServiceClient::new(channel_as("gateway", "inventory", &inventory_url).await);
    let denied = gateway.reserve_stock(reserve(&product)).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    gateway
        .get_stock(inv::GetStockRequest { product_id: product.clone() })
        .await
        .expect("gateway reads stock");
    assert_eq!(stack.stock(&product).await, (10, 0, 0), "nothing was reserved");

    // Charge and Refund only from order: not from the gateway's certificate.
    let payment_id = Uuid::now_v7().to_string();
    let mut as_gateway = PaymentServiceClient::new(channel_as("gateway", "payment", &payment_url).await);
    let charge = pay::ChargeRequest {
        idempotency_key: format!("{payment_id}:charge_payment"),
        payment_id: payment_id.clone(),
        customer_id: customer.clone(),
        order_id: Uuid::now_v7().to_string(),
        amount_cents: 300,
    };
    let denied = as_gateway.charge(charge.clone()).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let refund = pay::RefundRequest {
        idempotency_key: format!("{payment_id}:refund"),
        payment_id: payment_id.clone(),
        order_id: charge.order_id.clone(),
        reason: "test".into(),
    };
    let denied = as_gateway.refund(refund).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert_eq!(stack.balance(&customer).await, 1_000, "nothing was charged");
    let mut as_order = PaymentServiceClient::new(channel_as("order", "payment", &payment_url).await);
    as_order.charge(charge).await.expect("order charges");
    assert_eq!(stack.balance(&customer).await, 700);

    // The operator actions come only from the gateway, which verified the operator's token.
    let mut as_payment = OrderServiceClient::new(channel_as("payment", "order", &order_url).await);
    let act = ord::ActOnSagaRequest {
        saga_id: Uuid::now_v7().to_string(),
        action: "compensate".into(),
        actor: "someone".into(),
        reason: "forged".into(),
        idempotency_key: Uuid::now_v7().to_string(),
        output_json: String::new(),
    };
    let denied = as_payment.act_on_saga(act).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");

    // Counted per service, method and caller.
    let text = metrics(stack.inventory.http_port).await;
    let series = r#"rpc_server_denied_total{service="inventory",method="/sagaworks.inventory.v1.InventoryService/ReserveStock",caller="intruder"}"#;
    assert_eq!(sample(&text, series), Some(1.0), "{text}");
    let series = r#"rpc_server_denied_total{service="inventory",method="/sagaworks.inventory.v1.InventoryService/ReserveStock",caller="gateway"}"#;
    assert_eq!(sample(&text, series), Some(1.0), "{text}");
    let text = metrics(stack.payment.http_port).await;
    let series = r#"rpc_server_denied_total{service="payment",method="/sagaworks.payment.v1.PaymentService/Refund",caller="gateway"}"#;
    assert_eq!(sample(&text, series), Some(1.0), "{text}");
}

#[tokio::test]
async fn a_refund_must_name_the_order_its_payment_belongs_to() {
    let stack = Stack::start().await;
    let customer = stack.customer(1_000).await;
    let mut payment =
        PaymentServiceClient::new(channel_as("order", "payment", &stack.payment.grpc_url()).await);
    let (payment_id, order_id) = (Uuid::now_v7().to_string(), Uuid::now_v7().to_string());
    payment
        .charge(pay::ChargeRequest {
            idempotency_key: format!("{payment_id}:charge_payment"),
            payment_id: payment_id.clone(),
            customer_id: customer.clone(),
            order_id: order_id.clone(),
            amount_cents: 400,
        })
        .await
        .unwrap();
    assert_eq!(stack.balance(&customer).await, 600);

    let refund = |order_id: &str, key: &str| pay::RefundRequest {
        idempotency_key: key.into(),
        payment_id: payment_id.clone(),
        order_id: order_id.into(),
        reason: "test".into(),
    };
    let other = payment.refund(refund(&Uuid::now_v7().to_string(), "other")).await.unwrap_err();
    assert_eq!(other.code(), Code::FailedPrecondition, "{other:?}");
    assert_eq!(stack.balance(&customer).await, 600, "another order's refund changes nothing");
    let refunded = payment.refund(refund(&order_id, "own")).await.unwrap().into_inner();
    assert_eq!(refunded.status, pay::PaymentStatus::Refunded as i32);
    assert_eq!(stack.balance(&customer).await, 1_000);
}

/// The number of a service's certificate reloads with `outcome`, from its `/metrics`.
async fn reloads(http_port: u16, service: &str, outcome: &str) -> f64 {
    let series = format!(r#"tls_certificate_reloads_total{{service="{service}",outcome="{outcome}"}}"#);
    sample(&metrics(http_port).await, &series).unwrap_or(0.0)
}

/// Waits until `service` (its HTTP port) has loaded changed certificate files `count`
/// times in all.
async fn reloaded(http_port: u16, service: &str, count: f64) {
    sagaworks_test_support::eventually(
        &format!("{service} to load its changed certificate files ({count} in all)"),
        std::time::Duration::from_secs(20),
        || async { (reloads(http_port, service, "loaded").await >= count).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn certificates_rotate_under_load_without_a_failed_call() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    // Order and a gateway of this test read their files from a directory of the test's own.
    let dir = certs::scratch_dir("rotation");
    let fast = |mut tls: sagaworks_mtls::TlsSettings| {
        tls.reload_interval_ms = 50;
        tls
    };
    let order_tls = fast(certs::issue_in(&dir, "order"));
    let stack = Stack::start_with(|s| s.tls = order_tls.clone()).await;
    let product = stack.product(100, 10).await;
    let customer = stack.customer(1_000).await;
    let (status, placed) = stack.place(&customer, &product, 1).await;
    assert!(status.is_success(), "{placed}");
    let order_id = placed["order_id"].as_str().expect("an order id").to_owned();
    let mut settings = system_tests::gateway_settings(
        &stack.order.grpc_url(),
        &stack.inventory.grpc_url(),
        &stack.payment.grpc_url(),
    );
    settings.tls = fast(certs::issue_in(&dir, "gateway"));
    let gateway_tls = settings.tls.clone();
    let gateway = system_tests::start_gateway_with(settings).await;
    let (order_http, gateway_http) = (stack.order.http_port, gateway.http_port);
    let order_port = stack.order.grpc_port;
    let new_connection_sees = || certs::server_leaf(&gateway_tls, "gateway", "order", order_port);
    assert_eq!(new_connection_sees().await, certs::leaf_in(&order_tls.cert_file));

    // Bounded load through gateway -> order: 4 tasks, each calling until the rotations
    // are done and then 20 more times, at most 3,000 calls each.
    let rotated = Arc::new(AtomicBool::new(false));
    let (calls, failures) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let url = format!("http://127.0.0.1:{}/v1/orders/{order_id}", gateway.http_port);
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (http, url) = (stack.http.clone(), url.clone());
            let (rotated, calls, failures) = (rotated.clone(), calls.clone(), failures.clone());
            tokio::spawn(async move {
                let (mut after, mut failed) = (0, Vec::new());
                for _ in 0..3_000 {
                    let done = rotated.load(Ordering::SeqCst);
                    let response = http.get(&url).send().await;
                    calls.fetch_add(1, Ordering::SeqCst);
                    match response {
                        Ok(r) if r.status().is_success() => {}
                        other => {
                            failures.fetch_add(1, Ordering::SeqCst);
                            failed.push(format!("{other:?}"));
                        }
                    }
                    if done {
                        after += 1;
                        if after == 20 {
                            break;
                        }
                    }
                }
                (after, failed)
            })
        })
        .collect();
    let progressed = |at_least: usize| {
        let calls = calls.clone();
        async move {
            sagaworks_test_support::eventually(
                "the load to make progress",
                std::time::Duration::from_secs(20),
                || {
                    let n = calls.load(Ordering::SeqCst);
                    async move { (n >= at_least).then_some(()) }
                },
            )
            .await
        }
    };
    progressed(20).await;

    // 1. A new leaf from the same CA.
    let renewed = certs::issue_in(&dir, "order");
    reloaded(order_http, "order", 1.0).await;
    assert_eq!(new_connection_sees().await, certs::leaf_in(&renewed.cert_file), "the renewed certificate");
    let so_far = calls.load(Ordering::SeqCst);
    progressed(so_far + 20).await;

    // 2. A new CA: first both CAs in the bundle (order and the gateway load it), then
    // order's certificate from the new one.
    let new_ca = certs::DevCa::new("sagaworks test CA (next)").expect("a CA");
    let old_ca = std::fs::read_to_string(dir.join("ca.pem")).expect("the CA file");
    let bundle = format!("{old_ca}{}", new_ca.ca_pem());
    let temporary = dir.join(".ca.pem.new");
    std::fs::write(&temporary, bundle).expect("write the bundle");
    std::fs::rename(&temporary, dir.join("ca.pem")).expect("replace the CA file");
    reloaded(order_http, "order", 2.0).await;
    reloaded(gateway_http, "gateway", 1.0).await;
    new_ca.write_service(&dir, "order", "sagaworks").expect("a certificate of the new CA");
    reloaded(order_http, "order", 3.0).await;
    let from_new_ca = certs::leaf_in(&order_tls.cert_file);
    assert_eq!(new_connection_sees().await, from_new_ca, "the certificate of the new CA");
    let so_far = calls.load(Ordering::SeqCst);
    progressed(so_far + 20).await;
    rotated.store(true, Ordering::SeqCst);

    for task in load {
        let (after, failed) = task.await.expect("a load task");
        assert_eq!(after, 20, "calls after the rotations");
        assert!(failed.is_empty(), "failed calls: {failed:?}");
    }
    assert_eq!(failures.load(Ordering::SeqCst), 0);
    assert_eq!(reloads(order_http, "order", "rejected").await, 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_certificate_of_another_trust_domain_is_refused_with_the_reason() {
    let stack = Stack::start().await;
    let product = stack.product(100, 10).await;
    let url = stack.inventory.grpc_url();

    // The services' CA, order's name, but another deployment's trust domain.
    let dir = certs::scratch_dir("trust-domain");
    let elsewhere = certs::issue_in_domain(&dir, "order", "elsewhere");
    let mut client =
        InventoryServiceClient::new(connect(&elsewhere, "order", "inventory", &url).await.unwrap());
    let denied = client.reserve_stock(reserve(&product)).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains("names no service of trust domain sagaworks"), "{denied:?}");
    assert_eq!(stack.stock(&product).await, (10, 0, 0), "nothing was reserved");
    let text = metrics(stack.inventory.http_port).await;
    let series = r#"rpc_server_denied_total{service="inventory",method="/sagaworks.inventory.v1.InventoryService/ReserveStock",caller="unknown"}"#;
    assert_eq!(sample(&text, series), Some(1.0), "{text}");

    // The same certificate from the right trust domain gets through.
    let own = certs::issue_in(&dir, "order");
    let mut client = InventoryServiceClient::new(connect(&own, "order", "inventory", &url).await.unwrap());
    client.reserve_stock(reserve(&product)).await.expect("order reserves");
    let _ = std::fs::remove_dir_all(&dir);
}
