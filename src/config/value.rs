//! Reading a configuration's values: one parser for durations, one for
//! counts, each error naming its field, the value and what was expected.

use std::time::Duration;

use crate::error::ConfigError;

/// Reads a duration as humantime writes it (`"30s"`, `"1m"`, `"1h30m"`,
/// `"500ms"`, `"1d"`), spaces around it ignored. Every configuration of the
/// crate reads durations with it, and so can a program's own, so that a bad
/// value is reported the same way everywhere.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::config::parse_duration;
///
/// assert_eq!(parse_duration("queue_timeout", " 1m30s ")?, Duration::from_secs(90));
/// let err = parse_duration("queue_timeout", "soon").unwrap_err();
/// assert_eq!(err.field, "queue_timeout");
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
pub fn parse_duration(field: &str, text: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        ConfigError::new(
            field,
            format!("`{text}` is not a duration ({e}); write e.g. \"30s\", \"1m\" or \"500ms\""),
        )
    })
}

/// An optional duration field: none when left out.
pub(crate) fn duration(
    field: &str,
    text: &Option<String>,
) -> Result<Option<Duration>, ConfigError> {
    text.as_deref()
        .map(|t| parse_duration(field, t))
        .transpose()
}

/// A count that cannot be negative.
pub(crate) fn count(field: &str, value: i64) -> Result<usize, ConfigError> {
    usize::try_from(value).map_err(|_| ConfigError::new(field, format!("{value} is negative")))
}

/// The smaller of two optional counts; one left out does not count.
pub(crate) fn min_count(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Merging reads a duration leniently: both sides were checked already, and
/// one that does not parse loses to one that does.
fn lenient(text: &Option<String>) -> Option<Duration> {
    text.as_deref()
        .and_then(|t| humantime::parse_duration(t.trim()).ok())
}

/// The shorter of two optional durations, as written.
pub(crate) fn min_duration(a: &Option<String>, b: &Option<String>) -> Option<String> {
    match (lenient(a), lenient(b)) {
        (Some(x), Some(y)) if y < x => b.clone(),
        (Some(_), _) => a.clone(),
        (None, _) => b.clone(),
    }
}

/// The longer of two optional durations, as written.
pub(crate) fn max_duration(a: &Option<String>, b: &Option<String>) -> Option<String> {
    match (lenient(a), lenient(b)) {
        (Some(x), Some(y)) if y > x => b.clone(),
        (Some(_), _) => a.clone(),
        (None, _) => b.clone(),
    }
}
