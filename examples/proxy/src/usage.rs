//! Token accounting: what a request is charged at admission (an estimate),
//! and the `usage` its answer reports, which settles the charge.
//!
//! Only requests to the endpoints of the provider's `kind` that answer with
//! a usage (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
//! `/v1/responses`; Anthropic's `/v1/messages`) are charged an estimate;
//! any other request costs one token.
//!
//! **The estimate** is the request's `max_tokens` (or
//! `max_completion_tokens`, or the Responses API's `max_output_tokens`),
//! plus one token per 4 bytes of its body for the prompt, an image sent
//! inline (a base64 `data:` URL) counting [`IMAGE_TOKENS`] instead of its
//! bytes. The body's bytes
//! count its JSON too, so the prompt estimate errs high for English text; a
//! request naming no maximum is charged its prompt only. Either way the
//! answer's usage corrects it.
//!
//! **The usage** is read from the answer: a JSON body's `usage` object, or,
//! streamed (server-sent events), the events that carry one: OpenAI's last
//! chunk with `stream_options.include_usage`, Anthropic's `message_start`
//! (input tokens) and `message_delta` (output tokens so far), the Responses
//! API's `response.completed`. The real cost is `total_tokens` when given,
//! else `input_tokens + output_tokens`. An answer with no usage (an error,
//! a stream without `include_usage`, a client that left early) leaves the
//! estimate standing.
//!
//! OpenAI streams report their usage only when the request asks: the
//! gateway asks on behalf of a client that did not ([`ask_for_usage`]) and
//! takes the usage chunk out of what that client receives, so it gets the
//! stream it asked for.
//!
//! The answer streams through otherwise untouched: a JSON body's last
//! 16 KiB and each event line (up to 64 KiB) are looked at as they pass,
//! never the whole answer.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame, SizeHint};
use serde::Deserialize;
use serde_json::Value;
use tower_throttle::rate_limit::Settlement;

/// What a request is charged at admission, put in its extensions by the
/// handler and read by the rate limiter's cost function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenEstimate(pub u32);

/// The rate limiter's cost of a request: its [`TokenEstimate`], else 1.
pub fn estimated_cost(req: &http::Request<Bytes>) -> u32 {
    req.extensions().get::<TokenEstimate>().map_or(1, |e| e.0)
}

/// `body` (a streamed OpenAI-shaped request) asking the upstream for the
/// usage chunk: `stream_options.include_usage` set to `true`, every other
/// member as written. `None` when it needs no change (not a stream, or the
/// client asked already) or cannot be read unambiguously (a member given
/// twice): it then goes as sent, and the gateway removes nothing.
pub fn ask_for_usage(body: &[u8]) -> Option<Bytes> {
    let members: crate::preset::Members<'_> = serde_json::from_slice(body).ok()?;
    let one = |name: &str| {
        let mut found = members.0.iter().filter(|(n, _)| n == name);
        match (found.next(), found.next()) {
            (_, Some(_)) => Err(()),
            (first, None) => Ok(first.map(|(_, value)| value.get())),
        }
    };
    if one("stream").ok()?? != "true" {
        return None;
    }
    let options = one("stream_options").ok()?;
    let asked = match options {
        Some(text) => {
            let mut value: serde_json::Map<String, Value> = serde_json::from_str(text).ok()?;
            if value.get("include_usage") == Some(&Value::Bool(true)) {
                return None;
            }
            value.insert("include_usage".to_owned(), Value::Bool(true));
            serde_json::to_string(&value).ok()?
        }
        None => r#"{"include_usage":true}"#.to_owned(),
    };
    match options {
        Some(_) => members.write(&[("stream_options", &asked)], None),
        None => members.write(&[], Some(("stream_options", &asked))),
    }
}

/// Whether an event line is the usage chunk the gateway asked for on the
/// client's behalf: OpenAI's last chunk, with no choices and a usage.
fn is_usage_chunk(line: &[u8]) -> bool {
    let Some(data) = line.strip_prefix(b"data:") else {
        return false;
    };
    if memchr::memmem::find(data, b"\"usage\"").is_none() {
        return false;
    }
    serde_json::from_slice::<Value>(data.trim_ascii()).is_ok_and(|v| {
        v.get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
            && v.get("usage").is_some_and(Value::is_object)
    })
}

/// Removes the usage chunk a client did not ask for from an event stream,
/// line by line: complete lines pass at once; a partial one waits for its
/// end (an upstream sends whole events, so in practice nothing waits).
#[derive(Debug, Default)]
struct Unasked {
    partial: BytesMut,
    /// The usage chunk was dropped: its event's blank line goes too.
    dropped: bool,
    /// The line passing is longer than [`MAX_LINE`]: not a usage chunk,
    /// passed on as it comes rather than held.
    passing: bool,
}

impl Unasked {
    fn pass(&mut self, data: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(data.len());
        for piece in data.split_inclusive(|&b| b == b'\n') {
            let ends = piece.last() == Some(&b'\n');
            if self.passing {
                out.extend_from_slice(piece);
                self.passing = !ends;
                continue;
            }
            if !ends {
                self.partial.extend_from_slice(piece);
                if self.partial.len() > MAX_LINE {
                    out.extend_from_slice(&std::mem::take(&mut self.partial));
                    self.passing = true;
                    self.dropped = false;
                }
                continue;
            }
            let line = if self.partial.is_empty() {
                BytesMut::from(piece)
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(piece);
                line
            };
            let blank = line.trim_ascii().is_empty();
            if self.dropped && blank {
                self.dropped = false;
            } else if line.len() <= MAX_LINE && is_usage_chunk(&line) {
                self.dropped = true;
            } else {
                self.dropped = false;
                out.extend_from_slice(&line);
            }
        }
        out.freeze()
    }

    /// What is left at the end of the stream.
    fn finish(&mut self) -> Bytes {
        std::mem::take(&mut self.partial).freeze()
    }
}

/// The fields of a request body the estimate reads; the rest is skipped.
#[derive(Deserialize)]
struct Limits {
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
}

/// What an image sent inline (a base64 `data:` URL) is charged, instead of
/// a token per 4 of its bytes: providers charge images by their size in
/// pixels, up to about this for a large one, far below their base64 length.
pub const IMAGE_TOKENS: u64 = 1_500;

/// The estimate for a request with `body` (see the module docs).
pub fn estimate(body: &[u8]) -> TokenEstimate {
    let (images, image_bytes) = inline_images(body);
    let prompt = (body.len().saturating_sub(image_bytes) as u64)
        .div_ceil(4)
        .saturating_add(images.saturating_mul(IMAGE_TOKENS));
    // A body that is not a JSON object names no maximum.
    let answer = serde_json::from_slice::<Limits>(body)
        .ok()
        .and_then(|l| {
            l.max_completion_tokens
                .or(l.max_tokens)
                .or(l.max_output_tokens)
        })
        .unwrap_or(0);
    let total = prompt.saturating_add(answer).max(1);
    TokenEstimate(u32::try_from(total).unwrap_or(u32::MAX))
}

/// The inline images of a JSON body (`"data:...;base64,...` up to the
/// string's end): how many, and their bytes.
fn inline_images(body: &[u8]) -> (u64, usize) {
    let (mut count, mut bytes) = (0, 0);
    let mut from = 0;
    while let Some(at) = memchr::memmem::find(&body[from..], b"\"data:") {
        let start = from + at + 1;
        // Base64 has no quote or backslash: the string ends at the next
        // quote. Not an image unless it says base64 before that.
        let end = memchr::memchr(b'"', &body[start..]).map_or(body.len(), |e| start + e);
        if memchr::memmem::find(&body[start..end], b";base64,").is_some() {
            count += 1;
            bytes += end - start;
        }
        from = end;
    }
    (count, bytes)
}

/// Tokens an answer reports, gathered as it passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    total: Option<u64>,
    input: Option<u64>,
    output: Option<u64>,
}

impl Usage {
    /// The real cost, when the answer said enough to tell.
    pub fn tokens(&self) -> Option<u64> {
        self.total.or(match (self.input, self.output) {
            (None, None) => None,
            (input, output) => Some(input.unwrap_or(0).saturating_add(output.unwrap_or(0))),
        })
    }

    /// Take in what one JSON value (a body, or an event's data) reports.
    pub fn read(&mut self, value: &Value) {
        let nested = [
            value.get("usage"),
            // Anthropic's `message_start`.
            value.get("message").and_then(|m| m.get("usage")),
            // The Responses API's `response.completed`.
            value.get("response").and_then(|r| r.get("usage")),
        ];
        for usage in nested.into_iter().flatten() {
            let field = |name: &str| usage.get(name).and_then(Value::as_u64);
            // Later events repeat or grow the counts (Anthropic's output
            // tokens so far): the largest seen is the answer's.
            let keep = |kept: &mut Option<u64>, seen: Option<u64>| {
                if let Some(seen) = seen {
                    *kept = Some(kept.map_or(seen, |k| k.max(seen)));
                }
            };
            keep(&mut self.total, field("total_tokens"));
            keep(
                &mut self.input,
                field("input_tokens").or(field("prompt_tokens")),
            );
            keep(
                &mut self.output,
                field("output_tokens").or(field("completion_tokens")),
            );
        }
    }
}

/// The most of a JSON answer's end kept to find its usage in.
const JSON_TAIL: usize = 16 << 10;
/// The longest event line looked at; longer ones pass unread.
const MAX_LINE: usize = 64 << 10;

/// How an answer is read for its usage.
#[derive(Debug)]
enum Reader {
    /// A JSON body: its last [`JSON_TAIL`] bytes.
    Json(BytesMut),
    /// Server-sent events: the line being received, and whether it is too
    /// long to read.
    Events { line: BytesMut, skipping: bool },
}

impl Reader {
    fn take(&mut self, data: &[u8], usage: &mut Usage) {
        match self {
            Self::Json(tail) => {
                tail.extend_from_slice(data);
                if tail.len() > JSON_TAIL {
                    let excess = tail.len() - JSON_TAIL;
                    let _ = tail.split_to(excess);
                }
            }
            Self::Events { line, skipping } => {
                for piece in data.split_inclusive(|&b| b == b'\n') {
                    let ends = piece.last() == Some(&b'\n');
                    if !*skipping {
                        if line.len() + piece.len() > MAX_LINE {
                            *skipping = true;
                            line.clear();
                        } else {
                            line.extend_from_slice(piece);
                        }
                    }
                    if ends {
                        if !*skipping {
                            event_line(line, usage);
                        }
                        line.clear();
                        *skipping = false;
                    }
                }
            }
        }
    }

    fn finish(&mut self, usage: &mut Usage) {
        match self {
            Self::Json(tail) => json_tail(tail, usage),
            Self::Events { line, skipping } => {
                if !*skipping {
                    event_line(line, usage);
                }
            }
        }
    }
}

/// One line of an event stream: a `data:` line whose JSON mentions usage.
fn event_line(line: &[u8], usage: &mut Usage) {
    let Some(data) = line.strip_prefix(b"data:") else {
        return;
    };
    if memchr::memmem::find(data, b"\"usage\"").is_none() {
        return;
    }
    if let Ok(value) = serde_json::from_slice::<Value>(data.trim_ascii()) {
        usage.read(&value);
    }
}

/// The end of a JSON answer: the whole body when it fits, else the last
/// `"usage"` object in it, read on its own.
fn json_tail(tail: &[u8], usage: &mut Usage) {
    if let Ok(value) = serde_json::from_slice::<Value>(tail) {
        usage.read(&value);
        return;
    }
    let Some(at) = memchr::memmem::rfind(tail, b"\"usage\"") else {
        return;
    };
    let Some(open) = tail[at..].iter().position(|&b| b == b'{') else {
        return;
    };
    // The object after the name, and nothing after it: the stream
    // deserializer stops at its end.
    let mut objects = serde_json::Deserializer::from_slice(&tail[at + open..]).into_iter::<Value>();
    if let Some(Ok(object)) = objects.next() {
        usage.read(&serde_json::json!({ "usage": object }));
    }
}

/// The usage an answer with `headers` reports, given in `chunks`: what
/// [`UsageBody`] reads, for tests (the crate's own and `tests/`).
pub fn read_answer(headers: &HeaderMap, chunks: &[&[u8]]) -> Usage {
    let mut reader = reader_for(headers);
    let mut usage = Usage::default();
    for chunk in chunks {
        reader.take(chunk, &mut usage);
    }
    reader.finish(&mut usage);
    usage
}

/// How an answer with `headers` is read.
fn reader_for(headers: &HeaderMap) -> Reader {
    let events = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    if events {
        Reader::Events {
            line: BytesMut::new(),
            skipping: false,
        }
    } else {
        Reader::Json(BytesMut::new())
    }
}

pin_project_lite::pin_project! {
    /// An answer's body passed through untouched, settling its request's
    /// charge at its end with the usage it reported; less the usage chunk
    /// the gateway asked for on behalf of a client that did not.
    pub struct UsageBody {
        #[pin]
        inner: Body,
        reader: Reader,
        usage: Usage,
        settlement: Option<Settlement>,
        tally: Tally,
        unasked: Option<Unasked>,
    }
}

/// Tells, once, what an answer settled its charge to: the usage it
/// reported, or `None` (none reported, or the body ended early or was
/// dropped: the estimate stands).
pub struct Tally(Option<Box<dyn FnOnce(Option<u32>) + Send>>);

impl Tally {
    /// A tally that calls `report`.
    pub fn new(report: impl FnOnce(Option<u32>) + Send + 'static) -> Self {
        Self(Some(Box::new(report)))
    }

    fn report(&mut self, used: Option<u32>) {
        if let Some(report) = self.0.take() {
            report(used);
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        // Dropped before its end (the client went away): nothing settled.
        self.report(None);
    }
}

impl UsageBody {
    /// Read `inner`, an answer with `headers`, settle `settlement` at its
    /// end, and tell `tally` what it was settled to. `unasked`: the gateway
    /// asked for the usage chunk (see [`ask_for_usage`]), which the client
    /// does not get.
    pub fn new(
        inner: Body,
        headers: &HeaderMap,
        settlement: Settlement,
        tally: Tally,
        unasked: bool,
    ) -> Self {
        let reader = reader_for(headers);
        let events = matches!(reader, Reader::Events { .. });
        Self {
            inner,
            reader,
            usage: Usage::default(),
            settlement: Some(settlement),
            tally,
            unasked: (unasked && events).then(Unasked::default),
        }
    }
}

/// The body has ended: settle at the usage it reported, if it did.
fn settle(
    reader: &mut Reader,
    usage: &mut Usage,
    settlement: &mut Option<Settlement>,
    tally: &mut Tally,
) {
    if let Some(settlement) = settlement.take() {
        reader.finish(usage);
        let used = usage
            .tokens()
            .map(|tokens| u32::try_from(tokens).unwrap_or(u32::MAX));
        if let Some(used) = used {
            settlement.settle(used);
        }
        tally.report(used);
    }
}

impl HttpBody for UsageBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        loop {
            let frame = ready!(this.inner.as_mut().poll_frame(cx));
            match &frame {
                Some(Ok(frame)) => {
                    if let (Some(data), Some(_)) = (frame.data_ref(), &this.settlement) {
                        this.reader.take(data, this.usage);
                    }
                    // The server may not poll a body that says it has
                    // ended, or that it has no bytes left (an HTTP/2 answer
                    // whose end comes in a frame of its own).
                    if this.inner.is_end_stream() || this.inner.size_hint().exact() == Some(0) {
                        settle(this.reader, this.usage, this.settlement, this.tally);
                    }
                }
                // A body cut short: the estimate stands.
                Some(Err(_)) => {
                    *this.settlement = None;
                    this.tally.report(None);
                }
                None => settle(this.reader, this.usage, this.settlement, this.tally),
            }
            let Some(unasked) = this.unasked.as_mut() else {
                return Poll::Ready(frame);
            };
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let mut out = unasked.pass(&data);
                        if this.inner.is_end_stream() {
                            let rest = unasked.finish();
                            if !rest.is_empty() {
                                let mut joined = BytesMut::from(&out[..]);
                                joined.extend_from_slice(&rest);
                                out = joined.freeze();
                            }
                        }
                        // Nothing left of this frame (the dropped chunk, or
                        // a partial line): the next one.
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                None => {
                    let rest = unasked.finish();
                    *this.unasked = None;
                    if rest.is_empty() {
                        return Poll::Ready(None);
                    }
                    // The last bytes, then the end (the next poll finds the
                    // inner body ended again).
                    return Poll::Ready(Some(Ok(Frame::data(rest))));
                }
                other => return Poll::Ready(other),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.unasked.as_ref().is_none_or(|u| u.partial.is_empty())
    }

    fn size_hint(&self) -> SizeHint {
        match self.unasked {
            // Less than the upstream sends, by the chunk removed.
            Some(_) => SizeHint::default(),
            None => self.inner.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_did_not_ask_for_usage_is_made_to_ask_every_other_member_as_written() {
        let asked = |body: &str| {
            ask_for_usage(body.as_bytes()).map(|b| String::from_utf8(b.to_vec()).unwrap())
        };
        assert_eq!(
            asked(r#"{"model":"m","stream":true,"n":1.50}"#).as_deref(),
            Some(r#"{"model":"m","stream":true,"n":1.50,"stream_options":{"include_usage":true}}"#)
        );
        assert_eq!(
            asked(r#"{"stream":true,"stream_options":{"include_usage":false}}"#).as_deref(),
            Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)
        );
        // Asked already, not a stream, or read two ways: left as sent.
        for body in [
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"stream":false}"#,
            r#"{"model":"m"}"#,
            r#"{"stream":true,"stream":false}"#,
            r#"{"stream":true,"stream_options":{},"stream_options":{}}"#,
            "not json",
        ] {
            assert_eq!(asked(body), None, "{body}");
        }
    }

    #[test]
    fn the_unasked_usage_chunk_is_removed_wherever_the_chunks_are_cut() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
                      data: {\"choices\":[],\"usage\":{\"total_tokens\":9}}\n\n\
                      data: [DONE]\n\n";
        let want = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
        for cut in 1..stream.len() {
            let mut unasked = Unasked::default();
            let mut got = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                got.extend_from_slice(&unasked.pass(part.as_bytes()));
            }
            got.extend_from_slice(&unasked.finish());
            assert_eq!(String::from_utf8(got).unwrap(), want, "cut at {cut}");
        }
    }

    #[test]
    fn a_line_longer_than_any_usage_chunk_is_passed_on_not_held() {
        let mut unasked = Unasked::default();
        let long = vec![b'x'; MAX_LINE + 10];
        let out = unasked.pass(&long);
        assert_eq!(out.len(), long.len(), "held instead of passed on");
        assert_eq!(
            &unasked.pass(b"yz\ndata: [DONE]\n")[..],
            b"yz\ndata: [DONE]\n"
        );
    }
}
