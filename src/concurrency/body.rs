//! `ConcurrencyBody`: a response body that holds its permit until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::permits::Permit;

pin_project! {
    /// A response body that holds its request's concurrency [`Permit`] until
    /// the body has been read to its end, has failed, or is dropped.
    ///
    /// A streamed answer (server-sent events from an LLM) can take minutes
    /// after its headers arrived; the request is in flight for all of that
    /// time, so the permit stays taken. Frames, trailers and size hints pass
    /// through unchanged.
    pub struct ConcurrencyBody<B> {
        #[pin]
        inner: B,
        permit: Option<Permit>,
    }
}

impl<B> ConcurrencyBody<B> {
    /// `inner`, holding `permit` (none: nothing to give back).
    pub fn new(inner: B, permit: Option<Permit>) -> Self {
        Self { inner, permit }
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The wrapped body, mutably.
    pub fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// The wrapped body, pinned.
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut B> {
        self.project().inner
    }

    /// Whether this body still holds its permit.
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }
}

impl<B: Body> Body for ConcurrencyBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        let done = match &frame {
            // The end, or a failure after which the body yields nothing more.
            None | Some(Err(_)) => true,
            // The last frame: a reader that trusts `is_end_stream` stops here.
            Some(Ok(_)) => this.inner.is_end_stream(),
        };
        if done {
            this.permit.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: Default> Default for ConcurrencyBody<B> {
    fn default() -> Self {
        Self::new(B::default(), None)
    }
}

impl<B: fmt::Debug> fmt::Debug for ConcurrencyBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyBody")
            .field("inner", &self.inner)
            .field("holds_permit", &self.permit.is_some())
            .finish()
    }
}
