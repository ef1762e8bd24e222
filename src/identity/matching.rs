//! Finding the first rule that matches a request, without trying every rule:
//! rules are indexed by their exact host and by their `*.suffix`; only the
//! rules without a host condition are tried on every request. A layer with
//! only a few rules (most have one or two) tries them in order instead,
//! which costs less than normalizing the host and probing the index.

use std::borrow::Cow;
use std::fmt;

use foldhash::HashMap;

use super::compile::{Compiled, HostMatch};
use crate::parts::RequestParts;

/// Up to this many rules, [`RuleSet::find`] tries the rules in order,
/// comparing hosts without normalizing them: a rule that does not match
/// costs a length compare or two, less than hashing the host.
const IN_ORDER_RULES: usize = 8;

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
    #[inline]
    pub(super) fn find<R: RequestParts + ?Sized>(&self, req: &R) -> Option<usize> {
        if self.rules.len() <= IN_ORDER_RULES {
            self.find_in_order(req)
        } else {
            self.find_indexed(req)
        }
    }

    /// [`find`](Self::find) by trying every rule in order.
    fn find_in_order<R: RequestParts + ?Sized>(&self, req: &R) -> Option<usize> {
        // Read once, when the first rule with a host or URL condition asks.
        let mut host: Option<Option<&str>> = None;
        let mut url: Option<String> = None;
        for (i, rule) in self.rules.iter().enumerate() {
            let host_matches = match &rule.host {
                HostMatch::Any => true,
                HostMatch::Exact(want) => {
                    let host = *host.get_or_insert_with(|| req.host().map(without_root));
                    host.is_some_and(|host| same_host(host, want))
                }
                HostMatch::Suffix(suffix) => {
                    let host = *host.get_or_insert_with(|| req.host().map(without_root));
                    host.is_some_and(|host| under_suffix(host, suffix))
                }
            };
            if host_matches
                && rule.path.as_ref().is_none_or(|p| p.matches(req.path()))
                && rule
                    .url_contains
                    .as_deref()
                    .is_none_or(|needle| url.get_or_insert_with(|| req.url()).contains(needle))
            {
                return Some(i);
            }
        }
        None
    }

    /// [`find`](Self::find) through the host index.
    fn find_indexed<R: RequestParts + ?Sized>(&self, req: &R) -> Option<usize> {
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
                    // A leading dot leaves no label before the suffix: no
                    // subdomain of it.
                    if i == 0 || self.suffix_lengths & length_bit(left) == 0 {
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

/// `host` without the trailing dot of a fully qualified name.
#[inline]
fn without_root(host: &str) -> &str {
    host.strip_suffix('.').unwrap_or(host)
}

/// Whether `host` (no trailing dot) is `want` (lowercase), as
/// [`normalize`] and the index compare them.
#[inline]
fn same_host(host: &str, want: &str) -> bool {
    // Hosts are almost always lowercase already: the plain compare first.
    host.len() == want.len()
        && (same_bytes(host.as_bytes(), want.as_bytes()) || host.eq_ignore_ascii_case(want))
}

/// `a == b`. Up to 16 bytes (most hosts, every usual path prefix) it is two
/// compares of overlapping words, in line: `==` calls `memcmp`, whose call
/// costs more than the compare itself on strings this short (about 18
/// instructions a call, `benches/identity.rs`).
#[inline]
pub(super) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => word::<4>(a, 0) == word::<4>(b, 0) && word::<4>(a, n - 4) == word::<4>(b, n - 4),
        8..=16 => word::<8>(a, 0) == word::<8>(b, 0) && word::<8>(a, n - 8) == word::<8>(b, n - 8),
        _ => a == b,
    }
}

/// The `N` bytes of `s` from `at` (`None` past its end, which the callers'
/// lengths rule out: two `None`s would compare equal).
#[inline]
fn word<const N: usize>(s: &[u8], at: usize) -> Option<[u8; N]> {
    let word = s.get(at..).and_then(|s| s.first_chunk::<N>()).copied();
    debug_assert!(word.is_some(), "a word past the end of {} bytes", s.len());
    word
}

/// Whether `host` (no trailing dot) is a subdomain of `suffix`
/// (lowercase): a non-empty part, a dot, then the suffix, as the index
/// looks suffixes up.
#[inline]
fn under_suffix(host: &str, suffix: &str) -> bool {
    let Some(dot) = host.len().checked_sub(suffix.len() + 1) else {
        return false;
    };
    // `dot` is a byte index; the byte there is checked before the slice.
    dot > 0 && host.as_bytes()[dot] == b'.' && same_host(&host[dot + 1..], suffix)
}

/// The host as the index keys it: lowercase, without a trailing dot.
fn normalize(host: &str) -> Cow<'_, str> {
    let host = without_root(host);
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

#[cfg(test)]
mod tests {
    use super::super::compile::compile;
    use super::super::rule::Rule;
    use super::*;
    use proptest::prelude::*;

    /// A host from a few labels, some uppercase, so that hosts, suffixes
    /// and requests often overlap.
    fn host() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(vec!["a", "B", "ex", ""]), 1..4)
            .prop_map(|labels| labels.join("."))
    }

    /// A rule: any host, an exact host or a `*.suffix`; a path prefix or none.
    fn rule() -> impl Strategy<Value = Rule> {
        (0..3u8, host(), any::<bool>()).prop_map(|(kind, host, path)| {
            let rule = match kind {
                0 => Rule::new(),
                1 => Rule::new().host(host),
                _ => Rule::new().host(format!("*.{host}")),
            };
            let rule = if path { rule.path_prefix("/v1/") } else { rule };
            rule.user_agent("test")
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The word-wise compare answers as `==` at every length, on
        /// strings that differ in at most a byte or two.
        #[test]
        fn same_bytes_is_equality(
            a in prop::collection::vec(0u8..3, 0..40),
            flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3), 0..3),
            longer in any::<bool>(),
        ) {
            let mut b = a.clone();
            for (at, byte) in flips {
                if !b.is_empty() {
                    let i = at.index(b.len());
                    b[i] = byte;
                }
            }
            if longer {
                b.push(0);
            }
            prop_assert_eq!(same_bytes(&a, &b), a == b);
        }

        /// A path prefix matches as `str::starts_with` does.
        #[test]
        fn a_path_prefix_matches_as_starts_with(
            path in "[/ab]{0,24}",
            cut in 0..30usize,
            tail in "[/ab]?",
            other in "[/ab]{0,20}",
            own in any::<bool>(),
        ) {
            // Mostly the path's own start, cut anywhere, sometimes with a
            // byte more; else any other string.
            let prefix = if own {
                format!("{}{tail}", &path[..cut.min(path.len())])
            } else {
                other
            };
            let rule = super::super::compile::PathMatch::Prefix(prefix.clone().into());
            prop_assert_eq!(rule.matches(&path), path.starts_with(&prefix));
        }

        /// Trying the rules in order finds the rule the index finds.
        #[test]
        fn in_order_and_indexed_agree(
            rules in prop::collection::vec(rule(), 0..12),
            host in host(),
            root in any::<bool>(),
            path in prop::sample::select(vec!["/v1/chat", "/v2/", "/"]),
        ) {
            let compiled: Vec<Compiled> = rules
                .iter()
                .enumerate()
                .filter_map(|(i, rule)| compile(i, rule).ok())
                .collect();
            let set = RuleSet::new(compiled);
            let dot = if root { "." } else { "" };
            let Ok(req) = http::Request::get(format!("http://{host}{dot}{path}")).body(()) else {
                return Ok(());
            };
            prop_assert_eq!(set.find_in_order(&req), set.find_indexed(&req));
        }
    }

    #[test]
    fn hosts_compare_as_the_index_does() {
        assert!(same_host("API.example.com", "api.example.com"));
        assert!(!same_host("api.example.co", "api.example.com"));
        assert!(under_suffix("eu.API.example.com", "api.example.com"));
        assert!(!under_suffix("api.example.com", "api.example.com"));
        assert!(!under_suffix(".api.example.com", "api.example.com"));
        assert!(!under_suffix("euapi.example.com", "api.example.com"));
        assert!(!under_suffix("", ""));
        assert_eq!(without_root("example.com."), "example.com");
    }
}
