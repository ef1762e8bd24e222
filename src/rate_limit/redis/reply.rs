//! What the admission script replied, and a booking Redis holds: settled, charged or given back later.

use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;

use super::{Admission, CHARGE, GIVE_BACK, QuotaArgs};
use crate::redis::{RedisStore, StoreError};

/// What the admission script said.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Refused: the time until every quota would admit, and the quota that
    /// needs the longest.
    Refused { wait: Duration, slowest: usize },
    /// Booked `wait` from now (Redis's now) in every quota.
    Booked {
        wait: Duration,
        left: u32,
        reset: Duration,
        tightest: usize,
        grant: Arc<RemoteGrant>,
    },
}

fn int(value: Option<&Value>) -> Option<u64> {
    match value? {
        Value::Int(n) => u64::try_from(*n).ok(),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

fn text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::Int(n) => Some(n.to_string()),
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

impl Reply {
    pub(super) fn parse(reply: &[Value], admission: Admission) -> Option<Self> {
        // Indices name one of the quotas asked about, or the reply is bad.
        let quotas = admission.quotas.len();
        let index = |n: u64| usize::try_from(n).ok().filter(|&i| i < quotas);
        // A wait no script of ours answers is a bad reply, not a key
        // refused (and remembered as refused) for years.
        let wait = |n: u64| (n <= admission.longest_wait).then(|| Duration::from_micros(n));
        match int(reply.first())? {
            0 => Some(Self::Refused {
                wait: wait(int(reply.get(1))?)?,
                slowest: index(int(reply.get(2))?)?,
            }),
            1 => {
                // The rule marker, the probe and the replaced quotas'
                // states are not the booking's.
                let mut keys = admission.keys;
                keys.truncate(keys.len().saturating_sub(admission.replaced_keys));
                if admission.probed {
                    keys.pop();
                }
                if !keys.is_empty() {
                    keys.remove(0);
                }
                let at = int(reply.get(1))?;
                let now = int(reply.get(2))?;
                // A reply is outside input: a short one is an error, not a panic.
                let marks = reply
                    .get(6..)?
                    .iter()
                    .map(|v| text(Some(v)))
                    .collect::<Option<Vec<_>>>()?;
                if marks.len() != admission.quotas.len() {
                    return None;
                }
                Some(Self::Booked {
                    wait: Duration::from_micros(at.saturating_sub(now)),
                    left: u32::try_from(int(reply.get(3))?).unwrap_or(u32::MAX),
                    reset: wait(int(reply.get(4))?)?,
                    tightest: index(int(reply.get(5))?)?,
                    grant: Arc::new(RemoteGrant {
                        keys,
                        at,
                        quotas: admission.quotas,
                        marks,
                        cost: admission.cost,
                        excess_of: None,
                    }),
                })
            }
            _ => None,
        }
    }
}

/// A booking in Redis: enough to give it back.
#[derive(Debug)]
pub(crate) struct RemoteGrant {
    keys: Vec<String>,
    /// The instant booked, on Redis's clock.
    at: u64,
    quotas: Vec<QuotaArgs>,
    marks: Vec<String>,
    cost: u32,
    /// Only the excess of a settled cost, `cost` units of this whole
    /// charge, goes back.
    excess_of: Option<u32>,
}

impl RemoteGrant {
    /// The part of the booking above `actual`, to give back when the
    /// request's real cost turned out lower (see
    /// [`Settlement`](crate::rate_limit::Settlement)); none when it is not
    /// lower, or when no quota can take it: a quota counting requests has
    /// none (a sliding window's booking is written again at its smaller
    /// cost).
    pub(crate) fn excess_over(&self, actual: u32) -> Option<RemoteGrant> {
        let takes_excess = |q: &QuotaArgs| !q.per_request;
        if actual >= self.cost || !self.quotas.iter().any(takes_excess) {
            return None;
        }
        Some(RemoteGrant {
            keys: self.keys.clone(),
            at: self.at,
            quotas: self.quotas.clone(),
            marks: self.marks.clone(),
            cost: self.cost - actual,
            excess_of: Some(self.cost),
        })
    }

    /// What the booking charged.
    pub(crate) fn cost(&self) -> u32 {
        self.cost
    }

    /// Whether a real cost of `actual` is above this booking's charge, on a
    /// quota that counts cost (see [`charge`](Self::charge)).
    pub(crate) fn falls_short_of(&self, actual: u32) -> bool {
        self.excess_of.is_none() && actual > self.cost && self.quotas.iter().any(|q| !q.per_request)
    }

    /// The arguments give_back.lua and charge.lua share: now, the instant
    /// booked, and per quota its kind, numbers and mark.
    fn push_booking(&self, store: &RedisStore, args: &mut Vec<String>) {
        args.push(store.now_arg());
        args.push(self.at.to_string());
        for (q, mark) in self.quotas.iter().zip(&self.marks) {
            args.push(q.arg_kind());
            args.push(q.a.to_string());
            args.push(q.b.to_string());
            args.push(mark.clone());
        }
    }

    /// Charge `extra` more on this booking, without refusal (a settled
    /// estimate below the real cost). When the call fails the estimate
    /// stands.
    pub(crate) async fn charge(&self, store: &RedisStore, extra: u32) -> Result<(), StoreError> {
        let mut args = Vec::with_capacity(3 + 4 * self.quotas.len());
        args.push(extra.to_string());
        self.push_booking(store, &mut args);
        let _: i64 = store.run("rate limit", &CHARGE, &self.keys, &args).await?;
        Ok(())
    }

    /// Give the booking back (`cancel`: a waiter left before its turn;
    /// else the outcome did not count). When the call fails the capacity
    /// stays spent: the safe side.
    pub(crate) async fn give_back(
        &self,
        store: &RedisStore,
        cancel: bool,
    ) -> Result<(), StoreError> {
        let mut args = Vec::with_capacity(4 + 4 * self.quotas.len());
        // The whole charge goes with an excess: what of it has come back
        // by itself is counted from the whole booking, as in process.
        let mode = match (self.excess_of, cancel) {
            (Some(whole), _) => format!("x{whole}"),
            (None, true) => "c".to_owned(),
            (None, false) => "r".to_owned(),
        };
        args.push(mode);
        args.push(self.cost.to_string());
        self.push_booking(store, &mut args);
        let _: i64 = store
            .run("rate limit", &GIVE_BACK, &self.keys, &args)
            .await?;
        Ok(())
    }
}
