//! The `model` field of a `multipart/form-data` body (an audio
//! transcription, an image edit), read as the limiter must: the model the
//! upstream will serve, or a refusal where it could read another.
//!
//! Parsed with `multer` (axum's own multipart parser), strictly: a body it
//! cannot parse is refused rather than forwarded, since an upstream whose
//! parser is more lenient could find a model this reading did not.

use bytes::Bytes;
use http::{HeaderMap, header};

/// The largest `model` value read: a model name is short.
const MAX_MODEL_BYTES: u64 = 1024;

/// Why a multipart body is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Problem {
    /// Not parseable as multipart: 400 `bad_multipart`.
    Malformed(String),
    /// More than one `model` field: 400 `ambiguous_body` (as JSON's
    /// duplicate keys).
    Ambiguous,
}

/// The boundary, when `headers` say the body is `multipart/form-data`.
pub fn boundary(headers: &HeaderMap) -> Option<Result<String, Problem>> {
    let bytes = headers.get(header::CONTENT_TYPE)?.as_bytes();
    let essence = bytes
        .split(|&b| b == b';')
        .next()
        .unwrap_or(b"")
        .trim_ascii();
    if !essence.eq_ignore_ascii_case(b"multipart/form-data") {
        return None;
    }
    // A form whose type holds bytes that are not text is refused, not read
    // as something else (and counted under no model).
    let Ok(value) = std::str::from_utf8(bytes) else {
        return Some(Err(Problem::Malformed(
            "the Content-Type is not text".to_owned(),
        )));
    };
    Some(multer::parse_boundary(value).map_err(|e| Problem::Malformed(e.to_string())))
}

/// The text of the body's one `model` field (`None`: it has none).
pub async fn model(body: Bytes, boundary: String) -> Result<Option<String>, Problem> {
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let constraints = multer::Constraints::new()
        .size_limit(multer::SizeLimit::new().for_field("model", MAX_MODEL_BYTES));
    let mut parts = multer::Multipart::with_constraints(stream, boundary, constraints);
    let mut model = None;
    loop {
        let field = parts
            .next_field()
            .await
            .map_err(|e| Problem::Malformed(e.to_string()))?;
        let Some(field) = field else {
            return Ok(model);
        };
        if field.name() != Some("model") {
            // Read through, so a malformed later part is still found.
            field
                .bytes()
                .await
                .map_err(|e| Problem::Malformed(e.to_string()))?;
            continue;
        }
        if model.is_some() {
            return Err(Problem::Ambiguous);
        }
        let bytes = field
            .bytes()
            .await
            .map_err(|e| Problem::Malformed(e.to_string()))?;
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| Problem::Malformed("the model field is not UTF-8".to_owned()))?;
        model = Some(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(parts: &[(&str, &str)]) -> Bytes {
        let mut text = String::new();
        for (name, value) in parts {
            text.push_str(&format!(
                "--B\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            ));
        }
        text.push_str("--B--\r\n");
        Bytes::from(text)
    }

    async fn read(parts: &[(&str, &str)]) -> Result<Option<String>, Problem> {
        model(body(parts), "B".to_owned()).await
    }

    #[tokio::test]
    async fn the_one_model_field_is_read_and_two_are_ambiguous() {
        assert_eq!(
            read(&[("file", "RIFF"), ("model", "whisper-1")]).await,
            Ok(Some("whisper-1".to_owned()))
        );
        assert_eq!(read(&[("file", "RIFF")]).await, Ok(None));
        assert_eq!(
            read(&[("model", "a"), ("model", "b")]).await,
            Err(Problem::Ambiguous)
        );
        let cut =
            Bytes::from_static(b"--B\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm");
        assert!(matches!(
            model(cut, "B".to_owned()).await,
            Err(Problem::Malformed(_))
        ));
    }

    #[test]
    fn only_multipart_form_data_has_a_boundary() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, value.parse().unwrap());
            boundary(&headers)
        };
        assert_eq!(
            with("multipart/form-data; boundary=xyz"),
            Some(Ok("xyz".to_owned()))
        );
        assert_eq!(
            with("Multipart/Form-Data; boundary=\"q\""),
            Some(Ok("q".to_owned()))
        );
        assert!(matches!(with("multipart/form-data"), Some(Err(_))));
        assert_eq!(with("application/json"), None);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_bytes(b"multipart/form-data; boundary=x; y=\xe9").unwrap(),
        );
        assert!(
            matches!(boundary(&headers), Some(Err(_))),
            "read as not a form"
        );
    }
}
