//! The buffer layer's future: reads the body, then calls the inner service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::request::Parts;
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::BufferedBody;
use super::read::{ReadBody, ReadError};
use crate::error::{BodyTooLarge, BodyUnreadable, BoxError};
use crate::redact::Escaped;

pin_project! {
    /// The response future of [`BufferBody`](super::BufferBody): reads the
    /// body, waits for the inner service to be ready, calls it.
    pub struct ResponseFuture<B, S>
    where
        B: Body,
        B::Error: Into<BoxError>,
        S: Service<http::Request<BufferedBody>>,
    {
        #[pin]
        state: State<B, S>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<B, S>
    where
        B: Body,
        B::Error: Into<BoxError>,
        S: Service<http::Request<BufferedBody>>,
    {
        Reading {
            #[pin]
            read: ReadBody<B>,
            parts: Option<Parts>,
            inner: Option<S>,
            max_bytes: usize,
        },
        Ready {
            inner: S,
            req: Option<http::Request<BufferedBody>>,
        },
        Called {
            #[pin]
            future: S::Future,
        },
        Failed {
            error: Option<BoxError>,
        },
    }
}

impl<B, S> ResponseFuture<B, S>
where
    B: Body,
    B::Error: Into<BoxError>,
    S: Service<http::Request<BufferedBody>>,
{
    pub(crate) fn reading(read: ReadBody<B>, parts: Parts, inner: S, max_bytes: usize) -> Self {
        Self {
            state: State::Reading {
                read,
                parts: Some(parts),
                inner: Some(inner),
                max_bytes,
            },
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<B, S> Future for ResponseFuture<B, S>
where
    B: Body,
    B::Error: Into<BoxError>,
    S: Service<http::Request<BufferedBody>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().state.project() {
                StateProj::Reading {
                    read,
                    parts,
                    inner,
                    max_bytes,
                } => {
                    let read = ready!(read.poll(cx));
                    match (read, parts.take(), inner.take()) {
                        (Ok(bytes), Some(parts), Some(inner)) => {
                            let body = BufferedBody::new(bytes);
                            State::Ready {
                                inner,
                                req: Some(http::Request::from_parts(parts, body)),
                            }
                        }
                        (Err(error), _, _) => State::Failed {
                            error: Some(refusal(error, *max_bytes)),
                        },
                        _ => State::Failed { error: None },
                    }
                }
                StateProj::Ready { inner, req } => {
                    if let Err(error) = ready!(inner.poll_ready(cx)) {
                        return Poll::Ready(Err(error.into()));
                    }
                    match req.take() {
                        Some(req) => State::Called {
                            future: inner.call(req),
                        },
                        None => State::Failed { error: None },
                    }
                }
                StateProj::Called { future } => {
                    return future.poll(cx).map_err(Into::into);
                }
                StateProj::Failed { error } => {
                    let error = error
                        .take()
                        .unwrap_or_else(|| "buffer future polled after completion".into());
                    return Poll::Ready(Err(error));
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

/// The error for a body that could not be read whole: over the limit, or
/// broken off.
fn refusal(error: ReadError, max_bytes: usize) -> BoxError {
    let error = match error {
        ReadError::TooLarge => {
            tracing::debug!(max_bytes, "buffer: body longer than the limit");
            return Box::new(BodyTooLarge::new(max_bytes));
        }
        ReadError::Body(error) => error,
    };
    // The transport's words, escaped: never the body itself.
    tracing::debug!(error = %Escaped(&error.to_string()), "buffer: body could not be read");
    Box::new(BodyUnreadable::new())
}

impl<B, S> fmt::Debug for ResponseFuture<B, S>
where
    B: Body,
    B::Error: Into<BoxError>,
    S: Service<http::Request<BufferedBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Reading { .. } => "reading",
            State::Ready { .. } => "ready",
            State::Called { .. } => "called",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
