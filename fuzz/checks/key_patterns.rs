//! Key patterns and rule globs (`KeyPattern`, `Rule::find`) against a
//! reference written from their docs: a pattern part is refused when empty
//! or holding a control character; `*` alone matches anything, a part with
//! `*` (any run) or `?` (one character) is a glob, any other part matches
//! only its own text; a text pattern matches the parts joined by `/`; a
//! literal part matches only its own text. Of several matching rules the
//! most specific wins (more exact parts, then more glob parts, then more
//! literal characters in globs), ties to the rule declared first.
//!
//! Input: lines; the first is the key (parts split by tabs), each other is
//! a rule: a kind byte (`p`arts, `t`ext, `l`iteral) and its patterns split
//! by tabs.
//!
//! Shared by the fuzz target and `tests/fuzz_corpora.rs` (by `#[path]`).

// Each check stands alone (a fuzz target includes just one), so the
// replay test, which includes them all, loads this twice.
#[allow(clippy::duplicate_mod)]
#[path = "reference_glob.rs"]
mod reference_glob;

use reference_glob::glob;
use tower_throttle::rate_limit::{KeyPattern, Rule};

/// The reference: what a rule is made of.
enum Spec {
    Parts(Vec<String>),
    Text(String),
    Literal(Vec<String>),
}

fn part_valid(p: &str) -> bool {
    !p.is_empty() && !p.chars().any(char::is_control)
}

fn part_matches(pattern: &str, part: &str) -> bool {
    if pattern.chars().all(|c| c == '*') {
        true
    } else if pattern.contains(['*', '?']) {
        let p: Vec<char> = pattern.chars().collect();
        let t: Vec<char> = part.chars().collect();
        glob(&p, &t)
    } else {
        pattern == part
    }
}

impl Spec {
    fn valid(&self) -> bool {
        match self {
            Spec::Parts(parts) => !parts.is_empty() && parts.iter().all(|p| part_valid(p)),
            Spec::Text(text) => part_valid(text),
            Spec::Literal(parts) => !parts.is_empty(),
        }
    }

    fn build(&self) -> Result<KeyPattern, tower_throttle::error::ConfigError> {
        match self {
            Spec::Parts(parts) => KeyPattern::parts(parts.iter().map(String::as_str)),
            Spec::Text(text) => KeyPattern::text(text),
            Spec::Literal(parts) => KeyPattern::literal(parts.iter().map(String::as_str)),
        }
    }

    fn matches(&self, key: &[String]) -> bool {
        match self {
            Spec::Parts(parts) => {
                parts.len() == key.len() && parts.iter().zip(key).all(|(p, k)| part_matches(p, k))
            }
            Spec::Text(text) => part_matches(text, &key.join("/")),
            Spec::Literal(parts) => parts.as_slice() == key,
        }
    }

    /// (exact parts, glob parts, literal characters in globs).
    fn specificity(&self) -> (usize, usize, usize) {
        let one = |p: &str, literal: bool| -> (usize, usize, usize) {
            if literal || !p.contains(['*', '?']) {
                (1, 0, 0)
            } else if p.chars().all(|c| c == '*') {
                (0, 0, 0)
            } else {
                (0, 1, p.chars().filter(|c| !matches!(c, '*' | '?')).count())
            }
        };
        let sum = |parts: &[String], literal: bool| {
            parts.iter().fold((0, 0, 0), |acc, p| {
                let s = one(p, literal);
                (acc.0 + s.0, acc.1 + s.1, acc.2 + s.2)
            })
        };
        match self {
            Spec::Parts(parts) => sum(parts, false),
            Spec::Text(text) => one(text, false),
            Spec::Literal(parts) => sum(parts, true),
        }
    }
}

/// Decode `data` into a key and rules, and check patterns and `Rule::find`
/// against the reference.
pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let key: Vec<String> = lines
        .next()
        .unwrap_or_default()
        .split('\t')
        .map(str::to_owned)
        .collect();
    let mut specs = Vec::new();
    for line in lines.take(16) {
        let mut chars = line.chars();
        let kind = chars.next();
        let rest: Vec<String> = chars.as_str().split('\t').map(str::to_owned).collect();
        specs.push(match kind {
            Some('t') => Spec::Text(rest.join("\t")),
            Some('l') => Spec::Literal(rest),
            _ => Spec::Parts(rest),
        });
    }
    let mut rules = Vec::new();
    let mut kept = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let built = spec.build();
        assert_eq!(built.is_ok(), spec.valid(), "pattern {i} accepted wrongly");
        let Ok(pattern) = built else {
            continue;
        };
        assert_eq!(
            spec.build().ok().as_ref(),
            Some(&pattern),
            "building is deterministic"
        );
        assert_eq!(
            pattern.matches(&key),
            spec.matches(&key),
            "pattern {pattern:?} on key {key:?}"
        );
        rules.push(Rule::new(format!("r{i}"), pattern));
        kept.push(spec);
    }
    // The most specific matching rule; `max_by_key` keeps the last of equals,
    // so walk backwards to keep the first declared.
    let expected = kept
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, spec)| spec.matches(&key))
        .max_by_key(|(_, spec)| spec.specificity())
        .map(|(i, _)| rules[i].name().to_owned());
    let found = Rule::find(&rules, &key).map(|r| r.name().to_owned());
    assert_eq!(found, expected, "rule for key {key:?} among {rules:?}");
    assert_eq!(
        Rule::find(&rules, &key).map(Rule::name),
        found.as_deref(),
        "finding is deterministic"
    );
}
