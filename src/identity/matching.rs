//! Finding the first rule that matches a request, without trying every rule:
//! rules are indexed by their exact host and by their `*.suffix`; only the
//! rules without a host condition are tried on every request.

use std::borrow::Cow;
use std::fmt;

use foldhash::HashMap;

use super::compile::{Compiled, HostMatch};
use crate::parts::RequestParts;

/// Every rule of a layer, in order, and the index over them.
#[derive(Clone)]
pub(super) struct RuleSet {
    rules: Box<[Compiled]>,
    /// Rules for one exact host, by host; each list in rule order.
    exact: HashMap<Box<str>, Box<[u32]>>,
    /// Rules for `*.suffix`, by suffix; each list in rule order.
    suffix: HashMap<Box<str>, Box<[u32]>>,
    /// Bit `n` is set when some suffix has `n` labels (bit 63: 63 or more),
    /// so that a request host is looked up only under those of its own
    /// suffixes that have a length some rule has.
    suffix_lengths: u64,
    /// Rules without a host condition, in rule order.
    any_host: Box<[u32]>,
}

impl RuleSet {
    /// Index `rules`. At most `u32::MAX` rules.
    pub(super) fn new(rules: Vec<Compiled>) -> Self {
        let mut exact: HashMap<Box<str>, Vec<u32>> = HashMap::default();
        let mut suffix: HashMap<Box<str>, Vec<u32>> = HashMap::default();
        let mut any_host = Vec::new();
        for (i, rule) in (0u32..).zip(&rules) {
            match &rule.host {
                HostMatch::Any => any_host.push(i),
                HostMatch::Exact(host) => exact.entry(host.clone()).or_default().push(i),
                HostMatch::Suffix(sfx) => suffix.entry(sfx.clone()).or_default().push(i),
            }
        }
        let suffix_lengths = suffix
            .keys()
            .fold(0, |bits, s| bits | length_bit(labels(s)));
        let boxed = |m: HashMap<Box<str>, Vec<u32>>| {
            m.into_iter()
                .map(|(k, v)| (k, v.into_boxed_slice()))
                .collect()
        };
        Self {
            rules: rules.into_boxed_slice(),
            exact: boxed(exact),
            suffix: boxed(suffix),
            suffix_lengths,
            any_host: any_host.into_boxed_slice(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.rules.len()
    }

    pub(super) fn get(&self, index: usize) -> Option<&Compiled> {
        self.rules.get(index)
    }

    /// The index of the first rule, in rule order, that matches `req`.
    pub(super) fn find<R: RequestParts + ?Sized>(&self, req: &R) -> Option<usize> {
        let mut search = Search {
            rules: &self.rules,
            req,
            url: None,
            best: None,
        };
        // Reading the host costs more than the rest of a miss: only when a
        // rule has a host.
        let by_host = !self.exact.is_empty() || !self.suffix.is_empty();
        if let Some(host) = by_host.then(|| req.host()).flatten() {
            let host = normalize(host);
            if let Some(list) = self.exact.get(&*host) {
                search.scan(list);
            }
            if self.suffix_lengths != 0 {
                // Each proper suffix after a dot, longest first.
                let mut left = labels(&host);
                for (i, _) in host.bytes().enumerate().filter(|&(_, b)| b == b'.') {
                    left -= 1;
                    if self.suffix_lengths & length_bit(left) == 0 {
                        continue;
                    }
                    if let Some(list) = self.suffix.get(&host[i + 1..]) {
                        search.scan(list);
                    }
                }
            }
        }
        search.scan(&self.any_host);
        search.best.map(|i| i as usize)
    }
}

/// How many dot-separated labels `host` has.
fn labels(host: &str) -> usize {
    1 + host.bytes().filter(|&b| b == b'.').count()
}

/// The bit of `suffix_lengths` for a suffix of `labels` labels.
fn length_bit(labels: usize) -> u64 {
    1 << labels.min(63)
}

/// The host as the index keys it: lowercase, without a trailing dot.
fn normalize(host: &str) -> Cow<'_, str> {
    let host = match host.as_bytes().last() {
        Some(b'.') => &host[..host.len() - 1],
        _ => host,
    };
    // Without branching per byte: hosts are short, and almost always
    // lowercase already.
    let upper = host
        .bytes()
        .fold(false, |upper, b| upper | b.is_ascii_uppercase());
    if upper {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

/// One request's search: the best (lowest) matching rule so far, and the
/// URL text, made once if a rule needs it.
struct Search<'a, R: ?Sized> {
    rules: &'a [Compiled],
    req: &'a R,
    url: Option<String>,
    best: Option<u32>,
}

impl<R: RequestParts + ?Sized> Search<'_, R> {
    /// Try the rules of `list` (in rule order) that come before the best
    /// match so far; the first that matches becomes the best.
    fn scan(&mut self, list: &[u32]) {
        for &i in list {
            if self.best.is_some_and(|best| i >= best) {
                return;
            }
            if self.rest_matches(i) {
                self.best = Some(i);
                return;
            }
        }
    }

    /// Whether rule `i`'s conditions other than the host hold.
    fn rest_matches(&mut self, i: u32) -> bool {
        let Some(rule) = self.rules.get(i as usize) else {
            return false;
        };
        if let Some(path) = &rule.path {
            if !path.matches(self.req.path()) {
                return false;
            }
        }
        if let Some(needle) = &rule.url_contains {
            let url = self.url.get_or_insert_with(|| self.req.url());
            if !url.contains(&**needle) {
                return false;
            }
        }
        true
    }
}

impl fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.rules.iter()).finish()
    }
}
