//! Reading TOML: the one reader every configuration of the crate uses, so a
//! bad file is reported one way everywhere: the full path of the field at
//! fault (`rate_limit.rules[2].quotas[0].period`), what is wrong with its
//! value, and the line and column.

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;
use toml::Spanned;
use toml::de::{DeTable, Deserializer};

use crate::error::ConfigError;

/// Reads `text` as a `T`, every error as a [`ConfigError`] naming the
/// field's full path (`toml` for the document as a whole); its message ends
/// with the line and column, but for an error of the whole document (a
/// missing top-level field). toml's own rendering, which quotes the source
/// line, is left out: the line may hold a secret.
///
/// ```
/// use serde::Deserialize;
/// use tower_throttle::config::from_toml;
///
/// #[derive(Debug, Deserialize)]
/// struct Mine { port: u16 }
///
/// let err = from_toml::<Mine>("port = 99999").unwrap_err();
/// assert_eq!(err.field, "port");
/// assert!(err.message.ends_with("(line 1, column 8)"), "{err}");
/// ```
pub fn from_toml<T: DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    read(text, parse(text)?)
}

/// Parses `text` as a TOML document, a syntax error reported as
/// [`from_toml`]'s are.
pub(crate) fn parse(text: &str) -> Result<Spanned<DeTable<'_>>, ConfigError> {
    DeTable::parse(text).map_err(|e| error(text, None, &e))
}

/// Reads `text`'s `table` (parsed from it, so that its spans point into it)
/// as a `T`.
pub(crate) fn read<T: DeserializeOwned>(
    text: &str,
    table: Spanned<DeTable<'_>>,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(Deserializer::from(table)).map_err(|e| {
        // serde knows the field: the position only places it.
        error(text, Some(field_path(e.path().iter())), e.inner())
    })
}

/// Splits a parsed document's top-level keys: those `names` lists, and the
/// others, each with the document's span.
pub(crate) fn split<'i>(
    table: Spanned<DeTable<'i>>,
    names: &[&str],
) -> (Spanned<DeTable<'i>>, Spanned<DeTable<'i>>) {
    let span = table.span();
    let (mut named, mut rest) = (DeTable::new(), DeTable::new());
    for (key, value) in table.into_inner() {
        if names.contains(&key.get_ref().as_ref()) {
            named.insert(key, value);
        } else {
            rest.insert(key, value);
        }
    }
    (Spanned::new(span.clone(), named), Spanned::new(span, rest))
}

/// A serde path as the crate writes field paths: `rules[2].quotas[0].burst`,
/// a key that is not a plain name quoted (`headers["x bad"]`).
fn field_path<'a>(segments: impl Iterator<Item = &'a Segment>) -> String {
    let mut path = String::new();
    for segment in segments {
        match segment {
            Segment::Seq { index } => path.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => push_key(&mut path, key),
            Segment::Unknown => push_key(&mut path, "?"),
        }
    }
    path
}

fn push_key(path: &mut String, key: &str) {
    if is_bare_key(key) {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        // Debug quoting escapes what a key may hide (quotes, controls).
        path.push_str(&format!("[{key:?}]"));
    }
}

/// The field named when nothing narrower can be: the document itself.
const DOCUMENT: &str = "toml";

/// The error at serde's `path` (none: a syntax error, where serde has no
/// path yet; the field is then worked out from the error's position). The
/// field is `toml` when nothing narrower names one; an error of the whole
/// document (a missing field at the top) gives no position.
fn error(text: &str, path: Option<String>, e: &toml::de::Error) -> ConfigError {
    let message = e.message().trim_end();
    // serde's empty path: the error is the document's as a whole, and its
    // position (the document's start) says nothing.
    let top = path.as_deref() == Some("");
    let span = e.span().filter(|_| !top);
    let Some(span) = span else {
        let field = path.filter(|p| !p.is_empty());
        return ConfigError::new(field.unwrap_or_else(|| DOCUMENT.to_owned()), message);
    };
    let (line, column) = line_column(text, span.start);
    let mut field = match path {
        Some(path) => path,
        None => field_at(text, line),
    };
    if field.is_empty() {
        // Nothing on that line names a field: the document is at fault.
        field = DOCUMENT.to_owned();
    }
    ConfigError::new(field, format!("{message} (line {line}, column {column})"))
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The field a line of `text` is in, from the table headers above it and
/// the key on it: for an error whose position is all there is (a syntax
/// error, where serde has no path yet). Dotted keys and inline tables are
/// named by their first key only. Only names that read as names are taken:
/// a line inside a multi-line array or string may hold a value (a secret),
/// which must not become a field's name.
fn field_at(text: &str, line: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(line.saturating_sub(1)).map_or("", |l| l.trim());
    // An error on a table's own header (`[nonsense]`) is about that table.
    let upto = if here.starts_with('[') {
        line
    } else {
        line.saturating_sub(1)
    };
    let mut table = String::new();
    // How many of each array of tables were seen, by its dotted name.
    let mut arrays: HashMap<String, usize> = HashMap::new();
    for line in lines.iter().take(upto) {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|t| t.split("]]").next()) {
            let name = name.trim();
            if !is_dotted_name(name) {
                continue;
            }
            // A new entry starts its nested arrays afresh.
            let nested = format!("{name}.");
            arrays.retain(|a, _| !a.starts_with(&nested));
            let n = *arrays
                .entry(name.to_owned())
                .and_modify(|n| *n += 1)
                .or_insert(0);
            table = format!("{}[{n}]", indexed(name, &arrays));
        } else if let Some(name) = t.strip_prefix('[').and_then(|t| t.split(']').next()) {
            let name = name.trim();
            if is_dotted_name(name) {
                table = indexed(name, &arrays);
            }
        }
    }
    let key = match here.split_once('=') {
        Some((key, _)) if !here.starts_with('[') => {
            let key = key.trim();
            // A quoted key whole, or a bare one; half a quote is a value.
            key.strip_prefix('"')
                .and_then(|k| k.strip_suffix('"'))
                .unwrap_or(key)
        }
        _ => "",
    };
    let key = if is_dotted_name(key) { key } else { "" };
    match (table.is_empty(), key.is_empty()) {
        (_, true) => table,
        (true, false) => key.to_owned(),
        (false, false) => format!("{table}.{key}"),
    }
}

/// A bare TOML key or a dotted run of them: what a table header or a key
/// that names a field looks like.
fn is_dotted_name(text: &str) -> bool {
    text.split('.').all(is_bare_key)
}

/// A key TOML allows unquoted: ASCII letters, digits, `_` and `-`.
fn is_bare_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `name` with the index of the array of tables it is inside:
/// `rules.headers` after a third `[[rules]]` is `rules[2].headers`. Looks
/// up each dotted prefix, longest first: a file of many arrays costs no
/// more per header than its depth.
fn indexed(name: &str, arrays: &HashMap<String, usize>) -> String {
    let prefixes = name.match_indices('.').map(|(at, _)| at).rev();
    for at in prefixes {
        if let Some(n) = arrays.get(&name[..at]) {
            return format!("{}[{n}]{}", &name[..at], &name[at..]);
        }
    }
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syntax_error_is_placed_by_its_table_and_key() {
        let text = "[[rules]]\nname = \"x\"\n[rules.headers]\nauthorization = \"Bearer sk-5ecret\n";
        let err = from_toml::<toml::Table>(text).unwrap_err();
        assert_eq!(err.field, "rules[0].headers.authorization", "{err}");
        assert!(err.message.contains("(line 4, column"), "{err}");
        assert!(!err.message.contains("5ecret"), "{err}");
    }

    #[test]
    fn an_unknown_field_is_named_with_its_table() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Inner {
            #[allow(dead_code)]
            a: Option<u8>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Outer {
            #[allow(dead_code)]
            inner: Vec<Inner>,
        }
        let err = from_toml::<Outer>("[[inner]]\n[[inner]]\nb = 1\n").unwrap_err();
        assert_eq!(err.field, "inner[1].b", "{err}");
        assert!(err.message.contains("(line 3, column 1)"), "{err}");
        let err = from_toml::<Outer>("inner = []\nnope = 1\n").unwrap_err();
        assert_eq!(err.field, "nope", "{err}");
    }

    #[test]
    fn an_error_with_no_position_still_names_the_document() {
        let text = format!("{}a = 1", "a.".repeat(200));
        let err = from_toml::<toml::Table>(&text).unwrap_err();
        assert_eq!(err.field, "toml", "{err}");
    }

    #[test]
    fn a_value_on_a_broken_line_never_becomes_a_field_name() {
        let text = "[store]\nhash_key = [\n  \"c2VjcmV0==\" \"x\"\n]\n";
        let err = from_toml::<toml::Table>(text).unwrap_err();
        assert_eq!(err.field, "store", "{err}");
        let text = "k = [\n  [\"s3cr3t\"],\n]\n[t]\nx = \"\n";
        let err = from_toml::<toml::Table>(text).unwrap_err();
        assert!(!format!("{err:?}").contains("s3cr3t"), "{err:?}");
    }

    #[test]
    fn a_nested_array_counts_afresh_in_each_entry() {
        let text = "[[clients]]\n[[clients.models]]\n[[clients.models]]\n[[clients]]\n\
                    [[clients.models]]\npattern = \"x\n";
        let err = from_toml::<toml::Table>(text).unwrap_err();
        assert_eq!(err.field, "clients[1].models[0].pattern", "{err}");
    }

    #[test]
    fn a_missing_field_at_the_top_names_the_document_without_a_position() {
        #[derive(Debug, serde::Deserialize)]
        struct Needs {
            #[allow(dead_code)]
            listen: String,
        }
        let err = from_toml::<Needs>("other = 1\n").unwrap_err();
        assert_eq!(err.field, "toml", "{err}");
        assert!(err.message.contains("missing field `listen`"), "{err}");
        assert!(!err.message.contains("(line"), "{err}");
    }

    #[test]
    fn a_key_that_is_not_a_plain_name_is_quoted() {
        let segments = [
            Segment::Map {
                key: "headers".into(),
            },
            Segment::Map {
                key: "x \"bad\"".into(),
            },
        ];
        assert_eq!(field_path(segments.iter()), r#"headers["x \"bad\""]"#);
    }
}
