//! `HoldPermit`: how each kind of response carries its concurrency permit.

use super::body::ConcurrencyBody;
use super::permits::Permit;

/// A response that can keep its request's concurrency [`Permit`] for as long
/// as the response is in use.
///
/// The [`ConcurrencyLayer`](super::ConcurrencyLayer) hands each successful
/// response its permit through this trait. Implemented for:
///
/// - `http::Response<B>`: the body is wrapped in a [`ConcurrencyBody`], which
///   holds the permit until the body has been read to its end, has failed,
///   or is dropped;
/// - `reqwest::Response` (feature `reqwest`): the same, through reqwest's own
///   body type, so `text()`, `bytes_stream()` and `chunk()` release the
///   permit when the body ends. The response keeps its status, headers,
///   extensions and URL.
///
/// Implement it for another response type to choose how long its permit
/// lives: keep the permit in the value, or drop it to release at once.
///
/// ```
/// use tower_throttle::concurrency::{HoldPermit, Permit};
///
/// /// A response read in full before it is returned: nothing is in flight
/// /// once it exists.
/// struct Answer(String);
///
/// impl HoldPermit for Answer {
///     type Held = Answer;
///
///     fn hold(self, permit: Option<Permit>) -> Answer {
///         drop(permit);
///         self
///     }
/// }
/// ```
pub trait HoldPermit: Sized {
    /// The response as the caller gets it.
    type Held;

    /// Keep `permit` alive for as long as this response is in use. `None`
    /// when the layer releases permits as soon as the response arrives
    /// ([`with_release_at_headers`](super::ConcurrencyLayer::with_release_at_headers)).
    fn hold(self, permit: Option<Permit>) -> Self::Held;
}

impl<B> HoldPermit for http::Response<B> {
    type Held = http::Response<ConcurrencyBody<B>>;

    #[inline]
    fn hold(self, permit: Option<Permit>) -> Self::Held {
        self.map(|body| ConcurrencyBody::new(body, permit))
    }
}

#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
impl HoldPermit for reqwest::Response {
    type Held = reqwest::Response;

    /// Rebuild the response around a [`ConcurrencyBody`]: two small
    /// allocations and a clone of the URL per response.
    fn hold(self, permit: Option<Permit>) -> Self::Held {
        use reqwest::ResponseBuilderExt;

        let Some(permit) = permit else {
            return self;
        };
        let url = self.url().clone();
        let (mut parts, body) = http::Response::<reqwest::Body>::from(self).into_parts();
        // The conversion drops the URL; a response builder is the only way
        // to put it back where `reqwest::Response::url` looks.
        if let Ok(mut tagged) = http::Response::builder().url(url).body(()) {
            parts
                .extensions
                .extend(std::mem::take(tagged.extensions_mut()));
        }
        let body = reqwest::Body::wrap(ConcurrencyBody::new(body, Some(permit)));
        reqwest::Response::from(http::Response::from_parts(parts, body))
    }
}
