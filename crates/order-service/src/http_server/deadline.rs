//! Two wrappers that let the accept loop see what a connection is doing:
//! [`WriteDeadline`] fails a write that makes no progress for too long (a
//! client that never reads its response), and [`GuardedBody`] holds a
//! connection's [`Busy`] mark until the response body has been sent.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::registry::{Busy, Connection};

/// A stream whose writes fail with `TimedOut` once one has been pending for
/// `limit` without the peer taking a byte. Reads are untouched (hyper's
/// header timeout and the API's request timeout bound those). While a write
/// waits, its connection is marked as writing, so it is not evicted.
#[derive(Debug)]
pub(super) struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Running while a write (or flush) is pending.
    stalled: Option<Pin<Box<Sleep>>>,
    connection: Option<std::sync::Arc<Connection>>,
}

impl<S> WriteDeadline<S> {
    pub fn new(inner: S, limit: Duration, connection: Option<std::sync::Arc<Connection>>) -> Self {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
            connection,
        }
    }

    fn mark_writing(&self, writing: bool) {
        if let Some(connection) = &self.connection {
            connection.set_writing(writing);
        }
    }

    /// `Ready(err)` once the pending write has waited `limit`.
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        if self.stalled.is_none() {
            self.mark_writing(true);
        }
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing of its response for {limit:?}"),
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    fn track<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(result) => {
                if self.stalled.take().is_some() {
                    self.mark_writing(false);
                }
                Poll::Ready(result)
            }
            Poll::Pending => match self.poll_stall(cx) {
                Poll::Ready(error) => Poll::Ready(Err(error)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.track(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.track(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.track(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.track(cx, polled)
    }
}

/// A response body that keeps its connection marked busy until hyper has
/// taken all of it (or dropped it: the connection went away).
pub(super) struct GuardedBody {
    inner: axum::body::Body,
    _busy: Busy,
}

impl GuardedBody {
    pub fn new(inner: axum::body::Body, busy: Busy) -> Self {
        GuardedBody { inner, _busy: busy }
    }
}

impl http_body::Body for GuardedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt as _;

    use super::*;

    #[tokio::test]
    async fn a_write_nobody_reads_fails_after_the_limit() {
        // A pipe with a small buffer whose far end never reads.
        let (near, _far) = tokio::io::duplex(64);
        let mut stream = WriteDeadline::new(near, Duration::from_millis(100), None);
        let started = std::time::Instant::now();
        let error = stream
            .write_all(&[0; 4096])
            .await
            .expect_err("the write stalls and fails");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_slow_but_steady_reader_is_not_cut_off() {
        let (near, mut far) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            let mut buf = [0; 64];
            let mut total = 0;
            while total < 1024 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                total += tokio::io::AsyncReadExt::read(&mut far, &mut buf)
                    .await
                    .expect("read");
            }
        });
        let mut stream = WriteDeadline::new(near, Duration::from_millis(200), None);
        stream
            .write_all(&[0; 1024])
            .await
            .expect("each write progresses in time");
        reader.await.expect("reader");
    }
}
