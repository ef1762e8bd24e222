//! Identity URL rules against a reference written from their docs: a rule
//! matches when every condition it gives holds: the host exactly (case and
//! a trailing dot aside, no port), or `*.suffix` for any subdomain at any
//! depth but not the suffix itself, `*` for any host; the path (without
//! the query) starting with a prefix byte for byte, or matching a glob (`*`
//! any run, `/` included, `?` one character); the whole URL containing a
//! substring. The first matching rule applies. Building is deterministic
//! and a secret header value never shows in `Debug`.
//!
//! Input: lines; the first is the request URL (an optional `Host` header
//! after a tab), each other is a rule: host, path, url_contains, split by
//! tabs, the path a prefix when it starts with `/`, else a glob after its
//! first character (so globs may start with `*`).
//!
//! Shared by the fuzz target and `tests/fuzz_corpora.rs` (by `#[path]`).

// Each check stands alone (a fuzz target includes just one), so the
// replay test, which includes them all, loads this twice.
#[allow(clippy::duplicate_mod)]
#[path = "reference_glob.rs"]
mod reference_glob;

use reference_glob::glob;
use tower_throttle::identity::{IdentityHeaderLayer, Rule};

const SECRET: &str = "sk-fuzz-0000-secret";

#[derive(Debug, Default)]
struct Spec {
    host: Option<String>,
    prefix: Option<String>,
    glob: Option<String>,
    contains: Option<String>,
}

/// The request host as rules see it: lowercase, no trailing dot.
fn norm(host: &str) -> String {
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

impl Spec {
    fn matches(&self, host: Option<&str>, path: &str, url: &str) -> bool {
        let host_ok = match self.host.as_deref() {
            None | Some("*") => true,
            Some(rule) => host.is_some_and(|h| {
                let h = norm(h);
                match rule.strip_prefix("*.") {
                    Some(suffix) => {
                        let suffix = norm(suffix);
                        h.len() > suffix.len() + 1
                            && h.ends_with(&suffix)
                            && h.as_bytes()[h.len() - suffix.len() - 1] == b'.'
                    }
                    None => h == norm(rule),
                }
            }),
        };
        let path_ok = match (&self.prefix, &self.glob) {
            (Some(prefix), _) => path.as_bytes().starts_with(prefix.as_bytes()),
            (_, Some(g)) => glob(
                &g.chars().collect::<Vec<_>>(),
                &path.chars().collect::<Vec<_>>(),
            ),
            _ => true,
        };
        let url_ok = self.contains.as_deref().is_none_or(|c| url.contains(c));
        host_ok && path_ok && url_ok
    }

    fn rule(&self, i: usize) -> Rule {
        let mut rule = Rule::named(format!("r{i}")).header("x-api-key", SECRET);
        if let Some(h) = &self.host {
            rule = rule.host(h.clone());
        }
        if let Some(p) = &self.prefix {
            rule = rule.path_prefix(p.clone());
        }
        if let Some(g) = &self.glob {
            rule = rule.path_glob(g.clone());
        }
        if let Some(c) = &self.contains {
            rule = rule.url_contains(c.clone());
        }
        rule
    }
}

fn some(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// Decode `data` into rules and a request, and check which rule applies.
pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let (target, host_header) = {
        let first = lines.next().unwrap_or_default();
        match first.split_once('\t') {
            Some((url, host)) => (url, Some(host)),
            None => (first, None),
        }
    };
    let specs: Vec<Spec> = lines
        .take(12)
        .map(|line| {
            let mut fields = line.split('\t');
            let host = fields.next().and_then(some);
            let path = fields.next().unwrap_or_default();
            let contains = fields.next().and_then(some);
            let (prefix, glob) = match path.chars().next() {
                None => (None, None),
                Some('/') => (some(path), None),
                Some(c) => (None, some(&path[c.len_utf8()..])),
            };
            Spec {
                host,
                prefix,
                glob,
                contains,
            }
        })
        .collect();
    let rules: Vec<Rule> = specs.iter().enumerate().map(|(i, s)| s.rule(i)).collect();
    let built = IdentityHeaderLayer::new(rules.clone());
    assert_eq!(
        built.as_ref().err(),
        IdentityHeaderLayer::new(rules).as_ref().err(),
        "building is deterministic"
    );
    let layer = match built {
        Ok(layer) => layer,
        Err(e) => {
            assert!(!e.to_string().contains(SECRET), "an error shows a secret");
            return;
        }
    };
    assert!(
        !format!("{layer:?}").contains(SECRET),
        "Debug shows a secret"
    );
    let Ok(uri) = target.parse::<http::Uri>() else {
        return;
    };
    let mut req = http::Request::builder().uri(uri);
    if let Some(host) = host_header {
        req = req.header(http::header::HOST, host);
    }
    let Ok(req) = req.body(()) else {
        return;
    };
    // The host as a request has it: the URI's authority, else `Host`, without
    // user info or port (brackets of an IPv6 literal kept).
    let host: Option<String> = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| {
            req.headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
        })
        .map(|a| {
            let a = a.rsplit_once('@').map_or(a.as_str(), |(_, h)| h).to_owned();
            if a.starts_with('[') {
                a.find(']').map_or(a.clone(), |i| a[..=i].to_owned())
            } else {
                a.split(':').next().unwrap_or_default().to_owned()
            }
        });
    let url = req.uri().to_string();
    let expected = specs
        .iter()
        .position(|s| s.matches(host.as_deref(), req.uri().path(), &url));
    assert_eq!(
        layer.matching_rule(&req),
        expected,
        "request {url:?} (host {host:?}) under {specs:?}"
    );
}
