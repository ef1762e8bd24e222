//! `JsonFieldKey` reads the value the upstream acts on, or refuses: repeated
//! fields, case variants, escapes, encodings, depth, and every layer's
//! handling of an ambiguous key.

#![cfg(feature = "test-util")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use support::Lcg;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::backoff::Backoff429Layer;
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::error::{Ambiguity, AmbiguousKey, BoxError, KeyError, MissingKey};
use tower_throttle::key::{HeaderKey, JsonFieldKey, key_text};
use tower_throttle::rate_limit::{Quota, RateLimitLayer};
use tower_throttle::respond::ThrottleResponseLayer;

fn model_of(body: impl Into<Vec<u8>>) -> Result<String, KeyError> {
    key_text(
        &JsonFieldKey::new("model"),
        &http::Request::new(Bytes::from(body.into())),
    )
}

fn ambiguity(body: impl Into<Vec<u8>>) -> Option<Ambiguity> {
    match model_of(body) {
        Err(KeyError::Ambiguous(e)) => Some(e.reason),
        _ => None,
    }
}

fn is_missing(body: impl Into<Vec<u8>>) -> bool {
    matches!(model_of(body), Err(KeyError::Missing(_)))
}

#[test]
fn a_field_given_twice_is_ambiguous_however_it_is_spelled() {
    for body in [
        r#"{"model":"decoy-1","model":"sim-large"}"#,
        r#"{"model":"sim-large","messages":[],"model":"decoy"}"#,
        r#"{"mod\u0065l":"decoy","model":"sim-large"}"#,
        r#"{"model":"decoy","\u006d\u006f\u0064\u0065\u006c":"sim-large"}"#,
        r#"{"model":{"x":1},"model":"sim-large"}"#,
        r#"{"model":null,"model":"sim-large"}"#,
        " {\n\"model\" :\t\"a\" ,\r\"model\":1 } ",
    ] {
        assert_eq!(ambiguity(body), Some(Ambiguity::Repeated), "{body}");
    }
}

#[test]
fn a_name_differing_only_in_case_is_ambiguous_as_go_reads_it_as_the_field() {
    for body in [
        r#"{"model":"decoy","MODEL":"sim-large"}"#,
        r#"{"Model":"sim-large"}"#,
        r#"{"model":"decoy","mod\u0045l":"sim-large"}"#,
    ] {
        assert_eq!(ambiguity(body), Some(Ambiguity::CaseVariant), "{body}");
    }
    // Go folds the Kelvin sign as `k` and the long s as `s`.
    let stream = JsonFieldKey::new("stream");
    let req = http::Request::new(Bytes::from("{\"\u{17F}tream\":true,\"stream\":false}"));
    assert!(matches!(
        key_text(&stream, &req),
        Err(KeyError::Ambiguous(AmbiguousKey {
            reason: Ambiguity::CaseVariant,
            ..
        }))
    ));
    // Other names are other fields.
    assert_eq!(
        model_of(r#"{"models":"x","mode":"y","model":"m","modèl":"z"}"#).unwrap(),
        "m"
    );
}

#[test]
fn the_error_names_the_field_and_never_a_value() {
    let err = model_of(r#"{"model":"decoy-secret","model":"sim-large"}"#).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("`model`"), "{text}");
    assert!(
        !text.contains("decoy") && !text.contains("sim-large"),
        "{text}"
    );
    let boxed = err.into_box();
    assert!(boxed.downcast_ref::<AmbiguousKey>().is_some());
}

#[test]
fn a_body_that_is_not_well_formed_around_the_field_is_ambiguous() {
    for body in [
        r#"{"model":"#,
        r#"{"model":"sim-large""#,
        r#"{"model":"sim-large","#,
        r#"{"model":"sim-large",}"#,
        r#"{"model" "sim-large"}"#,
        r#"{"model":NaN}"#,
        r#"{"model":1e999}"#,
        r#"{"model":"sim\ud800"}"#,
        r#"{"model":tru}"#,
        r#"{'model':'sim-large'}"#,
        r#"{"x":[1,2,"model":"a"}"#,
    ] {
        assert_eq!(
            ambiguity(body.as_bytes()),
            Some(Ambiguity::Malformed),
            "{body}"
        );
    }
    // Bytes that are not UTF-8 in the value.
    assert_eq!(
        ambiguity(&b"{\"model\":\"sim-\xffarge\"}"[..]),
        Some(Ambiguity::Malformed)
    );
}

#[test]
fn values_a_lenient_parser_accepts_elsewhere_do_not_hide_the_field() {
    // Python reads `NaN` and lone surrogates; the model is still seen.
    assert_eq!(
        model_of(r#"{"x":NaN,"y":"\ud800","\ud800":1,"model":"sim-large"}"#).unwrap(),
        "sim-large"
    );
    // Deeper than serde_json's 128 levels: skipped without recursion.
    let deep = 100_000;
    let body = format!(
        r#"{{"x":{}{},"model":"sim-large","y":"{}"}}"#,
        "[".repeat(deep),
        "]".repeat(deep),
        "]".repeat(10)
    );
    assert_eq!(model_of(body).unwrap(), "sim-large");
    let body = format!(r#"{{"model":{}{}}}"#, "[".repeat(deep), "]".repeat(deep));
    assert!(is_missing(body), "a deep array is no key");
    // Python skips a UTF-8 byte-order mark.
    let mut marked = b"\xEF\xBB\xBF".to_vec();
    marked.extend_from_slice(br#"{"model":"sim-large"}"#);
    assert_eq!(model_of(marked).unwrap(), "sim-large");
}

#[test]
fn json_in_utf16_or_utf32_is_ambiguous() {
    let text = r#" {"model":"sim-large"}"#;
    let be: Vec<u8> = text.encode_utf16().flat_map(u16::to_be_bytes).collect();
    let le: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let wide: Vec<u8> = text
        .chars()
        .flat_map(|c| (c as u32).to_be_bytes())
        .collect();
    for body in [be, le, wide] {
        assert_eq!(ambiguity(body), Some(Ambiguity::NotUtf8));
    }
}

#[test]
fn bodies_that_are_not_objects_or_lack_the_field_have_no_key() {
    for body in [
        "",
        "   ",
        r#"["model"]"#,
        r#""model""#,
        "not json",
        "--boundary\r\ncontent-disposition: form-data; name=\"model\"\r\n\r\nm",
        r#"{}"#,
        r#"{"model":null}"#,
        r#"{"model":[1]}"#,
        r#"{"model":{"model":"x"}}"#,
        r#"{"x":{"model":"nested"}}"#,
    ] {
        assert!(is_missing(body), "{body}");
    }
    // Trailing text after the object is not read, as by streaming decoders.
    assert_eq!(model_of(r#"{"model":"a"} {"model":"b"}"#).unwrap(), "a");
}

// ------------------------------------------------------------------ property

/// A random JSON value, at most `depth` levels deep.
fn value(rng: &mut Lcg, depth: u32) -> Value {
    match rng.next() % if depth == 0 { 5 } else { 7 } {
        0 => Value::Null,
        1 => Value::Bool(rng.next() % 2 == 0),
        2 => {
            let n = rng.next() as i64 - (1 << 30);
            serde_json::json!(n)
        }
        3 => serde_json::json!((rng.next() as f64 - 1e9) / 977.0),
        4 => Value::String(text(rng)),
        5 => Value::Array((0..rng.next() % 4).map(|_| value(rng, depth - 1)).collect()),
        _ => Value::Object(
            (0..rng.next() % 4)
                .map(|_| (name(rng), value(rng, depth - 1)))
                .collect(),
        ),
    }
}

/// Random text with the characters JSON escapes or decodes specially.
fn text(rng: &mut Lcg) -> String {
    const PARTS: [&str; 12] = [
        "sim", "-large", "\"", "\\", "/", "\n", "\u{0}", "é", "😀", "}", "]", " ,: ",
    ];
    (0..rng.next() % 6)
        .map(|_| PARTS[(rng.next() % 12) as usize])
        .collect()
}

/// A random field name; never one that folds to `model` but is not it.
fn name(rng: &mut Lcg) -> String {
    const NAMES: [&str; 10] = [
        "model",
        "messages",
        "stream",
        "mode",
        "models",
        "x\"y",
        "",
        "é",
        "😀",
        "temperature",
    ];
    NAMES[(rng.next() % 10) as usize].to_owned()
}

/// `s` as a JSON string, each character written plainly or as an escape
/// at random.
fn write_str(rng: &mut Lcg, s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let must = matches!(c, '"' | '\\') || c < ' ';
        match rng.next() % 4 {
            0 | 1 if !must => out.push(c),
            2 if matches!(c, '"' | '\\' | '/' | '\n') => {
                out.push('\\');
                out.push(if c == '\n' { 'n' } else { c });
            }
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
}

fn ws(rng: &mut Lcg, out: &mut String) {
    const WS: [&str; 4] = ["", " ", "\n\t", "\r\n  "];
    out.push_str(WS[(rng.next() % 4) as usize]);
}

fn write_value(rng: &mut Lcg, v: &Value, out: &mut String) {
    match v {
        Value::String(s) => write_str(rng, s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(rng, out);
                write_value(rng, item, out);
                ws(rng, out);
            }
            out.push(']');
        }
        Value::Object(map) => write_object(rng, map.iter(), out),
        other => out.push_str(&other.to_string()),
    }
}

fn write_object<'a>(
    rng: &mut Lcg,
    entries: impl Iterator<Item = (&'a String, &'a Value)>,
    out: &mut String,
) {
    out.push('{');
    for (i, (k, v)) in entries.enumerate() {
        if i > 0 {
            out.push(',');
        }
        ws(rng, out);
        write_str(rng, k, out);
        ws(rng, out);
        out.push(':');
        ws(rng, out);
        write_value(rng, v, out);
        ws(rng, out);
    }
    out.push('}');
}

/// The key serde_json's reading of the field gives, as `JsonFieldKey`
/// defines a key: strings as they are, numbers and booleans by their text.
fn serde_reading(v: &Value) -> Option<String> {
    match v.get("model")? {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => f.to_string(),
            _ => unreachable!("a number is one of the three"),
        }),
        _ => None,
    }
}

#[test]
fn with_unique_names_the_key_is_serde_jsons_reading_and_repeats_are_ambiguous() {
    let mut rng = Lcg(0x5eed_0f15);
    let (mut keyed, mut repeated) = (0, 0);
    for case in 0..3_000 {
        let mut map = serde_json::Map::new();
        for _ in 0..rng.next() % 6 {
            map.insert(name(&mut rng), value(&mut rng, 3));
        }
        if rng.next() % 4 != 0 {
            map.insert("model".to_owned(), value(&mut rng, 1));
        }
        let mut body = String::new();
        ws(&mut rng, &mut body);
        // Sometimes the field again, under some spelling, somewhere.
        let extra = (case % 4 == 0).then(|| ("model".to_owned(), value(&mut rng, 2)));
        let has_model = map.contains_key("model");
        let mut entries: Vec<(&String, &Value)> = map.iter().collect();
        if let Some((k, v)) = &extra {
            let at = (rng.next() as usize) % (entries.len() + 1);
            entries.insert(at, (k, v));
        }
        write_object(&mut rng, entries.into_iter(), &mut body);
        ws(&mut rng, &mut body);
        let got = model_of(body.clone());
        if extra.is_some() && has_model {
            repeated += 1;
            assert!(
                matches!(&got, Err(KeyError::Ambiguous(e)) if e.reason == Ambiguity::Repeated),
                "{body}: {got:?}"
            );
            continue;
        }
        let parsed: Value = serde_json::from_str(&body).expect("the generator writes JSON");
        match serde_reading(&parsed) {
            Some(want) => {
                keyed += 1;
                assert_eq!(got.as_deref().ok(), Some(want.as_str()), "{body}");
            }
            None => assert!(matches!(got, Err(KeyError::Missing(_))), "{body}: {got:?}"),
        }
    }
    assert!(
        keyed > 1_000 && repeated > 300,
        "{keyed} keyed, {repeated} repeated"
    );
}

// ------------------------------------------------------------------ layers

fn chat(body: &str) -> http::Request<Bytes> {
    http::Request::new(Bytes::from(body.to_owned()))
}

/// Counts the requests that reach it.
fn counting(
    calls: &Arc<AtomicUsize>,
) -> impl Service<http::Request<Bytes>, Response = http::Response<String>, Error = BoxError> + Clone
{
    let calls = calls.clone();
    tower::service_fn(move |_req: http::Request<Bytes>| {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, BoxError>(http::Response::new(String::new())))
    })
}

const DUPLICATE: &str = r#"{"model":"decoy-1","model":"sim-large"}"#;

#[tokio::test(start_paused = true)]
async fn every_layer_refuses_an_ambiguous_key_before_the_inner_service_even_with_a_fallback() {
    let calls = Arc::new(AtomicUsize::new(0));
    let model = || JsonFieldKey::new("model");
    let quota = Quota::per_minute(100).unwrap();
    let mut rate = RateLimitLayer::new(quota, model())
        .with_fallback_key("anonymous")
        .layer(counting(&calls));
    let mut concurrency = ConcurrencyLayer::new(4, model())
        .unwrap()
        .with_fallback_key("anonymous")
        .layer(counting(&calls));
    let mut backoff = Backoff429Layer::new(model())
        .with_fallback_key("anonymous")
        .layer(counting(&calls));
    let errors = [
        rate.ready()
            .await
            .unwrap()
            .call(chat(DUPLICATE))
            .await
            .err(),
        concurrency
            .ready()
            .await
            .unwrap()
            .call(chat(DUPLICATE))
            .await
            .err(),
        backoff
            .ready()
            .await
            .unwrap()
            .call(chat(DUPLICATE))
            .await
            .err(),
    ];
    for err in errors {
        let err = err.expect("refused");
        let ambiguous = err.downcast_ref::<AmbiguousKey>().expect("AmbiguousKey");
        assert_eq!(ambiguous.reason, Ambiguity::Repeated);
        assert!(!err.is::<MissingKey>());
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "nothing reached the inner service"
    );
    // A missing key still takes the fallback.
    rate.ready().await.unwrap().call(chat("{}")).await.unwrap();
    concurrency
        .ready()
        .await
        .unwrap()
        .call(chat(""))
        .await
        .unwrap();
    backoff
        .ready()
        .await
        .unwrap()
        .call(chat("[]"))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_server_answers_an_ambiguous_key_with_400() {
    let calls = Arc::new(AtomicUsize::new(0));
    let rate = RateLimitLayer::new(Quota::per_minute(100).unwrap(), JsonFieldKey::new("model"))
        .with_max_wait(Duration::ZERO);
    let mut svc = tower::ServiceBuilder::new()
        .layer(ThrottleResponseLayer::new())
        .layer(rate)
        .service(counting(&calls));
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(chat(DUPLICATE))
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = serde_json::from_str(response.body()).unwrap();
    assert_eq!(body["error"]["code"], "ambiguous_key");
    assert!(!body.to_string().contains("decoy"), "{body}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_header_key_given_twice_is_refused_by_every_layer_as_ambiguous() {
    let calls = Arc::new(AtomicUsize::new(0));
    let api_key = || HeaderKey::new("x-api-key").unwrap();
    let twice = || {
        http::Request::builder()
            .header("x-api-key", "sk-decoy")
            .header("x-api-key", "sk-real")
            .body(Bytes::new())
            .unwrap()
    };
    let quota = Quota::per_minute(100).unwrap();
    let mut rate = RateLimitLayer::new(quota, api_key())
        .with_fallback_key("anonymous")
        .layer(counting(&calls));
    let mut concurrency = ConcurrencyLayer::new(4, api_key())
        .unwrap()
        .with_fallback_key("anonymous")
        .layer(counting(&calls));
    let mut backoff = Backoff429Layer::new(api_key())
        .with_fallback_key("anonymous")
        .layer(counting(&calls));
    let errors = [
        rate.ready().await.unwrap().call(twice()).await.err(),
        concurrency.ready().await.unwrap().call(twice()).await.err(),
        backoff.ready().await.unwrap().call(twice()).await.err(),
    ];
    for err in errors {
        let err = err.expect("refused");
        let ambiguous = err.downcast_ref::<AmbiguousKey>().expect("AmbiguousKey");
        assert_eq!(ambiguous.reason, Ambiguity::Repeated);
        assert!(!err.to_string().contains("sk-"), "{err}");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "nothing reached the inner service"
    );
}
