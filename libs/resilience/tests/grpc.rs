//! The stack against a real tonic server over real TCP: retries, timeouts, and the
//! breaker opening on a dead server and closing again once it is back.
//!
//! Nothing here measures how long a call took: real sockets rule out paused time, so the
//! tests synchronise on events instead. A call the server never answers can only end by
//! the client's timeout; an open breaker is proven by its own rejection mark and by no
//! attempt reaching a server; the wait for half-open is the breaker's own `retry_after`.

use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_proto::inventory::v1::inventory_service_server::{InventoryService, InventoryServiceServer};
use sagaworks_proto::inventory::v1::*;
use sagaworks_resilience::{
    BreakerSettings, CircuitState, ClientSettings, Rejection, ResilientChannel, RetrySettings, channel,
    never_sent, rejection,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

/// `GetStock` fails the first `fail_first` calls with `UNAVAILABLE`, answers `NOT_FOUND`
/// for product `missing`, never answers for product `hold`; everything else is unimplemented.
struct FakeInventory {
    calls: Arc<AtomicUsize>,
    fail_first: usize,
}

#[tonic::async_trait]
impl InventoryService for FakeInventory {
    async fn create_product(&self, _: Request<CreateProductRequest>) -> Result<Response<Product>, Status> {
        Err(Status::unimplemented("test server"))
    }
    async fn add_stock(&self, _: Request<AddStockRequest>) -> Result<Response<Product>, Status> {
        Err(Status::unimplemented("test server"))
    }
    async fn get_stock(&self, req: Request<GetStockRequest>) -> Result<Response<Product>, Status> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n < self.fail_first {
            return Err(Status::unavailable("warming up"));
        }
        let id = req.into_inner().product_id;
        match id.as_str() {
            "missing" => Err(Status::not_found("no such product")),
            // Only the caller's deadline (or the server enforcing the `grpc-timeout` it
            // sent) can end this call.
            "hold" => std::future::pending().await,
            _ => Ok(Response::new(Product { id, ..Default::default() })),
        }
    }
    async fn list_products(
        &self,
        _: Request<ListProductsRequest>,
    ) -> Result<Response<ListProductsResponse>, Status> {
        Err(Status::unimplemented("test server"))
    }
    async fn reserve_stock(&self, _: Request<ReserveStockRequest>) -> Result<Response<Reservation>, Status> {
        Err(Status::unimplemented("test server"))
    }
    async fn release_reservation(
        &self,
        _: Request<ReleaseReservationRequest>,
    ) -> Result<Response<Reservation>, Status> {
        Err(Status::unimplemented("test server"))
    }
}

/// A running server; stops when dropped.
struct Server {
    calls: Arc<AtomicUsize>,
    _stop: oneshot::Sender<()>,
}

async fn serve(listener: TcpListener, fail_first: usize) -> Server {
    let calls = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = oneshot::channel::<()>();
    let svc = InventoryServiceServer::new(FakeInventory { calls: Arc::clone(&calls), fail_first });
    tokio::spawn(tonic::transport::Server::builder().add_service(svc).serve_with_incoming_shutdown(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        async {
            let _ = stopped.await;
        },
    ));
    Server { calls, _stop: stop }
}

async fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    (l, addr)
}

fn settings(addr: SocketAddr) -> ClientSettings {
    ClientSettings {
        url: format!("http://{addr}"),
        timeout_ms: 1_000,
        connect_timeout_ms: 200,
        retry: RetrySettings {
            max_attempts: 3,
            base_backoff_ms: 10,
            max_backoff_ms: 50,
            ..Default::default()
        },
        breaker: BreakerSettings {
            sliding_window_size: 4,
            minimum_calls: 4,
            wait_duration_open_ms: 500,
            permitted_calls_half_open: 2,
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn get(channel: &ResilientChannel, product: &str) -> Result<Product, Status> {
    let mut client = InventoryServiceClient::new(channel.clone());
    client.get_stock(GetStockRequest { product_id: product.into() }).await.map(Response::into_inner)
}

#[tokio::test]
async fn unavailable_is_retried_until_the_server_answers() {
    let (l, addr) = listener().await;
    let server = serve(l, 2).await;
    let channel = channel("inventory", &settings(addr), None).unwrap();
    let product = get(&channel, "p1").await.expect("third attempt succeeds");
    assert_eq!(product.id, "p1");
    assert_eq!(server.calls.load(Ordering::SeqCst), 3);
    assert_eq!(channel.breaker_state(), CircuitState::Closed);
}

#[tokio::test]
async fn a_business_error_comes_back_once_and_unmarked() {
    let (l, addr) = listener().await;
    let server = serve(l, 0).await;
    let channel = channel("inventory", &settings(addr), None).unwrap();
    for _ in 0..6 {
        let status = get(&channel, "missing").await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert_eq!(rejection(&status), None);
        assert!(!never_sent(&status), "the server answered");
    }
    assert_eq!(server.calls.load(Ordering::SeqCst), 6, "never retried");
    assert_eq!(channel.breaker_state(), CircuitState::Closed, "business errors don't trip it");
}

/// Generous: only there to fail instead of hanging when the behaviour under test is broken.
const HANG: Duration = Duration::from_secs(60);

#[tokio::test]
async fn an_unanswered_call_is_cut_by_the_route_timeout() {
    let (l, addr) = listener().await;
    let server = serve(l, 0).await;
    let mut s = settings(addr);
    s.retry.max_attempts = 2;
    s.routes.insert("GetStock".into(), 100);
    let channel = channel("inventory", &s, None).unwrap();
    // The server never answers `hold`: that the call returns at all is the timeout's doing.
    let status = tokio::time::timeout(HANG, get(&channel, "hold"))
        .await
        .expect("the route timeout ends a call the server never answers")
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    assert_eq!(rejection(&status), Some(Rejection::Timeout));
    assert_eq!(server.calls.load(Ordering::SeqCst), 2, "the timed-out attempt was retried once");
    assert!(!never_sent(&status), "a timed-out attempt may have reached the server");
}

#[tokio::test]
async fn a_dead_server_opens_the_breaker_which_closes_via_half_open_when_it_is_back() {
    // Reserve a port, then leave nothing listening on it.
    let (l, addr) = listener().await;
    drop(l);
    let channel = channel("inventory", &settings(addr), None).unwrap();

    let mut calls = 0;
    while channel.breaker_state() != CircuitState::Open {
        let status = get(&channel, "p1").await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(never_sent(&status), "connection refused: nothing was sent: {status:?}");
        calls += 1;
        assert!(calls <= 4, "4 failed attempts must open it");
    }

    // Open: a server now listens on the port, yet no attempt reaches it; the breaker
    // answers itself, with its mark and the time left until half-open.
    let listener = TcpListener::bind(addr).await.expect("port still free");
    let server = serve(listener, 0).await;
    let mut retry_after = Duration::ZERO;
    for _ in 0..5 {
        let status = get(&channel, "p1").await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(never_sent(&status), "{status:?}");
        retry_after = match rejection(&status) {
            Some(Rejection::CircuitOpen { retry_after }) => retry_after,
            other => panic!("expected circuit_open, got {other:?} from {status:?}"),
        };
        assert!(retry_after <= Duration::from_millis(500), "{retry_after:?}");
    }
    assert_eq!(server.calls.load(Ordering::SeqCst), 0, "no call reached the server while open");
    assert_eq!(channel.breaker_state(), CircuitState::Open);

    // The last rejection said how long the breaker stays open from then on (in whole
    // milliseconds, rounded down: one more covers the rounding).
    tokio::time::sleep(retry_after + Duration::from_millis(1)).await;
    assert_eq!(get(&channel, "p1").await.expect("first probe").id, "p1");
    assert_eq!(channel.breaker_state(), CircuitState::HalfOpen);
    assert_eq!(get(&channel, "p2").await.expect("second probe").id, "p2");
    assert_eq!(channel.breaker_state(), CircuitState::Closed);
    assert_eq!(server.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn calls_are_balanced_over_the_replicas_named_in_the_url() {
    let (l1, a1) = listener().await;
    let (l2, a2) = listener().await;
    let (one, two) = (serve(l1, 0).await, serve(l2, 0).await);
    let s = ClientSettings { url: format!("http://{a1}, http://{a2},"), ..settings(a1) };
    assert_eq!(s.urls().len(), 2, "blanks and the empty part are dropped");
    let channel = channel("inventory", &s, None).unwrap();
    for i in 0..200 {
        get(&channel, &format!("p{i}")).await.expect("answered by a replica");
    }
    let (n1, n2) = (one.calls.load(Ordering::SeqCst), two.calls.load(Ordering::SeqCst));
    assert_eq!(n1 + n2, 200, "one attempt per call");
    // Each pick chooses between both replicas: p(a replica gets <= 10 of 200) is negligible.
    assert!(n1 > 10 && n2 > 10, "both replicas get calls: {n1} and {n2}");
}

#[tokio::test]
async fn a_replica_that_is_down_leaves_the_calls_to_the_others() {
    let (l1, a1) = listener().await;
    let (l2, a2) = listener().await;
    drop(l2); // nothing listens at a2: its connections are refused
    let one = serve(l1, 0).await;
    let s = ClientSettings { url: format!("http://{a1},http://{a2}"), ..settings(a1) };
    let channel = channel("inventory", &s, None).unwrap();
    for i in 0..50 {
        get(&channel, &format!("p{i}")).await.expect("the live replica answers");
    }
    assert_eq!(one.calls.load(Ordering::SeqCst), 50);
}

#[test]
fn a_url_list_without_a_url_is_a_setting_error_not_a_panic() {
    let s = ClientSettings { url: " , ".into(), ..Default::default() };
    let err = sagaworks_resilience::channel("inventory", &s, None).unwrap_err();
    assert!(err.to_string().contains("no URL"), "{err}");
}
