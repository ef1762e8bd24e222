//! The bodies that count bytes: the request's as it is read, the answer's
//! as it is sent; the answer's writes the line when it ends or is dropped
//! (a stream the client left).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::time::Instant;

use super::AccessLog;
use super::line::{Entry, millis};

/// A request body counting its bytes into a shared counter (the handler
/// owns the body; the middleware keeps the count).
pub struct Counted {
    inner: Body,
    count: Arc<AtomicU64>,
}

impl Counted {
    pub fn new(inner: Body, count: Arc<AtomicU64>) -> Self {
        Self { inner, count }
    }
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.count.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A line waiting for its answer's end.
pub struct Pending {
    pub log: AccessLog,
    pub entry: Entry,
    pub started: Instant,
    pub received: Arc<AtomicU64>,
}

impl Pending {
    fn write(mut self, sent: u64, complete: bool) {
        self.entry.latency_ms = millis(self.started.elapsed());
        self.entry.request_bytes = self.received.load(Ordering::Relaxed);
        self.entry.response_bytes = sent;
        self.entry.complete = complete;
        self.log.write(&self.entry);
    }
}

/// The answer's body, passed through frame by frame.
pub struct Logged {
    inner: Body,
    pending: Option<Pending>,
    sent: u64,
    /// The answer broke off with an error: never complete.
    errored: bool,
}

impl Logged {
    pub fn new(inner: Body, pending: Pending) -> Self {
        Self {
            inner,
            pending: Some(pending),
            sent: 0,
            errored: false,
        }
    }
}

impl http_body::Body for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.sent += data.len() as u64;
                }
            }
            Poll::Ready(None) => {
                if let Some(pending) = self.pending.take() {
                    pending.write(self.sent, true);
                }
            }
            // The answer broke off: written as incomplete when dropped.
            Poll::Ready(Some(Err(_))) => self.errored = true,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            // A whole body hyper never polled to its end (it saw
            // `is_end_stream`) is complete; any other was cut short.
            let ended = !self.errored && http_body::Body::is_end_stream(&self.inner);
            pending.write(self.sent, ended);
        }
    }
}
