//! Shared set-up: telemetry exporting to an in-process OTLP receiver, and a tiny
//! inventory gRPC server behind `ServerTraceLayer`.

use sagaworks_config::TelemetrySettings;
use sagaworks_proto::inventory::v1 as inventory;
use sagaworks_telemetry::TelemetryGuard;
use sagaworks_test_support::otlp::{OtlpReceiver, ReceivedSpan};
use std::net::SocketAddr;
use std::time::Duration;
use tonic::{Request, Response, Status};

pub const SERVICE: &str = "telemetry-test";
pub const VERSION: &str = "1.2.3";
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// `init` with span export to `receiver`.
pub fn init_exporting_to(receiver: &OtlpReceiver) -> TelemetryGuard {
    let settings = TelemetrySettings {
        log_level: "warn".into(),
        log_format: "json".into(),
        otlp_endpoint: receiver.endpoint(),
    };
    sagaworks_telemetry::init(SERVICE, VERSION, &settings).expect("telemetry init")
}

/// The one span named `name` for which `pick` holds, or a panic listing what arrived.
pub fn the<'a>(
    spans: &'a [ReceivedSpan],
    name: &str,
    pick: impl Fn(&ReceivedSpan) -> bool,
) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == name && pick(s)).collect();
    assert_eq!(found.len(), 1, "expected one span {name:?}, got {found:#?} among {spans:#?}");
    found[0]
}

/// An inventory service implementing GetStock only: `p1` exists, `boom` fails
/// with INTERNAL, anything else is NOT_FOUND.
pub struct TestInventory;

#[tonic::async_trait]
impl inventory::inventory_service_server::InventoryService for TestInventory {
    async fn create_product(
        &self,
        _: Request<inventory::CreateProductRequest>,
    ) -> Result<Response<inventory::Product>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn add_stock(
        &self,
        _: Request<inventory::AddStockRequest>,
    ) -> Result<Response<inventory::Product>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn get_stock(
        &self,
        request: Request<inventory::GetStockRequest>,
    ) -> Result<Response<inventory::Product>, Status> {
        let id = request.into_inner().product_id;
        let _load = tracing::info_span!("load_product", product.id = %id).entered();
        match id.as_str() {
            "p1" => Ok(Response::new(inventory::Product {
                id,
                sku: "SKU-1".into(),
                available: 5,
                ..Default::default()
            })),
            "boom" => Err(Status::internal("database on fire")),
            _ => Err(Status::not_found(format!("no product {id}"))),
        }
    }

    async fn list_products(
        &self,
        _: Request<inventory::ListProductsRequest>,
    ) -> Result<Response<inventory::ListProductsResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn reserve_stock(
        &self,
        _: Request<inventory::ReserveStockRequest>,
    ) -> Result<Response<inventory::Reservation>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn release_reservation(
        &self,
        _: Request<inventory::ReleaseReservationRequest>,
    ) -> Result<Response<inventory::Reservation>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// Serves [`TestInventory`] behind `ServerTraceLayer` on a free port.
pub async fn start_inventory() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .layer(sagaworks_telemetry::grpc::ServerTraceLayer::new("inventory"))
        .add_service(inventory::inventory_service_server::InventoryServiceServer::new(TestInventory))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(server);
    addr
}
