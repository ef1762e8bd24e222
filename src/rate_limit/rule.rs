//! Per-key rules: which keys get which quotas.

use std::collections::HashMap;
use std::fmt;

use wildmatch::WildMatch;

use super::quota::Quota;
use crate::error::ConfigError;

/// A pattern on one part of a key (or on a key's whole text).
#[derive(Clone)]
enum PartPattern {
    /// Matches this text only.
    Exact(String),
    /// `*` matches any run of characters, `?` any one character.
    Glob(WildMatch, String),
    /// `*` alone: matches anything.
    Any,
}

impl PartPattern {
    fn parse(field: &str, pattern: &str) -> Result<Self, ConfigError> {
        if pattern.is_empty() {
            return Err(ConfigError::new(field, "a pattern cannot be empty"));
        }
        if pattern.chars().any(char::is_control) {
            return Err(ConfigError::new(
                field,
                format!("pattern {pattern:?} contains a control character"),
            ));
        }
        Ok(if pattern.chars().all(|c| c == '*') {
            Self::Any
        } else if pattern.contains(['*', '?']) {
            Self::Glob(WildMatch::new(pattern), pattern.to_owned())
        } else {
            Self::Exact(pattern.to_owned())
        })
    }

    fn matches(&self, part: &str) -> bool {
        match self {
            Self::Exact(text) => text == part,
            Self::Glob(glob, _) => glob.matches(part),
            Self::Any => true,
        }
    }

    fn is_exact(&self) -> bool {
        matches!(self, Self::Exact(_))
    }

    fn text(&self) -> &str {
        match self {
            Self::Exact(text) | Self::Glob(_, text) => text,
            Self::Any => "*",
        }
    }
}

/// Which keys a [`Rule`] applies to: a pattern per key part, or one pattern
/// on the key's whole text (parts joined by `/`).
///
/// In a pattern, `*` matches any run of characters and `?` one character; a
/// pattern of `*` alone matches anything; any other pattern matches only its
/// own text.
///
/// ```
/// use tower_throttle::rate_limit::KeyPattern;
///
/// // A (provider, model) route: provider `opencode`, any `claude-` model.
/// let route = KeyPattern::parts(["opencode", "claude-*"])?;
/// assert!(route.matches(&["opencode", "claude-sonnet-4"]));
/// assert!(!route.matches(&["opencode", "gpt-4o"]));
/// assert!(!route.matches(&["opencode"]));
///
/// let text = KeyPattern::text("10.0.*")?;
/// assert!(text.matches(&["10.0.3.4"]));
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct KeyPattern {
    parts: Vec<PartPattern>,
    /// Match the joined text instead of part by part.
    whole: bool,
}

impl KeyPattern {
    /// One pattern per key part, in order; a key matches when it has as many
    /// parts and each matches.
    pub fn parts<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Result<Self, ConfigError> {
        let parts = patterns
            .into_iter()
            .enumerate()
            .map(|(i, p)| PartPattern::parse(&format!("parts[{i}]"), p))
            .collect::<Result<Vec<_>, _>>()?;
        Self::part_by_part(parts)
    }

    /// Each part matches only its own text, `*` and `?` included: for a key
    /// known in advance (a route whose model name came from a client may
    /// hold a `*` that [`parts`](Self::parts) would read as a wildcard).
    ///
    /// ```
    /// use tower_throttle::rate_limit::KeyPattern;
    ///
    /// let route = KeyPattern::literal(["openai", "gpt-*"])?;
    /// assert!(route.matches(&["openai", "gpt-*"]));
    /// assert!(!route.matches(&["openai", "gpt-4o"]));
    /// # Ok::<(), tower_throttle::error::ConfigError>(())
    /// ```
    pub fn literal<'a>(parts: impl IntoIterator<Item = &'a str>) -> Result<Self, ConfigError> {
        let parts: Vec<PartPattern> = parts
            .into_iter()
            .map(|p| PartPattern::Exact(p.to_owned()))
            .collect();
        Self::part_by_part(parts)
    }

    /// A pattern matching part by part with `parts`, which may not be
    /// empty: what [`parts`](Self::parts) and [`literal`](Self::literal)
    /// both check, so that they refuse alike.
    fn part_by_part(parts: Vec<PartPattern>) -> Result<Self, ConfigError> {
        if parts.is_empty() {
            return Err(ConfigError::new(
                "parts",
                "a pattern needs at least one part",
            ));
        }
        Ok(Self {
            parts,
            whole: false,
        })
    }

    /// One pattern on the key's whole text, its parts joined by `/`.
    pub fn text(pattern: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            parts: vec![PartPattern::parse("key", pattern)?],
            whole: true,
        })
    }

    /// Whether a key with these parts matches.
    pub fn matches<S: AsRef<str>>(&self, parts: &[S]) -> bool {
        if self.whole {
            let text = parts
                .iter()
                .map(AsRef::as_ref)
                .collect::<Vec<_>>()
                .join("/");
            return self.parts[0].matches(&text);
        }
        parts.len() == self.parts.len()
            && self
                .parts
                .iter()
                .zip(parts)
                .all(|(pattern, part)| pattern.matches(part.as_ref()))
    }

    /// Whether some key could match both patterns. Answers yes when unsure
    /// (two globs, or a text pattern against parts), which only ever makes a
    /// merge tighter.
    pub(crate) fn may_overlap(&self, other: &KeyPattern) -> bool {
        if self.whole || other.whole {
            return true;
        }
        self.parts.len() == other.parts.len()
            && self
                .parts
                .iter()
                .zip(&other.parts)
                .all(|(a, b)| match (a, b) {
                    (PartPattern::Exact(x), PartPattern::Exact(y)) => x == y,
                    (PartPattern::Exact(x), p) | (p, PartPattern::Exact(x)) => p.matches(x),
                    _ => true,
                })
    }

    /// How specific the pattern is: exact parts first, then glob parts, then
    /// the literal characters in globs. Higher wins.
    fn specificity(&self) -> (usize, usize, usize) {
        let mut exact = 0;
        let mut globs = 0;
        let mut literal = 0;
        for part in &self.parts {
            match part {
                PartPattern::Exact(_) => exact += 1,
                PartPattern::Glob(_, text) => {
                    globs += 1;
                    literal += text.chars().filter(|c| !matches!(c, '*' | '?')).count();
                }
                PartPattern::Any => {}
            }
        }
        (exact, globs, literal)
    }

    /// The parts' texts when every part is exact.
    fn exact_parts(&self) -> Option<Vec<String>> {
        if self.whole {
            return None;
        }
        self.parts
            .iter()
            .map(|p| match p {
                PartPattern::Exact(text) => Some(text.clone()),
                _ => None,
            })
            .collect()
    }
}

impl fmt::Debug for KeyPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let texts: Vec<_> = self.parts.iter().map(PartPattern::text).collect();
        if self.whole {
            write!(f, "KeyPattern::text({:?})", texts[0])
        } else {
            write!(f, "KeyPattern::parts({texts:?})")
        }
    }
}

impl PartialEq for KeyPattern {
    fn eq(&self, other: &Self) -> bool {
        self.whole == other.whole
            && self.parts.len() == other.parts.len()
            && self
                .parts
                .iter()
                .zip(&other.parts)
                .all(|(a, b)| a.text() == b.text() && a.is_exact() == b.is_exact())
    }
}

/// Quotas for the keys a [`KeyPattern`] matches, in place of the layer's
/// default quotas.
///
/// A rule with no quotas leaves its keys unlimited. When several rules match
/// a key, the most specific wins: the one with more exact parts, then more
/// glob parts, then more literal characters in its globs (so an exact
/// pattern beats a glob, and a glob beats `*`); ties go to the rule declared
/// first.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub(crate) name: String,
    pub(crate) pattern: KeyPattern,
    pub(crate) quotas: Vec<Quota>,
    pub(crate) dry_run: bool,
}

impl Rule {
    /// A rule named `name` (names identify a rule across retunes) for the
    /// keys `pattern` matches, with no quotas yet.
    pub fn new(name: impl Into<String>, pattern: KeyPattern) -> Self {
        Self {
            name: name.into(),
            pattern,
            quotas: Vec::new(),
            dry_run: false,
        }
    }

    /// Add a quota; a request must fit every quota of its rule.
    pub fn with_quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }

    /// Decide but do not enforce for this rule's keys: admit everything and
    /// count what would have been refused.
    pub fn with_dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule's quotas.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// Whether the rule decides without enforcing.
    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    /// The keys the rule applies to.
    pub fn pattern(&self) -> &KeyPattern {
        &self.pattern
    }

    /// The rule among `rules` that a key with these parts falls under (the
    /// most specific that matches, as the rate limiter picks it), or `None`
    /// when the key gets the default quotas.
    ///
    /// ```
    /// use tower_throttle::rate_limit::{KeyPattern, Rule};
    ///
    /// let rules = vec![
    ///     Rule::new("any-gpt", KeyPattern::parts(["openai", "gpt-*"])?),
    ///     Rule::new("gpt-4o", KeyPattern::parts(["openai", "gpt-4o"])?),
    /// ];
    /// assert_eq!(Rule::find(&rules, &["openai", "gpt-4o"]).map(Rule::name), Some("gpt-4o"));
    /// assert_eq!(Rule::find(&rules, &["openai", "gpt-5"]).map(Rule::name), Some("any-gpt"));
    /// assert!(Rule::find(&rules, &["anthropic", "claude"]).is_none());
    /// # Ok::<(), tower_throttle::error::ConfigError>(())
    /// ```
    pub fn find<'a, S: AsRef<str>>(rules: &'a [Rule], parts: &[S]) -> Option<&'a Rule> {
        let parts: Vec<String> = parts.iter().map(|p| p.as_ref().to_owned()).collect();
        Matcher::new(rules)
            .find(rules, &parts)
            .and_then(|i| rules.get(i))
    }
}

/// Rules compiled for lookup: all-exact patterns in a map, the others in
/// order of specificity. Used once per key; the result is cached with the
/// key's state.
#[derive(Default)]
pub(crate) struct Matcher {
    exact: HashMap<Vec<String>, usize>,
    ordered: Vec<usize>,
}

impl Matcher {
    /// Compile `rules` (index i stands for rule i).
    pub(crate) fn new(rules: &[Rule]) -> Self {
        let mut exact = HashMap::new();
        let mut ordered = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            match rule.pattern.exact_parts() {
                Some(parts) => {
                    exact.entry(parts).or_insert(i);
                }
                None => ordered.push(i),
            }
        }
        // Stable: equal specificity keeps declaration order.
        ordered.sort_by_key(|&i| std::cmp::Reverse(rules[i].pattern.specificity()));
        Self { exact, ordered }
    }

    /// The rule for a key with these parts, if any matches.
    pub(crate) fn find(&self, rules: &[Rule], parts: &[String]) -> Option<usize> {
        let exact = self.exact.get(parts).copied();
        let ordered = self
            .ordered
            .iter()
            .copied()
            .find(|&i| rules[i].pattern.matches(parts));
        // Each is the best of its kind; an exact text pattern (`key = "a"`)
        // ties an all-exact one-part pattern, and a tie goes to the rule
        // declared first.
        [exact, ordered]
            .into_iter()
            .flatten()
            .max_by_key(|&i| (rules[i].pattern.specificity(), std::cmp::Reverse(i)))
    }
}

/// Check that rule names are unique.
pub(crate) fn check_names(rules: &[Rule]) -> Result<(), ConfigError> {
    let mut seen = HashMap::new();
    for (i, rule) in rules.iter().enumerate() {
        if rule.name == super::policy::DEFAULT_POLICY {
            return Err(ConfigError::new(
                format!("rules[{i}].name"),
                format!("`{}` names the default quotas; choose another", rule.name),
            ));
        }
        if let Some(first) = seen.insert(rule.name.as_str(), i) {
            return Err(ConfigError::new(
                format!("rules[{i}].name"),
                format!("`{}` is already the name of rules[{first}]", rule.name),
            ));
        }
    }
    Ok(())
}
