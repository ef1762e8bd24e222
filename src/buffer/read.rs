//! Reading a request body into one buffer, up to a limit.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http_body::Body;
use pin_project_lite::pin_project;

use crate::error::BoxError;

pin_project! {
    /// A body read whole into one buffer, at most `max` bytes. Each data
    /// frame is copied in as it comes, so a body sent a byte at a time costs
    /// the bytes it sends: http-body-util's `Collect` keeps every frame (and
    /// with it the transport's read buffer each one points into) until the
    /// end. Trailers are not kept.
    pub(crate) struct ReadBody<B> {
        #[pin]
        body: B,
        buf: BytesMut,
        max: usize,
    }
}

/// Why a body was not read whole.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// It is longer than the limit.
    TooLarge,
    /// The body failed (the connection broke off, a timeout, bad framing).
    Body(BoxError),
}

impl<B> ReadBody<B> {
    pub(crate) fn new(body: B, max: usize) -> Self {
        Self {
            body,
            buf: BytesMut::new(),
            max,
        }
    }
}

impl<B> Future for ReadBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Output = Result<Bytes, ReadError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let Some(frame) = ready!(this.body.as_mut().poll_frame(cx)) else {
                return Poll::Ready(Ok(std::mem::take(this.buf).freeze()));
            };
            let frame = frame.map_err(|e| ReadError::Body(e.into()))?;
            if let Ok(mut data) = frame.into_data() {
                if data.remaining() > *this.max - this.buf.len() {
                    return Poll::Ready(Err(ReadError::TooLarge));
                }
                while data.has_remaining() {
                    let chunk = data.chunk();
                    this.buf.extend_from_slice(chunk);
                    let n = chunk.len();
                    data.advance(n);
                }
            }
        }
    }
}
