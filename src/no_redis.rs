//! The `redis` module in a build without the `redis` feature: a store type
//! no value can have, so that a layer's "maybe a store" fields and branches
//! read the same in every build and the feature is named where the module
//! is chosen (`lib.rs`), not at each of them.

/// A Redis store, which this build cannot make.
#[derive(Clone, Debug)]
pub(crate) enum RedisStore {}
