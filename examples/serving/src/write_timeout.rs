//! A connection's socket with a write timeout: a response the client stops
//! reading makes no progress, and after `timeout` of none the write fails,
//! so hyper closes the connection and drops the response, and with it
//! whatever the response held (a concurrency permit until its body ends).
//! hyper has a header read timeout but none for writes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

pin_project! {
    /// `io` whose writes fail with `TimedOut` after `timeout` without
    /// progress; `fired` counts the connections that timed out.
    pub struct WriteTimeout<S> {
        #[pin]
        io: S,
        timeout: Duration,
        // Armed when a write or flush waits, reset when one makes progress;
        // boxed so that the socket stays `Unpin`, as hyper wants it.
        deadline: Pin<Box<Sleep>>,
        armed: bool,
        fired: Arc<AtomicU64>,
    }
}

impl<S> WriteTimeout<S> {
    /// Wrap `io`.
    pub fn new(io: S, timeout: Duration, fired: Arc<AtomicU64>) -> Self {
        Self {
            io,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            armed: false,
            fired,
        }
    }
}

impl<S> WriteTimeout<S> {
    /// What a write that returned `poll` means for the deadline: progress
    /// disarms it, waiting arms it (once) and fails once it has passed.
    fn watch<T>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let this = self.project();
        if poll.is_ready() {
            *this.armed = false;
            return poll;
        }
        if !*this.armed {
            *this.armed = true;
            let at = Instant::now() + *this.timeout;
            this.deadline.as_mut().reset(at);
        }
        ready!(this.deadline.as_mut().poll(cx));
        this.fired.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client read nothing of the response for the write timeout",
        )))
    }
}

impl<S: AsyncRead> AsyncRead for WriteTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().io.poll_read(cx, buf)
    }
}

impl<S: AsyncWrite> AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = self.as_mut().project().io.poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = self.as_mut().project().io.poll_write_vectored(cx, bufs);
        self.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = self.as_mut().project().io.poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}
