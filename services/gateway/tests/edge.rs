//! The gateway's HTTP server as a client on the network meets it: real sockets against
//! the real server (`gateway::server`), started in the test's runtime. Nothing here
//! needs the services behind the gateway.

use gateway::config::{Environment, Settings};
use gateway::startup::Application;
use sagaworks_config::ListenSettings;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
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

/// The client connection preface of HTTP/2 (RFC 9113 3.4): the magic, then a SETTINGS
/// frame (empty: the defaults).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// A HEADERS frame on stream 1 without END_HEADERS: a header block (`GET`, `http`, `/`)
/// that CONTINUATION frames would finish, and never do.
const H2_HALF_A_HEADER_BLOCK: &[u8] = b"\0\0\x03\x01\x00\0\0\0\x01\x82\x86\x84";

/// A cleartext HTTP/2 (h2c, prior knowledge) connection that has sent `frames` after the
/// preface and then stalls: it never answers a SETTINGS or a PING.
async fn stalled_h2c(addr: SocketAddr, frames: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(H2_PREFACE).await.unwrap();
    stream.write_all(frames).await.unwrap();
    stream
}

/// Reads (and drops) what the server sends until it closes the connection; returns when
/// that was. A reset counts as closed. Past an hour the connection is taken as never
/// closed.
async fn closed_at(mut stream: TcpStream) -> Instant {
    let mut sink = Vec::new();
    match tokio::time::timeout(Duration::from_secs(3600), stream.read_to_end(&mut sink)).await {
        Ok(_) => Instant::now(),
        Err(_) => panic!("the connection is still open an hour later"),
    }
}

/// A connection to `addr` from the loopback address `from` (127.0.0.2 is another peer).
async fn connect_from(from: Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

/// `GET /health/live` over HTTP/1.1 on `stream`: what the server answered before it
/// closed (empty when it closed at once or reset the connection).
async fn get_live(mut stream: TcpStream) -> Vec<u8> {
    let request = b"GET /health/live HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n";
    if stream.write_all(request).await.is_err() {
        return Vec::new();
    }
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer).await {
        Ok(_) => answer,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => answer,
        Err(e) => panic!("reading the answer: {e}"),
    }
}

fn served(answer: &[u8]) -> bool {
    answer.starts_with(b"HTTP/1.1 200")
}

/// The slow-connection attack on HTTP/2: connections that send the preface, or a header
/// block they never finish, and nothing else. Each is closed once it has delivered no
/// complete request head for `header_read_timeout_ms` (then a GOAWAY, which a stalled
/// peer does not answer, and `http2_keep_alive_timeout_ms` for it to close), not before.
#[tokio::test(start_paused = true)]
async fn an_h2c_connection_without_a_complete_request_head_is_closed_at_the_header_read_timeout() {
    let mut settings = settings();
    settings.server.header_read_timeout_ms = 2_000;
    settings.server.http2_keep_alive_timeout_ms = 1_000;
    // Keep-alive PINGs are not what closes these.
    settings.server.http2_keep_alive_interval_ms = 3_600_000;
    let gateway = start(settings).await;
    let opened = Instant::now();
    let preface_only = stalled_h2c(gateway.addr, &[]).await;
    let half_a_head = stalled_h2c(gateway.addr, H2_HALF_A_HEADER_BLOCK).await;
    let (preface_only, half_a_head) = tokio::join!(closed_at(preface_only), closed_at(half_a_head));
    for (what, closed) in [("only the preface", preface_only), ("half a header block", half_a_head)] {
        let after = closed - opened;
        assert!(
            after >= Duration::from_millis(2_000) && after <= Duration::from_millis(3_000),
            "{what}: closed after {after:?}, not within the header-read timeout and the GOAWAY's grace"
        );
    }
}

/// A peer that is gone (it answers no PING) is found by the HTTP/2 keep-alive: its
/// connection closes one interval and one timeout after its last frame, long before the
/// header-read timeout would close it.
#[tokio::test(start_paused = true)]
async fn an_h2c_peer_that_answers_no_ping_is_closed_by_the_keep_alive() {
    let mut settings = settings();
    settings.server.header_read_timeout_ms = 60_000;
    settings.server.http2_keep_alive_interval_ms = 1_000;
    settings.server.http2_keep_alive_timeout_ms = 1_000;
    let gateway = start(settings).await;
    let opened = Instant::now();
    let after = closed_at(stalled_h2c(gateway.addr, &[]).await).await - opened;
    assert!(
        after >= Duration::from_millis(2_000) && after < Duration::from_millis(60_000),
        "closed after {after:?}: not by the keep-alive (PING after 1 s, no answer 1 s later)"
    );
}

/// One HTTP/1.1 `GET /health/live` on a kept-alive connection: `None` when the server
/// has closed it (end of stream or a reset) instead of answering.
async fn keep_alive_get(stream: &mut TcpStream) -> Option<String> {
    let request = b"GET /health/live HTTP/1.1\r\nHost: gateway\r\n\r\n";
    stream.write_all(request).await.ok()?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase().strip_prefix("content-length:").map(str::to_string)
                })
                .and_then(|n| n.trim().parse::<usize>().ok())
                .expect("a content-length");
            if body.len() >= length {
                return Some(head.lines().next().unwrap_or_default().to_string());
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A client that keeps its connection busy (a request every second, so it is never idle)
/// still loses it at `max_connection_age_ms`.
#[tokio::test(start_paused = true)]
async fn a_busy_connection_is_closed_at_its_maximum_age() {
    let mut settings = settings();
    settings.server.max_connection_age_ms = 5_000;
    let gateway = start(settings).await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    let opened = Instant::now();
    let mut answered = 0;
    let closed = loop {
        match keep_alive_get(&mut stream).await {
            Some(status) => assert!(status.starts_with("HTTP/1.1 200"), "{status}"),
            None => break opened.elapsed(),
        }
        answered += 1;
        assert!(answered < 3600, "the connection is still served an hour later");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(
        closed >= Duration::from_secs(5) && closed <= Duration::from_secs(6) && answered >= 5,
        "closed after {closed:?} and {answered} answers, not at the maximum age"
    );
}

/// One host holding its `max_connections_per_peer` (three stalled h2c connections) cannot
/// open a fourth (it is closed unanswered), and a client from another address still gets
/// in, though the global cap leaves room for one connection more only. Once the host's
/// connections close, it is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_over_its_connection_cap_is_refused_and_another_peer_still_gets_in() {
    let mut settings = settings();
    settings.server.max_connections_per_peer = 3;
    settings.server.max_connections = 4;
    // The held connections outlive the test.
    settings.server.header_read_timeout_ms = 600_000;
    let gateway = start(settings).await;
    let (attacker, other) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = connect_from(attacker, gateway.addr).await;
        stream.write_all(H2_PREFACE).await.unwrap();
        held.push(stream);
    }
    let refused = get_live(connect_from(attacker, gateway.addr).await).await;
    assert!(
        refused.is_empty(),
        "a fourth connection of the peer was served: {}",
        String::from_utf8_lossy(&refused)
    );

    let answer =
        tokio::time::timeout(Duration::from_secs(30), get_live(connect_from(other, gateway.addr).await))
            .await
            .expect("another peer is not served while one holds its cap");
    assert!(served(&answer), "another peer: {}", String::from_utf8_lossy(&answer));

    // The host's connections close; its slots come free as the server sees each close.
    drop(held);
    tokio::time::timeout(Duration::from_secs(30), async {
        while !served(&get_live(connect_from(attacker, gateway.addr).await).await) {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the peer is served again once its connections closed");
}
