//! A TOML error as a [`ConfigError`] naming the field it is at.

use tower_throttle::error::ConfigError;

/// A TOML error as a [`ConfigError`] naming the field it is at (worked out
/// from its position: the table header above it and the key on its line)
/// and the line. toml's own rendering, which quotes the line, is left out.
pub(super) fn toml_error(text: &str, e: &toml::de::Error) -> ConfigError {
    let message = e.message().trim_end().to_owned();
    let Some(span) = e.span() else {
        return ConfigError::new("toml", message);
    };
    let start = span.start.min(text.len());
    let before = text.get(..start).unwrap_or(text);
    let line_no = before.matches('\n').count() + 1;
    let mut table = String::new();
    let mut arrays: Vec<(String, usize)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(line_no - 1).map(|l| l.trim()).unwrap_or("");
    // An error on a table's own header (`[nonsense]`: an unknown table) is
    // about that table, not the one before it.
    let upto = if here.starts_with('[') {
        line_no
    } else {
        line_no - 1
    };
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
            table = format!("{name}[{n}]");
        } else if let Some(name) = t.strip_prefix('[').and_then(|t| t.split(']').next()) {
            table = name.trim().to_owned();
        }
    }
    let key = match here.split_once('=') {
        Some((key, _)) if !here.starts_with('[') => key.trim().trim_matches('"').to_owned(),
        _ => String::new(),
    };
    let field = match (table.is_empty(), key.is_empty()) {
        (true, true) => "toml".to_owned(),
        (true, false) => key,
        (false, true) => table,
        (false, false) => format!("{table}.{key}"),
    };
    ConfigError::new(field, format!("{message} (line {line_no})"))
}
