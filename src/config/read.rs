//! Reading TOML: the one reader every configuration of the crate uses, so a
//! bad file is reported one way everywhere: the full path of the field at
//! fault (`rate_limit.rules[2].quotas[0].period`), what is wrong with its
//! value, and the line and column.

use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;
use toml::Spanned;
use toml::de::{DeTable, Deserializer};

use crate::error::ConfigError;

/// Reads `text` as a `T`, every error as a [`ConfigError`] naming the
/// field's full path; its message ends with the line and column. toml's own
/// rendering, which quotes the source line, is left out: the line may hold
/// a secret.
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
    DeTable::parse(text).map_err(|e| error(text, "", &e))
}

/// Reads `text`'s `table` (parsed from it, so that its spans point into it)
/// as a `T`.
pub(crate) fn read<T: DeserializeOwned>(
    text: &str,
    table: Spanned<DeTable<'_>>,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(Deserializer::from(table)).map_err(|e| {
        let path = field_path(e.path().iter());
        error(text, &path, e.inner())
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
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        // Debug quoting escapes what a key may hide (quotes, controls).
        path.push_str(&format!("[{key:?}]"));
    }
}

/// The error at `path` (empty: the document itself, as for a syntax error;
/// then the field is worked out from the error's position, and is `toml`
/// when nothing there names one).
fn error(text: &str, path: &str, e: &toml::de::Error) -> ConfigError {
    let mut field = path.to_owned();
    let message = e.message().trim_end();
    let Some(span) = e.span() else {
        return ConfigError::new(field, message);
    };
    let (line, column) = line_column(text, span.start);
    if field.is_empty() {
        field = field_at(text, line);
    }
    if field.is_empty() {
        // Nothing on that line names a field: the document is at fault.
        field = "toml".to_owned();
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
/// named by their first key only.
fn field_at(text: &str, line: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(line - 1).map_or("", |l| l.trim());
    // An error on a table's own header (`[nonsense]`) is about that table.
    let upto = if here.starts_with('[') {
        line
    } else {
        line - 1
    };
    let mut table = String::new();
    let mut arrays: Vec<(String, usize)> = Vec::new();
    for line in lines.iter().take(upto) {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|t| t.split("]]").next()) {
            let name = name.trim().to_owned();
            let n = match arrays.iter_mut().find(|(a, _)| *a == name) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    arrays.push((name.clone(), 0));
                    0
                }
            };
            table = format!("{}[{n}]", indexed(&name, &arrays));
        } else if let Some(name) = t.strip_prefix('[').and_then(|t| t.split(']').next()) {
            table = indexed(name.trim(), &arrays);
        }
    }
    let key = match here.split_once('=') {
        Some((key, _)) if !here.starts_with('[') => key.trim().trim_matches('"').to_owned(),
        _ => String::new(),
    };
    match (table.is_empty(), key.is_empty()) {
        (_, true) => table,
        (true, false) => key,
        (false, false) => format!("{table}.{key}"),
    }
}

/// `name` with the index of the array of tables it is inside:
/// `rules.headers` after a third `[[rules]]` is `rules[2].headers`.
fn indexed(name: &str, arrays: &[(String, usize)]) -> String {
    let inside = arrays
        .iter()
        .filter(|(a, _)| name.starts_with(&format!("{a}.")))
        .max_by_key(|(a, _)| a.len());
    match inside {
        Some((a, n)) => format!("{a}[{n}]{}", &name[a.len()..]),
        None => name.to_owned(),
    }
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
