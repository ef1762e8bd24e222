//! A strict parser of the Prometheus text exposition format (0.0.4), for
//! tests: it panics on anything the format does not allow.

use std::collections::{BTreeMap, HashSet};

/// One sample: its family, its labels in order, its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn metric_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn label_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A `HELP` docstring: only `\\` and `\n` may be escaped.
fn check_help(text: &str, at: &dyn Fn() -> String) {
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let next = chars.next();
            assert!(
                matches!(next, Some('\\' | 'n')),
                "bad escape in HELP: {}",
                at()
            );
        }
    }
}

/// The label set `{...}` at the start of `text`: the labels, and the rest of
/// the line after the closing brace.
fn parse_labels<'a>(text: &'a str, at: &dyn Fn() -> String) -> (Vec<(String, String)>, &'a str) {
    let mut labels = Vec::new();
    let mut rest = text;
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return (labels, after);
        }
        let eq = rest
            .find('=')
            .unwrap_or_else(|| panic!("label without `=`: {}", at()));
        let name = &rest[..eq];
        assert!(label_name_ok(name), "bad label name {name:?}: {}", at());
        assert!(
            !labels.iter().any(|(k, _)| k == name),
            "label {name} repeated: {}",
            at()
        );
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .unwrap_or_else(|| panic!("label value not quoted: {}", at()));
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => panic!("bad escape {other:?} in a label value: {}", at()),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value: {}", at()),
            }
        };
        labels.push((name.to_owned(), value));
        rest = &rest[end + 1..];
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else {
            assert!(rest.starts_with('}'), "expected `,` or `}}`: {}", at());
        }
    }
}

fn parse_value(text: &str, at: &dyn Fn() -> String) -> f64 {
    match text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v
            .parse()
            .unwrap_or_else(|_| panic!("bad value {v:?}: {}", at())),
    }
}

/// Parse `text`, panicking on anything outside the format: names, label
/// names and escapes, `TYPE` before a family's samples and at most once, a
/// family's samples together, no series twice, numbers as values, a final
/// line feed.
pub fn parse(text: &str) -> Vec<Sample> {
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "the text does not end with a line feed"
    );
    let mut samples = Vec::new();
    let mut typed: HashSet<String> = HashSet::new();
    let mut finished: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut series: HashSet<String> = HashSet::new();
    for (no, line) in text.split_terminator('\n').enumerate() {
        let at = || format!("line {}: {line:?}", no + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim_start_matches(' ');
            if let Some(rest) = comment.strip_prefix("HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                assert!(metric_name_ok(name), "bad name: {}", at());
                check_help(help, &at);
            } else if let Some(rest) = comment.strip_prefix("TYPE ") {
                let (name, kind) = rest
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("TYPE without a type: {}", at()));
                assert!(metric_name_ok(name), "bad name: {}", at());
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                    "bad type: {}",
                    at()
                );
                assert!(typed.insert(name.to_owned()), "TYPE given twice: {}", at());
                assert!(
                    !finished.contains(name) && current.as_deref() != Some(name),
                    "TYPE after the family's samples: {}",
                    at()
                );
            }
            continue;
        }
        let split = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("a sample without a value: {}", at()));
        let name = &line[..split];
        assert!(metric_name_ok(name), "bad name: {}", at());
        let (labels, rest) = match line[split..].strip_prefix('{') {
            Some(after) => parse_labels(after, &at),
            None => (Vec::new(), &line[split..]),
        };
        let rest = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("no space before the value: {}", at()));
        let mut fields = rest.split(' ');
        let value = parse_value(fields.next().unwrap_or_default(), &at);
        if let Some(stamp) = fields.next() {
            stamp
                .parse::<i64>()
                .unwrap_or_else(|_| panic!("bad timestamp: {}", at()));
        }
        assert!(fields.next().is_none(), "trailing text: {}", at());
        if current.as_deref() != Some(name) {
            if let Some(done) = current.take() {
                finished.insert(done);
            }
            assert!(
                !finished.contains(name),
                "the family's samples are not together: {}",
                at()
            );
            current = Some(name.to_owned());
        }
        let mut key: Vec<_> = labels.clone();
        key.sort();
        assert!(
            series.insert(format!("{name}{key:?}")),
            "series given twice: {}",
            at()
        );
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    samples
}

/// Samples keyed `name{label="value",...}` (labels in their order, values
/// as Rust debug strings).
pub fn by_series(samples: &[Sample]) -> BTreeMap<String, f64> {
    samples
        .iter()
        .map(|s| {
            let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            (format!("{}{{{}}}", s.name, labels.join(",")), s.value)
        })
        .collect()
}
