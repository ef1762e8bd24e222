//! `BufferedBody`: a request body read whole, which key extractors read without consuming.

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::parts::BodyBytes;

/// A request body read whole into memory by
/// [`BufferBodyLayer`](super::BufferBodyLayer): key extractors such as
/// [`JsonFieldKey`](crate::key::JsonFieldKey) read it without consuming it
/// (it is [`BodyBytes`]), and the inner service still gets a body to read.
///
/// Cloning it shares the bytes, it does not copy them. `Debug` shows the
/// length only: a body can hold a secret.
#[derive(Clone, Default)]
pub struct BufferedBody {
    bytes: Bytes,
    /// Set once the bytes went out as a frame.
    sent: bool,
}

impl BufferedBody {
    /// A body of `bytes`.
    pub fn new(bytes: impl Into<Bytes>) -> Self {
        Self {
            bytes: bytes.into(),
            sent: false,
        }
    }

    /// The whole body, also after it was read as a body.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The bytes, unwrapped.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }
}

impl fmt::Debug for BufferedBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferedBody")
            .field("len", &self.bytes.len())
            .field("sent", &self.sent)
            .finish()
    }
}

impl From<Bytes> for BufferedBody {
    fn from(bytes: Bytes) -> Self {
        Self::new(bytes)
    }
}

impl From<String> for BufferedBody {
    fn from(text: String) -> Self {
        Self::new(text)
    }
}

impl From<Vec<u8>> for BufferedBody {
    fn from(bytes: Vec<u8>) -> Self {
        Self::new(bytes)
    }
}

impl From<&'static str> for BufferedBody {
    fn from(text: &'static str) -> Self {
        Self::new(text)
    }
}

impl BodyBytes for BufferedBody {
    fn body_bytes(&self) -> Option<&[u8]> {
        Some(&self.bytes)
    }
}

impl Body for BufferedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.sent || this.bytes.is_empty() {
            return Poll::Ready(None);
        }
        this.sent = true;
        // A clone shares the memory: the bytes stay readable as `BodyBytes`.
        Poll::Ready(Some(Ok(Frame::data(this.bytes.clone()))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent || self.bytes.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        let left = if self.is_end_stream() {
            0
        } else {
            self.bytes.len() as u64
        };
        SizeHint::with_exact(left)
    }
}
