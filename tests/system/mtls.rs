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
