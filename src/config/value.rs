//! Reading a configuration's values: one parser for durations, one for
//! counts, each error naming its field, the value and what was expected.

use std::time::Duration;

use serde::{Deserialize, Serialize};

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

/// The shorter of two optional durations; one left out does not count.
pub(crate) fn min_duration(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The longer of two optional durations; one left out does not count.
pub(crate) fn max_duration(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Whether a section makes requests wait or refuses them at once:
/// `"reject"` (the default) or `"wait"`, read as the file is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Mode {
    /// Refuse at once.
    #[default]
    Reject,
    /// Wait, up to the section's `max_wait`.
    Wait,
}

/// Durations in configuration files, as humantime writes them: read with
/// [`parse_duration`]'s rules and message, written back as text. For
/// `#[serde(with = "...")]` on a `Duration` field.
pub mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    /// Reads a duration's text.
    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(de)?;
        super::parse_duration("", &text).map_err(|e| D::Error::custom(e.message))
    }

    /// Writes a duration as text (`"1m 30s"`).
    pub fn serialize<S: Serializer>(d: &Duration, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_str(&humantime::format_duration(*d))
    }
}

/// [`duration_text`] for an `Option<Duration>` field (with
/// `#[serde(default)]`: left out is `None`).
pub mod optional_duration_text {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    /// Reads a duration's text.
    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Option<Duration>, D::Error> {
        super::duration_text::deserialize(de).map(Some)
    }

    /// Writes a duration as text, none as nothing.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, ser: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration_text::serialize(d, ser),
            None => ser.serialize_none(),
        }
    }
}
