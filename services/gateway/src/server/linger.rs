//! Lingering close: a connection the server closes is first drained of what the client
//! is still sending, as nginx's `lingering_close` does.
//!
//! A client that writes a whole request body before it reads the answer (Python's
//! urllib, curl without `Expect: 100-continue`) is still writing when the server answers
//! early, e.g. 413 for a body over the limit. Closing a socket that has unread data
//! makes the kernel send a reset, which can reach the client before it reads the
//! answer: it sees a broken pipe or a reset instead of the 413. So [`Lingering`]'s
//! shutdown sends the FIN first (the answer is complete on the wire), then reads and
//! discards until the client closes, at most `max_bytes` and at most `timeout`, and only
//! then lets the connection be dropped.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// How much a closing connection drains, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LingerLimits {
    pub timeout: Duration,
    pub max_bytes: usize,
}

/// An I/O stream whose shutdown drains the read side within [`LingerLimits`].
#[derive(Debug)]
pub struct Lingering<T> {
    inner: T,
    limits: LingerLimits,
    state: State,
}

#[derive(Debug)]
enum State {
    Open,
    Draining { left: usize, deadline: Pin<Box<Sleep>> },
    Closed,
}

impl<T> Lingering<T> {
    pub fn new(inner: T, limits: LingerLimits) -> Self {
        Self { inner, limits, state: State::Open }
    }
}

impl<T: AsyncRead + Unpin> Lingering<T> {
    /// Reads and discards until end of stream, an error, the byte budget or the deadline.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let State::Draining { left, deadline } = &mut self.state else { return Poll::Ready(()) };
        let mut scratch = [0u8; 8192];
        loop {
            if *left == 0 {
                return Poll::Ready(());
            }
            let take = scratch.len().min(*left);
            let mut buf = ReadBuf::new(&mut scratch[..take]);
            match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(()),
                Poll::Ready(Ok(())) => *left -= buf.filled().len(),
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => return deadline.as_mut().poll(cx),
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Lingering<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Lingering<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    /// Sends the FIN, then drains (see the module docs). The drain's outcome is no error
    /// of the connection's: the answer was sent whole before it began.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match this.state {
                State::Open => {
                    ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
                    this.state = State::Draining {
                        left: this.limits.max_bytes,
                        deadline: Box::pin(tokio::time::sleep(this.limits.timeout)),
                    };
                }
                State::Draining { .. } => {
                    ready!(this.poll_drain(cx));
                    this.state = State::Closed;
                }
                State::Closed => return Poll::Ready(Ok(())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limits(timeout_ms: u64, max_bytes: usize) -> LingerLimits {
        LingerLimits { timeout: Duration::from_millis(timeout_ms), max_bytes }
    }

    #[tokio::test]
    async fn shutdown_sends_the_fin_then_reads_until_the_peer_closes() {
        let (server, mut client) = tokio::io::duplex(64);
        let mut server = Lingering::new(server, limits(60_000, 1 << 20));
        server.write_all(b"answer").await.unwrap();
        let closing = tokio::spawn(async move { server.shutdown().await });
        // The peer is still writing; the server keeps reading it.
        client.write_all(&[7u8; 1000]).await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"answer", "the answer, then end of stream");
        assert!(!closing.is_finished(), "the peer has not closed yet");
        drop(client);
        closing.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_ends_at_the_deadline_when_the_peer_never_closes() {
        let (server, _client) = tokio::io::duplex(64);
        let mut server = Lingering::new(server, limits(2_000, 1 << 20));
        let started = tokio::time::Instant::now();
        server.shutdown().await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(2_000));
    }

    #[tokio::test]
    async fn the_drain_ends_at_the_byte_budget() {
        let (server, mut client) = tokio::io::duplex(64);
        let mut server = Lingering::new(server, limits(60_000, 100));
        let closing = tokio::spawn(async move { server.shutdown().await });
        // 100 bytes are drained; then the server stops reading, so this write stalls
        // once the pipe's buffer is full, and the shutdown ends without the peer closing.
        let writing = tokio::spawn(async move { client.write_all(&[7u8; 10_000]).await.map(|()| client) });
        closing.await.unwrap().unwrap();
        writing.abort();
    }
}
