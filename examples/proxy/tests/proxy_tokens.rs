//! The `proxy` example's token quotas: each request is charged an estimate
//! at admission and settled to the usage its answer reports, in a JSON body
//! or in the last events of a stream (OpenAI's `include_usage` chunk,
//! Anthropic's `message_start` and `message_delta`). Over real sockets, with
//! a fake upstream on 127.0.0.1.
//!
//! Over 700 lines: one test per way an answer reports its usage (JSON,
//! streamed, each provider's events), each with the fake upstream that sends
//! it.

mod support;

use proxy::{config, gateway, usage};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::{Response, header};
use axum::routing::post;

use crate::config::Settings;
use crate::gateway::Running;
use crate::usage::{TokenEstimate, Usage, estimate};
use testkit::local_server::serve_detached;

/// What the fake upstream answers with.
#[derive(Clone, Copy)]
enum Answer {
    /// `{"usage": {"total_tokens": n}}`.
    Json(u64),
    /// OpenAI chunks, the last with `usage.total_tokens = n`, then `[DONE]`.
    OpenAiStream(u64),
    /// Anthropic events: `message_start` with input tokens, `message_delta`s
    /// with output tokens so far.
    AnthropicStream { input: u64, output: u64 },
    /// A JSON body with no usage.
    NoUsage,
}

fn answer(kind: Answer) -> Response<Body> {
    let (content_type, body) = match kind {
        Answer::Json(n) => (
            "application/json",
            format!(
                r#"{{"id":"x","choices":[{{"message":{{"content":"hi"}}}}],"usage":{{"prompt_tokens":1,"completion_tokens":{},"total_tokens":{n}}}}}"#,
                n - 1
            ),
        ),
        Answer::OpenAiStream(n) => (
            "text/event-stream",
            format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"hi\"}}}}]}}\n\n\
                 data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":{},\"total_tokens\":{n}}}}}\n\n\
                 data: [DONE]\n\n",
                n - 1
            ),
        ),
        Answer::AnthropicStream { input, output } => (
            "text/event-stream",
            format!(
                "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"usage\":{{\"input_tokens\":{input},\"output_tokens\":1}}}}}}\n\n\
                 event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"delta\":{{\"text\":\"hi\"}}}}\n\n\
                 event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":{}}}}}\n\n\
                 event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":{output}}}}}\n\n\
                 event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n",
                output / 2
            ),
        ),
        Answer::NoUsage => ("application/json", r#"{"id":"x"}"#.to_owned()),
    };
    Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap()
}

/// A fake upstream answering every POST with `kind`; counts what it serves.
async fn upstream(kind: Answer) -> (SocketAddr, Arc<AtomicUsize>) {
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let app = Router::new().fallback(post(move || {
        count.fetch_add(1, Ordering::SeqCst);
        async move { answer(kind) }
    }));
    let addr = serve_detached(app).await;
    (addr, served)
}

/// A gateway before `upstream` holding every route to `quotas` (TOML).
async fn start_gateway(upstream: SocketAddr, quotas: &str) -> Running {
    let toml = format!(
        r#"
[[providers]]
name = "up"
base_url = "http://{upstream}"

[rate_limit]
quotas = {quotas}
"#
    );
    support::sim::start(&toml).await
}

/// A chat request estimated at exactly `tokens` (its `max_tokens` makes up
/// what its size does not).
fn body_estimated_at(tokens: u32) -> String {
    body_with(tokens, r#""model":"m""#)
}

/// A chat request with `fields`, estimated at exactly `tokens`.
fn body_with(tokens: u32, fields: &str) -> String {
    let shape = |max: u32| format!(r#"{{{fields},"max_tokens":{max:>5},"messages":[]}}"#);
    let prompt = (shape(0).len() as u32).div_ceil(4);
    let body = shape(tokens - prompt);
    assert_eq!(estimate(body.as_bytes()), TokenEstimate(tokens));
    body
}

/// Send requests estimated at `tokens` until one is refused; how many went.
async fn admitted(gateway: &Running, tokens: u32) -> usize {
    admitted_with(gateway, "up", body_estimated_at(tokens)).await
}

/// Send `body` to `provider` until it is refused; how many went.
async fn admitted_with(gateway: &Running, provider: &str, body: String) -> usize {
    let url = format!("{}/{provider}/v1/chat/completions", gateway.url());
    until_refused(&url, None, body).await.0
}

/// POST `body` as JSON to `url` (the tests here name the provider in the
/// path), as `key`'s request when given.
async fn post_json(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: String,
) -> reqwest::Response {
    let mut request = client.post(url).header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    request.body(body).send().await.unwrap()
}

/// Send `body` to `url` (as `key`'s when given) until it is refused: how
/// many went, and the refusal's text.
async fn until_refused(url: &str, key: Option<&str>, body: String) -> (usize, String) {
    let client = reqwest::Client::new();
    for sent in 0..40 {
        let response = post_json(&client, url, key, body.clone()).await;
        let status = response.status().as_u16();
        // Read to the end: the answer settles its charge at its end.
        let text = response.text().await.unwrap();
        if status == 429 {
            return (sent, text);
        }
        assert_eq!(status, 200, "{text}");
    }
    panic!("never refused");
}

/// The tokens `/stats` shows for route `up/m`, the same as in all:
/// charged, used, given back, charged after, kept.
async fn tokens(gateway: &Running) -> [u64; 5] {
    let stats = support::sim::stats(&reqwest::Client::new(), &gateway.url()).await;
    let of = |t: &serde_json::Value| {
        ["charged", "used", "given_back", "charged_after", "kept"]
            .map(|k| t[k].as_u64().unwrap_or_else(|| panic!("{k} in {t}")))
    };
    let route = of(&support::sim::route(&stats, "up/m")["upstream"]["tokens"]);
    assert_eq!(
        route,
        of(&stats["aggregate"]["upstream"]["tokens"]),
        "{stats}"
    );
    route
}

// A sliding window, so that nothing comes back while the test runs.
const THOUSAND_TOKENS: &str =
    r#"[{ limit = 1000, period = "1m", unit = "tokens", algorithm = "sliding_window" }]"#;

#[tokio::test]
async fn an_overestimate_is_settled_to_the_usage_a_json_answer_reports() {
    let (addr, served) = upstream(Answer::Json(100)).await;
    let gateway = start_gateway(addr, THOUSAND_TOKENS).await;
    // Estimated at 300, using 100: each is admitted on its estimate, so the
    // 8th fits (700 + 300) and the 9th does not (800 + 300); unsettled, 3.
    assert_eq!(admitted(&gateway, 300).await, 8);
    assert_eq!(served.load(Ordering::SeqCst), 8);
    // Charged 8 × 300, used 8 × 100, the rest given back.
    assert_eq!(tokens(&gateway).await, [2_400, 800, 1_600, 0, 0]);
    let metrics = support::sim::metrics(&reqwest::Client::new(), &gateway.url()).await;
    let line = |kind: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("proxy_tokens_total{")
                    && l.contains(r#"model="m""#)
                    && l.contains(&format!("kind=\"{kind}\""))
            })
            .unwrap_or_else(|| panic!("no {kind} in {metrics}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .to_owned()
    };
    assert_eq!(line("charged"), "2400");
    assert_eq!(line("given_back"), "1600");
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_underestimate_is_charged_the_difference() {
    let (addr, _) = upstream(Answer::Json(300)).await;
    let gateway = start_gateway(addr, THOUSAND_TOKENS).await;
    // Estimated at 100, using 300: 300, 600, 900, then 1,000 with the 4th
    // on its estimate; unsettled, 10.
    assert_eq!(admitted(&gateway, 100).await, 4);
    assert_eq!(tokens(&gateway).await, [400, 1_200, 0, 800, 0]);
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_answer_without_usage_leaves_the_estimate() {
    let (addr, _) = upstream(Answer::NoUsage).await;
    let gateway = start_gateway(addr, THOUSAND_TOKENS).await;
    assert_eq!(admitted(&gateway, 300).await, 3);
    assert_eq!(tokens(&gateway).await, [900, 0, 0, 0, 3]);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_streamed_answer_is_settled_by_its_last_usage_chunk() {
    let (addr, _) = upstream(Answer::OpenAiStream(100)).await;
    let gateway = start_gateway(addr, THOUSAND_TOKENS).await;
    assert_eq!(admitted(&gateway, 300).await, 8);
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_anthropic_stream_is_settled_by_its_input_and_output_tokens() {
    // 40 in, 60 out: 100, as above.
    let (addr, _) = upstream(Answer::AnthropicStream {
        input: 40,
        output: 60,
    })
    .await;
    let gateway = start_gateway(addr, THOUSAND_TOKENS).await;
    assert_eq!(admitted(&gateway, 300).await, 8);
    gateway.shutdown().await;
}

#[tokio::test]
async fn token_and_request_quotas_are_judged_together() {
    let (addr, served) = upstream(Answer::Json(100)).await;
    // 2 requests, and 1,000 tokens: the requests run out first.
    let quotas = r#"[
        { limit = 2, period = "1m", algorithm = "sliding_window" },
        { limit = 1000, period = "1m", unit = "tokens", algorithm = "sliding_window" },
    ]"#;
    let gateway = start_gateway(addr, quotas).await;
    assert_eq!(admitted(&gateway, 300).await, 2);
    assert_eq!(served.load(Ordering::SeqCst), 2);
    gateway.shutdown().await;
}

#[test]
fn a_quota_unit_other_than_requests_or_tokens_is_refused() {
    let toml = r#"
[[providers]]
name = "up"
base_url = "http://127.0.0.1:9"

[[rate_limit.rules]]
provider = "up"
quotas = [{ limit = 1, period = "1s", unit = "cost" }]
"#;
    let err = Settings::from_toml(toml, &|_| None).expect_err("refused");
    assert_eq!(err.field, "rate_limit.rules[0].quotas[0].unit");
    assert!(err.to_string().contains("\"tokens\""), "{err}");
}

#[test]
fn the_estimate_is_the_maximum_answer_plus_a_token_per_four_bytes() {
    let body = br#"{"model":"m","max_completion_tokens":1000,"max_tokens":5}"#;
    // max_completion_tokens wins over the older max_tokens.
    assert_eq!(
        estimate(body),
        TokenEstimate(1000 + (body.len() as u32).div_ceil(4))
    );
    let body = br#"{"model":"m","max_output_tokens":50}"#;
    assert_eq!(
        estimate(body),
        TokenEstimate(50 + (body.len() as u32).div_ceil(4))
    );
    // No maximum, or not JSON: the prompt only.
    assert_eq!(estimate(b"not json at all!"), TokenEstimate(4));
    assert_eq!(estimate(b""), TokenEstimate(1));
    // An inline image counts a flat 1,500, not a token per 4 of its bytes.
    let image = format!(
        r#"{{"messages":[{{"content":[{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{}"}}}}]}}]}}"#,
        "A".repeat(400_000)
    );
    let url_len = "data:image/png;base64,".len() + 400_000;
    let rest = (image.len() - url_len) as u32;
    assert_eq!(
        estimate(image.as_bytes()),
        TokenEstimate(rest.div_ceil(4) + 1_500)
    );
    // A data URL that is not base64 is text, and an unclosed one ends the body.
    assert_eq!(estimate(br#"{"u":"data:text/plain,hi"}"#), TokenEstimate(7));
    assert_eq!(
        estimate(br#"{"u":"data:x;base64,AAAA"#),
        TokenEstimate(1_500 + 2)
    );
    // Hostile numbers saturate.
    let body = br#"{"max_tokens":18446744073709551615}"#;
    assert_eq!(estimate(body), TokenEstimate(u32::MAX));
}

#[test]
fn usage_is_read_in_every_shape_and_garbage_is_ignored() {
    let read = |json: &str| {
        let mut usage = Usage::default();
        usage.read(&serde_json::from_str(json).unwrap());
        usage.tokens()
    };
    assert_eq!(read(r#"{"usage":{"total_tokens":7}}"#), Some(7));
    assert_eq!(
        read(r#"{"usage":{"prompt_tokens":3,"completion_tokens":4}}"#),
        Some(7)
    );
    assert_eq!(
        read(r#"{"usage":{"input_tokens":3,"output_tokens":4}}"#),
        Some(7)
    );
    assert_eq!(
        read(r#"{"response":{"usage":{"total_tokens":9}}}"#),
        Some(9)
    );
    assert_eq!(read(r#"{"usage":{"total_tokens":-1}}"#), None);
    assert_eq!(read(r#"{"usage":"lots"}"#), None);
    assert_eq!(read(r#"{"usage":{"total_tokens":"7"}}"#), None);
    assert_eq!(read(r#"[1,2]"#), None);
}

#[test]
fn usage_is_found_at_the_end_of_a_long_answer_and_across_chunk_edges() {
    use crate::usage::read_answer;
    let json =
        http::HeaderMap::from_iter([(header::CONTENT_TYPE, "application/json".parse().unwrap())]);
    let events = http::HeaderMap::from_iter([(
        header::CONTENT_TYPE,
        "text/event-stream; charset=utf-8".parse().unwrap(),
    )]);
    // 100 KB of answer, the usage last: found in the tail.
    let long = format!(
        r#"{{"choices":[{{"message":{{"content":"{}"}}}}],"usage":{{"total_tokens":123}}}}"#,
        "x".repeat(100_000)
    );
    let chunks: Vec<&[u8]> = long.as_bytes().chunks(7_777).collect();
    assert_eq!(read_answer(&json, &chunks).tokens(), Some(123));
    // A usage object far from the end is not looked for: the estimate stands.
    let early = format!(
        r#"{{"usage":{{"total_tokens":5}},"content":"{}"}}"#,
        "x".repeat(100_000)
    );
    assert_eq!(read_answer(&json, &[early.as_bytes()]).tokens(), None);
    // Events split at every byte still read whole.
    let stream =
        "data: {\"choices\":[]}\n\ndata: {\"usage\":{\"total_tokens\":42}}\n\ndata: [DONE]\n\n";
    let bytes: Vec<&[u8]> = stream.as_bytes().chunks(1).collect();
    assert_eq!(read_answer(&events, &bytes).tokens(), Some(42));
    // A line longer than the limit is skipped, and the next read again.
    let huge = format!(
        "data: {{\"usage\":{{\"total_tokens\":1}},\"pad\":\"{}\"}}\ndata: {{\"usage\":{{\"completion_tokens\":9}}}}\n",
        "x".repeat(70_000)
    );
    assert_eq!(read_answer(&events, &[huge.as_bytes()]).tokens(), Some(9));
    // Garbage reads as nothing.
    assert_eq!(
        read_answer(&events, &[b"data: {\"usage\": nope\n\xff\xfe"]).tokens(),
        None
    );
    assert_eq!(read_answer(&json, &[b"\"usage\" {{{{"]).tokens(), None);
}

#[tokio::test]
async fn the_simulator_reports_streamed_usage_when_asked() {
    let toml = r#"
[simulator]
latency = "0ms"
stream_chunks = 2
stream_interval = "0ms"
models = [{ name = "sim-small", limit = 0, period = "1s" }]

[[providers]]
name = "sim"
base_url = "simulator"

[rate_limit]
quotas = [{ limit = 1000, period = "1m", unit = "tokens", algorithm = "sliding_window" }]
"#;
    let gateway = support::sim::start(toml).await;
    // Its answers use 22 tokens (8 of prompt, 14 words): estimated at 500,
    // the 23rd fits (22 × 22 + 500) and the 24th does not. Unsettled, 2.
    let fields = r#""model":"sim-small","stream":true,"stream_options":{"include_usage":true}"#;
    assert_eq!(
        admitted_with(&gateway, "sim", body_with(500, fields)).await,
        23
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn only_endpoints_that_answer_with_usage_are_charged_an_estimate() {
    let (addr, _) = upstream(Answer::Json(100)).await;
    let gateway = start_gateway(addr, THOUSAND_TOKENS).await;
    let client = reqwest::Client::new();
    // 4 KB to an endpoint with no usage (an upload, say): a token each,
    // where an estimate would be over 1,000.
    let big = format!(r#"{{"model":"m","data":"{}"}}"#, "x".repeat(4_000));
    for _ in 0..5 {
        let response = client
            .post(format!("{}/up/v1/files", gateway.url()))
            .body(big.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    // 5 spent: 5 + 6 × 100 + 300 fits, 5 + 7 × 100 + 300 does not.
    assert_eq!(admitted(&gateway, 300).await, 7);
    gateway.shutdown().await;
}

/// A request whose estimate alone is more than the token quota holds can
/// never be admitted: refused at once with 413, never queued or counted.
#[tokio::test]
async fn an_estimate_above_the_token_quota_is_refused_with_413() {
    let (addr, served) = upstream(Answer::Json(100)).await;
    let gateway = start_gateway(addr, THOUSAND_TOKENS).await;
    let url = format!("{}/up/v1/chat/completions", gateway.url());
    let response = post_json(
        &reqwest::Client::new(),
        &url,
        None,
        body_estimated_at(1_500),
    )
    .await;
    assert_eq!(response.status(), 413);
    let body: serde_json::Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "cost_too_high", "{body}");
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 0);
    // The quota is untouched: a request estimated at the whole thousand
    // still fits (then, settled to 100, leaves too little for another).
    assert_eq!(admitted(&gateway, 1_000).await, 1);
}

/// An upstream of OpenAI's shape: a stream carries its usage chunk only
/// when the request asks for it, as OpenAI's does. Keeps the last body.
async fn usage_when_asked() -> (SocketAddr, Arc<parking_lot::Mutex<String>>) {
    let seen = Arc::new(parking_lot::Mutex::new(String::new()));
    let keep = seen.clone();
    let app = Router::new().fallback(post(move |body: String| {
        let asked = body.contains(r#""include_usage":true"#);
        *keep.lock() = body;
        async move {
            let usage = if asked {
                "data: {\"choices\":[],\"usage\":{\"total_tokens\":100}}\n\n"
            } else {
                ""
            };
            let body = format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"hi\"}}}}]}}\n\n{usage}data: [DONE]\n\n"
            );
            Response::builder()
                .header(header::CONTENT_TYPE, "text/event-stream")
                .body(Body::from(body))
                .unwrap()
        }
    }));
    let addr = serve_detached(app).await;
    (addr, seen)
}

/// Most clients do not ask a stream for its usage: the gateway asks on
/// their behalf, settles the charge with it, and takes the usage chunk
/// out, so the client gets exactly the stream it asked for.
#[tokio::test]
async fn a_stream_that_did_not_ask_for_usage_is_settled_and_its_client_sees_no_usage_chunk() {
    let (addr, seen) = usage_when_asked().await;
    let gateway = start_gateway(addr, THOUSAND_TOKENS).await;
    let streamed = body_with(300, r#""model":"m","stream":true"#);
    let client = reqwest::Client::new();
    let url = format!("{}/up/v1/chat/completions", gateway.url());
    let answer = post_json(&client, &url, None, streamed.clone()).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.text().await.unwrap(),
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n",
        "the client got more than it asked for"
    );
    assert!(
        seen.lock()
            .contains(r#""stream_options":{"include_usage":true}"#),
        "{}",
        seen.lock()
    );
    // Settled to 100 each: 7 more fit after the first (1,000 in all), as
    // with a JSON answer, not 2 as on the estimate alone.
    assert_eq!(admitted_with(&gateway, "up", streamed).await, 7);
    // A client that asks gets the chunk.
    let asked = body_with(
        300,
        r#""model":"n","stream":true,"stream_options":{"include_usage":true}"#,
    );
    let text = post_json(&client, &url, None, asked)
        .await
        .text()
        .await
        .unwrap();
    assert!(text.contains("\"usage\""), "{text}");
    gateway.shutdown().await;
}

/// An upstream whose one streamed answer is sent chunk by chunk as the test
/// says: each chunk is handed to the returned sender.
async fn stepped_upstream() -> (SocketAddr, tokio::sync::mpsc::UnboundedSender<&'static str>) {
    let (send, receive) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    let receive = Arc::new(parking_lot::Mutex::new(Some(receive)));
    let app = Router::new().fallback(post(move || {
        let receive = receive.lock().take().expect("one answer");
        async move {
            let chunks = futures::stream::unfold(receive, |mut receive| async move {
                let chunk = receive.recv().await?;
                Some((Ok::<_, std::io::Error>(chunk), receive))
            });
            Response::builder()
                .header(header::CONTENT_TYPE, "text/event-stream")
                .body(Body::from_stream(chunks))
                .unwrap()
        }
    }));
    let addr = serve_detached(app).await;
    (addr, send)
}

/// Each chunk of a streamed answer reaches the client before the upstream
/// sends the next: the upstream sends a chunk only once the client has the
/// one before, so a gateway that held back any chunk (to read the usage,
/// or to gather a line) would never finish; the hang guard fails it. The
/// client gets the bytes as sent, and the charge is settled at the end.
#[tokio::test]
async fn a_stream_passes_chunk_by_chunk_with_nothing_held_back() {
    let (addr, upstream) = stepped_upstream().await;
    let gateway = start_gateway(addr, THOUSAND_TOKENS).await;
    let asked = body_with(
        300,
        r#""model":"m","stream":true,"stream_options":{"include_usage":true}"#,
    );
    let url = format!("{}/up/v1/chat/completions", gateway.url());
    let mut answer = post_json(&reqwest::Client::new(), &url, None, asked).await;
    assert_eq!(answer.status(), 200);
    // Chunks cut anywhere, a line across two of them included.
    let chunks = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"one\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":",
        "{\"content\":\"two\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":41,\"total_tokens\":42}}\n\n",
        "data: [DONE]\n\n",
    ];
    let mut received = String::new();
    for chunk in chunks {
        upstream.send(chunk).unwrap();
        let mut got = String::new();
        while got.len() < chunk.len() {
            let next = tokio::time::timeout(std::time::Duration::from_secs(10), answer.chunk())
                .await
                .unwrap_or_else(|_| panic!("{chunk:?} held back: {got:?} so far"))
                .unwrap()
                .expect("more of the answer");
            got.push_str(std::str::from_utf8(&next).unwrap());
        }
        assert_eq!(got, chunk);
        received.push_str(&got);
    }
    drop(upstream);
    assert!(answer.chunk().await.unwrap().is_none(), "the answer ends");
    assert_eq!(received, chunks.concat());
    // Settled at the usage the stream reported.
    assert_eq!(tokens(&gateway).await, [300, 42, 258, 0, 0]);
    gateway.shutdown().await;
}

const ALICE: &str = "alice-key-0123456789abcdef";

/// A gateway before `upstream` (provider `up`) with client alice, and
/// `extra` TOML (her quotas, limits, routes).
async fn start_with_alice(upstream: SocketAddr, alice: &str, extra: &str) -> Running {
    let toml = format!(
        r#"
[[providers]]
name = "up"
base_url = "http://{upstream}"
{extra}

[[clients]]
name = "alice"
keys = [{{ env = "ALICE_KEY" }}]
{alice}
"#
    );
    let env = |name: &str| (name == "ALICE_KEY").then(|| ALICE.to_owned());
    support::sim::start_with(&toml, &env).await
}

/// Alice's requests estimated at 300 to `path` until one is refused (its
/// refusal names her own limit): how many went.
async fn alices_until_refused(gateway: &Running, path: &str) -> usize {
    let url = format!("{}{path}", gateway.url());
    let (sent, text) = until_refused(&url, Some(ALICE), body_estimated_at(300)).await;
    assert!(text.contains(r#""limit":"client""#), "{text}");
    sent
}

/// Alice's `tokens` in `/stats`.
async fn alices_tokens(gateway: &Running) -> u64 {
    let stats = support::sim::stats(&reqwest::Client::new(), &gateway.url()).await;
    stats["clients"][0]["tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("{}", stats["clients"]))
}

/// A client's own token quota is charged each estimate and settled to the
/// usage with the route's: estimated at 300, using 100, eight of alice's
/// fit her 1,000 tokens a minute (three if her estimates stood), and the
/// route's 2,000 never refuse them (six if its estimates stood: one
/// settlement settles both).
#[tokio::test]
async fn a_clients_token_quota_is_settled_to_the_usage() {
    let (addr, served) = upstream(Answer::Json(100)).await;
    let gateway = start_with_alice(
        addr,
        &format!("quotas = {THOUSAND_TOKENS}"),
        r#"[rate_limit]
quotas = [{ limit = 2000, period = "1m", unit = "tokens", algorithm = "sliding_window" }]"#,
    )
    .await;
    assert_eq!(
        alices_until_refused(&gateway, "/up/v1/chat/completions").await,
        8
    );
    assert_eq!(served.load(Ordering::SeqCst), 8);
    // Per client: what its answers used.
    assert_eq!(alices_tokens(&gateway).await, 800);
    gateway.shutdown().await;
}

/// The same quota on a model pattern, the only quota counting tokens (the
/// gateway must still charge estimates), and through a `[[routes]]` model
/// (its tokens still counted per client).
#[tokio::test]
async fn a_clients_token_quota_on_a_model_pattern_counts_tokens_through_routes() {
    let (addr, served) = upstream(Answer::Json(100)).await;
    let gateway = start_with_alice(
        addr,
        &format!("[[clients.models]]\npattern = \"m*\"\nquotas = {THOUSAND_TOKENS}"),
        "[[routes]]\nmodel = \"m\"\ndeployments = [\"up\"]",
    )
    .await;
    assert_eq!(
        alices_until_refused(&gateway, "/v1/chat/completions").await,
        8
    );
    assert_eq!(served.load(Ordering::SeqCst), 8);
    assert_eq!(alices_tokens(&gateway).await, 800);
    gateway.shutdown().await;
}

/// A request whose estimate no admission of a client's token quota could
/// ever fit is refused with 413, naming the client's limit, and counted
/// as refused by it.
#[tokio::test]
async fn an_estimate_above_a_clients_token_quota_is_refused_as_the_clients() {
    let (addr, served) = upstream(Answer::Json(100)).await;
    let gateway = start_with_alice(addr, &format!("quotas = {THOUSAND_TOKENS}"), "").await;
    let url = format!("{}/up/v1/chat/completions", gateway.url());
    let response = post_json(
        &reqwest::Client::new(),
        &url,
        Some(ALICE),
        body_estimated_at(1_200),
    )
    .await;
    assert_eq!(response.status(), 413);
    let body = support::sim::body_json(response).await;
    assert_eq!(body["error"]["code"], "cost_too_high", "{body}");
    assert_eq!(body["error"]["limit"], "client", "{body}");
    let stats = support::sim::stats(&reqwest::Client::new(), &gateway.url()).await;
    assert_eq!(
        stats["clients"][0]["refused_client"], 1,
        "{}",
        stats["clients"]
    );
    assert_eq!(served.load(Ordering::SeqCst), 0);
    gateway.shutdown().await;
}
