//! The gateway's HTTP server as a client on the network meets it: real sockets against
//! the real server (`gateway::server`), started in the test's runtime. Nothing here
//! needs the services behind the gateway.

use gateway::config::{Environment, Settings};
use gateway::startup::Application;
use sagaworks_config::ListenSettings;
use std::io::{Read, Write};
use std::net::SocketAddr;
use tokio_util::sync::CancellationToken;

/// Development settings on a free loopback port: no TLS, auth and rate limits off (the
/// edge's limits are what these tests look at).
fn settings() -> Settings {
    let mut settings = Settings { environment: Environment::Development, ..Settings::default() };
    settings.http = ListenSettings::new("127.0.0.1", 0);
    settings.auth.enabled = false;
    settings.rate_limit.enabled = false;
    settings
}

/// A running gateway; it stops when this is dropped.
struct Gateway {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(settings: Settings) -> Gateway {
    let app = Application::build(settings).await.expect("the gateway starts");
    let addr = SocketAddr::from(([127, 0, 0, 1], app.port()));
    let stop = CancellationToken::new();
    tokio::spawn(app.run_until_stopped(stop.clone()));
    Gateway { addr, stop }
}

/// The status line and the body of an HTTP/1.1 answer read to its end.
fn status_and_body(answer: &[u8]) -> (String, String) {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.lines().next().unwrap_or_default().to_string(), body.to_string())
}

/// A blocking client socket to `addr` whose send buffer is 64 KiB, as over a real network
/// path, where a 2 MB body does not fit in the kernels' buffers (loopback's would take it
/// whole).
async fn small_buffered_client(addr: SocketAddr) -> std::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(64 * 1024).unwrap();
    let client = socket.connect(addr).await.unwrap().into_std().unwrap();
    client.set_nonblocking(false).unwrap();
    client
}

/// A client that writes a whole 2 MB body before it reads, as Python's urllib does, to a
/// gateway whose limit is 64 KiB: every try reads the 413 problem, none a reset or a
/// broken pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_gets_its_413_even_when_the_client_writes_it_all_first() {
    let gateway = start(settings()).await;
    let body = std::sync::Arc::new(vec![b' '; 2 * 1024 * 1024]);
    for attempt in 0..50 {
        let mut client = small_buffered_client(gateway.addr).await;
        let body = body.clone();
        let answer = tokio::task::spawn_blocking(move || {
            let head = format!(
                "POST /v1/orders HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n",
                body.len()
            );
            client.write_all(head.as_bytes()).unwrap();
            client
                .write_all(&body)
                .unwrap_or_else(|e| panic!("try {attempt}: the body could not be written: {e}"));
            let mut answer = Vec::new();
            client
                .read_to_end(&mut answer)
                .unwrap_or_else(|e| panic!("try {attempt}: the answer could not be read: {e}"));
            answer
        })
        .await
        .unwrap();
        let (status, body) = status_and_body(&answer);
        assert!(status.starts_with("HTTP/1.1 413"), "try {attempt}: {status}");
        let problem: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("try {attempt}: not problem+json ({e}): {body}"));
        assert_eq!(problem["status"], 413, "try {attempt}: {problem}");
    }
}
