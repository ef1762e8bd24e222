//! The limiter's Redis side in a build without the `redis` feature: no
//! limiter can keep its state there, so each of these finds no store and
//! leaves the decision to the process. `remote.rs` is the real one; the two
//! keep the same names, so the limiter's code names the store only here.

use std::sync::Arc;
use std::time::Duration;

use super::{Limiter, Ticket};
use crate::error::ConfigError;
use crate::key::KeyHash;
use crate::rate_limit::quota::Quota;
use crate::rate_limit::rule::Rule;
use crate::redis::RedisStore;

/// Every quota: there is no store to refuse one.
pub(crate) fn check_quotas(_default: &[Quota], _rules: &[Rule]) -> Result<(), ConfigError> {
    Ok(())
}

/// A link to Redis, which this build cannot have.
pub(crate) enum Remote {}

/// A booking in Redis, which this build cannot make.
#[derive(Debug)]
pub(crate) enum RemoteGrant {}

impl Limiter {
    pub(crate) fn with_remote(self, store: &RedisStore) -> Self {
        match *store {}
    }

    /// None: this build keeps every limiter's state in process.
    #[inline]
    pub(crate) fn remote(&self) -> Option<&Arc<Remote>> {
        self.remote.as_ref()
    }

    pub(crate) fn forget_remote<P: AsRef<str>>(&self, _parts: &[P], _turns_only: bool) {}

    pub(crate) fn forget_remote_refusals(&self) {}

    pub(crate) fn check_remote_quotas(
        &self,
        _default: &[Quota],
        _rules: &[Rule],
    ) -> Result<(), ConfigError> {
        Ok(())
    }

    pub(crate) fn peek_remote(&self, _key: KeyHash) -> Option<Duration> {
        None
    }

    pub(crate) fn give_back_remote(&self, ticket: &Ticket, _cancel: bool) -> bool {
        match ticket.remote.as_deref() {
            Some(grant) => match *grant {},
            None => false,
        }
    }

    pub(crate) fn settle_remote(&self, ticket: &Ticket, _actual: u32) -> bool {
        match ticket.remote.as_deref() {
            Some(grant) => match *grant {},
            None => false,
        }
    }
}
