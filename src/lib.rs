//! Composable [tower] layers that keep a program inside the limits of the
//! APIs it calls and the clients it serves.
//!
//! - [`rate_limit::RateLimitLayer`]: keyed admission by token bucket, sliding
//!   window, fixed window or budget per turn; refuse at once, or wait in
//!   strict FIFO order; rules, several quotas per key, dry run, live retune
//!   and stats through a handle.
//! - [`ConcurrencyLayer`](concurrency::ConcurrencyLayer): at most N requests
//!   in flight per key, the rest in a strict FIFO queue; a streamed response
//!   holds its permit until its body ends or is dropped.
//! - [`Backoff429Layer`](backoff::Backoff429Layer): after an upstream 429, a
//!   per-route cooldown as long as `Retry-After` or the provider's reset
//!   headers say (else exponential), refusing or holding that route's
//!   requests until it ends; plus a retry policy reading the same headers.
//! - [`IdentityHeaderLayer`](identity::IdentityHeaderLayer): gives selected
//!   outbound requests a chosen identity (`User-Agent`, ULID request and
//!   session ids, static headers) by rules matched on the URL.
//! - [`buffer::BufferBodyLayer`]: for servers, reads request bodies into
//!   memory (up to a limit) so that layers can key them by a JSON field.
//! - [`respond::ThrottleResponseLayer`]: for servers, refusals become 429 or
//!   503 responses with `Retry-After` and the rate-limit headers.
//! - [`config::StackConfig`]: one TOML file for a whole stack.
//!
//! Every layer works on `http::Request<B>` and, with the `reqwest` feature, on
//! `reqwest::Request`, through the traits in [`parts`]. Cloned services share
//! one state, so a limit holds across every clone and task. Errors are typed
//! and found again by downcasting [`BoxError`].
//!
//! ```
//! use tower_throttle::key::GlobalKey;
//! use tower_throttle::rate_limit::{Quota, RateLimitLayer};
//!
//! let layer = RateLimitLayer::new(Quota::per_second(10)?, GlobalKey);
//! # let _ = layer;
//! # Ok::<(), tower_throttle::error::ConfigError>(())
//! ```
//!
//! # Conventions
//!
//! - **Constructors.** `new` takes what the type cannot do without and
//!   returns `Self` when no argument can be wrong
//!   ([`RateLimitLayer::new`](rate_limit::RateLimitLayer::new): a
//!   [`Quota`] is checked when it is made), and
//!   `Result<Self, ConfigError>` when one can
//!   ([`ConcurrencyLayer::new`](concurrency::ConcurrencyLayer::new) refuses
//!   zero permits, [`IdentityHeaderLayer::new`](identity::IdentityHeaderLayer::new)
//!   rules that do not compile, `RedisStore::new` a URL that is not one).
//! - **Settings** of a layer, a retry policy or the store are
//!   `with_<setting>(value)`, a switch taking its `bool` (`with_on_503(true)`,
//!   `with_release_at_headers(true)`, `with_dry_run(true)`); each returns
//!   `Result` only when its value can be wrong. Key extractors, identity
//!   rules and quotas read as phrases instead (`HeaderKey::new(..).show_raw()`,
//!   `Rule::new().host(..)`, `Quota::per_minute(60)?.sliding_window()`).
//! - **Live changes** go through a layer's handle: `set_*` one value, and
//!   `apply` what a configuration file gives
//!   ([`RateLimitHandle::apply`](rate_limit::RateLimitHandle::apply) takes
//!   checked [`Limits`](rate_limit::Limits),
//!   [`BackoffHandle::apply`](backoff::BackoffHandle::apply) a `[backoff]`
//!   section).
//! - **Errors** are typed and reachable by downcasting a [`BoxError`]; a bad
//!   setting is a [`ConfigError`](error::ConfigError) naming its field.
//!
//! [tower]: https://docs.rs/tower

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// First: a `macro_rules!` macro can be used only below its declaration.
#[macro_use]
mod macros;

pub mod backoff;
pub mod buffer;
pub mod clock;
pub mod concurrency;
pub mod config;
pub mod error;
pub mod fair;
mod home;
pub mod identity;
pub mod key;
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_api;
pub mod parts;
pub mod rate_limit;
pub mod redact;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(not(feature = "redis"))]
#[path = "no_redis.rs"]
mod redis;
pub mod respond;
pub mod stats;
mod store;
mod sync;

pub use error::BoxError;

// The README's examples are compiled and run by `.ci/readme-snippets`, each
// with exactly the features it names: as doctests they would all see the
// features of one `cargo test` run.
pub use rate_limit::{Quota, RateLimitLayer};
