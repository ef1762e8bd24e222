//! The `proxy` example in front of real providers' APIs, faked on
//! 127.0.0.1: provider presets (`kind`: which key header, which version
//! header, never another provider's or the client's key), model aliases
//! (two spellings of one model share one route and its limits), and a
//! request exactly as the official OpenAI Python SDK sends it, streamed
//! back unchanged.
//!
//! Over 700 lines: each preset's fake provider is written out in full, as
//! the exact headers it checks are what these tests are about.

mod support;

use proxy::{config, gateway, preset};

use support::fake_upstream;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::config::Settings;
use crate::fake_upstream::{FakeUpstream, Received};
use crate::gateway::Running;
use crate::preset::{Aliases, Kind, LimitHeaders, UsageFormat};
use support::sim::{route, route_names, stats};

// ---------------------------------------------------------------- helpers

const OPENAI_KEY: &str = "sk-openai-gateway-7Hq2";
const ANTHROPIC_KEY: &str = "sk-ant-gateway-Yp4c";
const CLIENT_KEY: &str = "sk-clients-own-Rw9d";
const AZURE_KEY: &str = "azure-gateway-key-Lm3x";

/// The gateway's environment: one key per provider.
fn env(name: &str) -> Option<String> {
    match name {
        "OPENAI_API_KEY" => Some(OPENAI_KEY.to_owned()),
        "ANTHROPIC_API_KEY" => Some(ANTHROPIC_KEY.to_owned()),
        "AZURE_OPENAI_API_KEY" => Some(AZURE_KEY.to_owned()),
        _ => None,
    }
}

fn settings(toml: &str) -> Settings {
    support::sim::settings_with(toml, &env)
}

async fn start(toml: &str) -> Running {
    support::sim::start_with(toml, &env).await
}

/// One OpenAI and one Anthropic provider, each with its key.
fn two_providers(openai: &FakeUpstream, anthropic: &FakeUpstream) -> String {
    format!(
        r#"
[[providers]]
name = "openai"
kind = "openai"
base_url = "{}"
api_key_env = "OPENAI_API_KEY"

[[providers]]
name = "anthropic"
kind = "anthropic"
base_url = "{}"
api_key_env = "ANTHROPIC_API_KEY"
"#,
        openai.base_url(),
        anthropic.base_url()
    )
}

/// One provider at `upstream` with `extra` lines, and a limit of `limit`
/// requests a minute per route, refusing beyond it.
fn limited(upstream: &FakeUpstream, extra: &str, limit: u32) -> String {
    format!(
        r#"
[[providers]]
name = "openai"
kind = "openai"
base_url = "{}"
api_key_env = "OPENAI_API_KEY"
{extra}

[rate_limit]
mode = "reject"
quotas = [{{ limit = {limit}, period = "1m" }}]
"#,
        upstream.base_url()
    )
}

fn chat(model: &str) -> String {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
}

async fn post(client: &reqwest::Client, url: &str, body: String) -> reqwest::Response {
    client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// No header value of `request` holds any of `secrets`.
fn assert_no_secret(request: &Received, secrets: &[&str]) {
    for (name, value) in &request.headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        for secret in secrets {
            assert!(
                !value.contains(secret),
                "{name}: {value} reached {}",
                request.path
            );
        }
    }
}

// ---------------------------------------------------------------- presets

#[tokio::test]
async fn each_provider_receives_its_own_key_and_version_and_never_another() {
    let openai = FakeUpstream::start().await;
    let anthropic = FakeUpstream::start().await;
    let gw = start(&two_providers(&openai, &anthropic)).await;
    let client = reqwest::Client::new();
    let url = gw.url();

    // A client sending keys in every header a provider reads: none of them
    // may stand in for the gateway's, nor reach an upstream.
    let with_client_keys = |req: reqwest::RequestBuilder| {
        req.header("authorization", format!("Bearer {CLIENT_KEY}"))
            .header("x-api-key", CLIENT_KEY)
            .header("api-key", CLIENT_KEY)
            .header("content-type", "application/json")
    };
    let sent = with_client_keys(client.post(format!("{url}/openai/v1/chat/completions")))
        .body(chat("gpt-4o"))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);
    let sent = with_client_keys(client.post(format!("{url}/anthropic/v1/messages")))
        .body(chat("claude-sonnet-4-5"))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);
    // The client's own version is kept: its body is written for it.
    let sent = with_client_keys(client.post(format!("{url}/anthropic/v1/messages")))
        .header("anthropic-version", "2099-01-01")
        .body(chat("claude-sonnet-4-5"))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);

    let to_openai = openai.received();
    assert_eq!(to_openai.len(), 1);
    let r = &to_openai[0];
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(r.values("authorization"), [format!("Bearer {OPENAI_KEY}")]);
    assert!(r.values("x-api-key").is_empty(), "{:?}", r.headers);
    assert!(r.values("api-key").is_empty(), "{:?}", r.headers);
    assert!(r.values("anthropic-version").is_empty(), "{:?}", r.headers);
    assert_no_secret(r, &[ANTHROPIC_KEY, CLIENT_KEY]);

    let to_anthropic = anthropic.received();
    assert_eq!(to_anthropic.len(), 2);
    for (r, version) in to_anthropic.iter().zip(["2023-06-01", "2099-01-01"]) {
        assert_eq!(r.path, "/v1/messages");
        assert_eq!(r.values("x-api-key"), [ANTHROPIC_KEY]);
        assert_eq!(r.values("anthropic-version"), [version]);
        assert!(r.values("authorization").is_empty(), "{:?}", r.headers);
        assert!(r.values("api-key").is_empty(), "{:?}", r.headers);
        assert_no_secret(r, &[OPENAI_KEY, CLIENT_KEY]);
    }

    let shown = stats(&client, &url).await;
    assert_eq!(shown["providers"][0]["kind"], "openai");
    assert_eq!(shown["providers"][0]["limit_headers"], "openai");
    assert_eq!(shown["providers"][1]["kind"], "anthropic");
    assert_eq!(shown["providers"][1]["usage_format"], "anthropic");
    assert!(!shown.to_string().contains(ANTHROPIC_KEY));
    gw.shutdown().await;
    openai.stop().await;
    anthropic.stop().await;
}

#[tokio::test]
async fn without_a_configured_key_the_clients_credentials_pass_through() {
    let upstream = FakeUpstream::start().await;
    let gw = start(&format!(
        "[[providers]]\nname = \"local\"\nbase_url = \"{}\"\n",
        upstream.base_url()
    ))
    .await;
    let sent = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.url()))
        .header("authorization", format!("Bearer {CLIENT_KEY}"))
        .header("x-api-key", CLIENT_KEY)
        .body(chat("llama3"))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);
    let r = &upstream.received()[0];
    assert_eq!(r.values("authorization"), [format!("Bearer {CLIENT_KEY}")]);
    assert_eq!(r.values("x-api-key"), [CLIENT_KEY]);
    assert!(r.values("anthropic-version").is_empty());
    gw.shutdown().await;
    upstream.stop().await;
}

#[test]
fn a_preset_sets_defaults_that_fields_written_by_hand_override() {
    let base = "[[providers]]\nname = \"p\"\nbase_url = \"http://127.0.0.1:9\"\n";
    let provider = |extra: &str| settings(&format!("{base}{extra}")).providers[0].clone();

    // No kind: what the proxy did before presets.
    let p = provider("api_key_env = \"OPENAI_API_KEY\"");
    assert_eq!(p.kind, Kind::OpenAiCompatible);
    let credential = p.credential.unwrap();
    assert_eq!(credential.header, "authorization");
    assert_eq!(credential.value, format!("Bearer {OPENAI_KEY}").as_str());
    assert_eq!(p.anthropic_version, None);
    assert_eq!(p.limit_headers, LimitHeaders::OpenAi);
    assert_eq!(p.usage_format, UsageFormat::OpenAi);

    let p = provider("kind = \"anthropic\"\napi_key_env = \"ANTHROPIC_API_KEY\"");
    let credential = p.credential.unwrap();
    assert_eq!(credential.header, "x-api-key");
    assert_eq!(credential.value, ANTHROPIC_KEY);
    assert_eq!(p.anthropic_version.unwrap(), "2023-06-01");
    assert_eq!(p.limit_headers, LimitHeaders::Anthropic);
    assert_eq!(p.usage_format, UsageFormat::Anthropic);

    // Each default replaced by hand.
    let p = provider(
        "kind = \"anthropic\"\napi_key_env = \"ANTHROPIC_API_KEY\"\n\
         api_key_header = \"authorization\"\nanthropic_version = \"2024-10-22\"\n\
         limit_headers = \"ietf\"",
    );
    let credential = p.credential.unwrap();
    assert_eq!(credential.header, "authorization");
    assert_eq!(credential.value, format!("Bearer {ANTHROPIC_KEY}").as_str());
    assert_eq!(p.anthropic_version.unwrap(), "2024-10-22");
    assert_eq!(p.limit_headers, LimitHeaders::Ietf);

    let p = provider("kind = \"openai\"");
    assert_eq!(p.kind, Kind::OpenAi);
    assert!(p.credential.is_none());
    assert_eq!(p.anthropic_version, None);
}

#[test]
fn a_kind_knows_its_endpoints_behind_any_base_path() {
    let at = |kind: Kind, path: &str| kind.endpoint(path).map(|e| (e.path, e.usage));
    assert_eq!(
        at(Kind::OpenAi, "/v1/chat/completions"),
        Some(("/v1/chat/completions", true))
    );
    assert_eq!(
        at(Kind::OpenAiCompatible, "/api/v1/embeddings"),
        Some(("/v1/embeddings", true))
    );
    assert_eq!(
        at(Kind::Anthropic, "/v1/messages/count_tokens"),
        Some(("/v1/messages/count_tokens", false))
    );
    assert_eq!(
        at(Kind::Anthropic, "/v1/messages"),
        Some(("/v1/messages", true))
    );
    assert_eq!(at(Kind::Anthropic, "/v1/chat/completions"), None);
    assert_eq!(at(Kind::OpenAi, "/v1/models"), None);
    assert_eq!(at(Kind::OpenAi, "/xv1/completions"), None);
}

#[test]
fn bad_kinds_versions_and_aliases_are_refused_naming_the_field() {
    let base = "[[providers]]\nname = \"p\"\nbase_url = \"http://127.0.0.1:9\"\n";
    let long = "m".repeat(201);
    let cases: Vec<(&str, String)> = vec![
        ("providers[0].kind", "kind = \"gemini\"".into()),
        ("providers[0].limit_headers", "limit_headers = \"x\"".into()),
        (
            "providers[0].anthropic_version",
            "anthropic_version = \"\"".into(),
        ),
        (
            "providers[0].anthropic_version",
            "anthropic_version = \"2023 06\"".into(),
        ),
        (
            r#"providers[0].aliases[""]"#,
            "aliases = { \"\" = \"gpt-4o\" }".into(),
        ),
        (
            r#"providers[0].aliases["a"]"#,
            "aliases = { \"a\" = \"\" }".into(),
        ),
        (
            r#"providers[0].aliases["a"]"#,
            format!("aliases = {{ \"a\" = \"{long}\" }}"),
        ),
        (
            r#"providers[0].aliases["a\u{7}"]"#,
            "aliases = { \"a\\u0007\" = \"gpt-4o\" }".into(),
        ),
        (
            r#"providers[0].aliases["a"]"#,
            "aliases = { \"a\" = \"gpt\\u202e\" }".into(),
        ),
        (
            r#"providers[0].aliases["gpt-*"]"#,
            "aliases = { \"gpt-*\" = \"gpt-4o\" }".into(),
        ),
        (
            r#"providers[0].aliases["a"]"#,
            "aliases = { \"a\" = \"*\" }".into(),
        ),
        // A chain: "a" leads to "b", itself an alias.
        (
            r#"providers[0].aliases["a"]"#,
            "aliases = { \"a\" = \"b\", \"b\" = \"c\" }".into(),
        ),
    ];
    for (field, extra) in cases {
        let toml = format!("{base}{extra}\n");
        match Settings::from_toml(&toml, &env) {
            Ok(_) => panic!("accepted:\n{toml}"),
            Err(e) => assert_eq!(e.field, field, "{e}\n{toml}"),
        }
    }
    // What is allowed: a name mapped to itself, and `*` beside names.
    let table = BTreeMap::from([
        ("gpt-4o".to_owned(), "gpt-4o".to_owned()),
        ("*".to_owned(), "one".to_owned()),
        ("4o".to_owned(), "gpt-4o".to_owned()),
    ]);
    let aliases = Aliases::check(&table).unwrap();
    assert_eq!(aliases.resolve(Some("4o")).map(|m| &**m), Some("gpt-4o"));
    assert_eq!(aliases.resolve(Some("other")).map(|m| &**m), Some("one"));
    assert_eq!(aliases.resolve(None).map(|m| &**m), Some("one"));
}

// ---------------------------------------------------------------- aliases

#[tokio::test]
async fn two_spellings_of_an_aliased_model_share_one_quota() {
    let upstream = FakeUpstream::start().await;
    let gw = start(&limited(
        &upstream,
        r#"aliases = { "gpt-4o" = "gpt-4o-2024-08-06" }"#,
        1,
    ))
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    // The model an alias leads to is a route the configuration names:
    // counted by name before any answer.
    let one = client
        .get(format!("{}/stats?route=openai/gpt-4o-2024-08-06", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(one.status(), 200);

    assert_eq!(post(&client, &url, chat("gpt-4o")).await.status(), 200);
    // The other spelling finds the quota the first one spent.
    let refused = post(&client, &url, chat("gpt-4o-2024-08-06")).await;
    assert_eq!(refused.status(), 429);
    let refused: Value = serde_json::from_slice(&refused.bytes().await.unwrap()).unwrap();
    assert_eq!(refused["error"]["code"], "rate_limited");
    // A model without an alias keeps its own quota.
    assert_eq!(post(&client, &url, chat("gpt-4o-mini")).await.status(), 200);

    // The body went upstream as the client wrote it.
    let received = upstream.received();
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].body, chat("gpt-4o").as_bytes());

    let shown = stats(&client, &gw.url()).await;
    let names = route_names(&shown);
    assert!(
        !names.iter().any(|n| n == "openai/gpt-4o"),
        "the alias is not a route of its own: {names:?}"
    );
    let resolved = route(&shown, "openai/gpt-4o-2024-08-06");
    assert_eq!(resolved["rate_limit"]["admitted"], 1);
    assert_eq!(resolved["rate_limit"]["rejected"], 1);
    assert_eq!(resolved["upstream"]["ok"], 1);
    // Asked for by its alias, a route answers as the route it is.
    let one = client
        .get(format!("{}/stats?route=openai/gpt-4o", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(one.status(), 200);
    let one: Value = serde_json::from_slice(&one.bytes().await.unwrap()).unwrap();
    assert_eq!(one["route"], "openai/gpt-4o-2024-08-06");
    assert_eq!(one["rate_limit"]["admitted"], 1);
    gw.shutdown().await;
    upstream.stop().await;
}

#[tokio::test]
async fn a_star_alias_counts_every_model_and_a_body_naming_none_as_one() {
    let upstream = FakeUpstream::start().await;
    let gw = start(&limited(&upstream, r#"aliases = { "*" = "the-model" }"#, 2)).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());

    assert_eq!(post(&client, &url, chat("made-up-1")).await.status(), 200);
    assert_eq!(
        post(&client, &url, r#"{"messages":[]}"#.to_owned())
            .await
            .status(),
        200
    );
    assert_eq!(post(&client, &url, chat("made-up-2")).await.status(), 429);
    // A request without a body to send names no model, aliased or not.
    let listed = client
        .get(format!("{}/v1/models", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);

    let shown = stats(&client, &gw.url()).await;
    let model = route(&shown, "openai/the-model");
    assert_eq!(model["rate_limit"]["admitted"], 2);
    assert_eq!(model["rate_limit"]["rejected"], 1);
    assert!(
        !route_names(&shown).iter().any(|n| n.contains("made-up")),
        "{shown}"
    );
    gw.shutdown().await;
    upstream.stop().await;
}

#[tokio::test]
async fn a_reload_applies_alias_changes() {
    let upstream = FakeUpstream::start().await;
    let gw = start(&limited(&upstream, "", 1)).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());

    assert_eq!(post(&client, &url, chat("gpt-4o")).await.status(), 200);
    gw.gateway
        .apply(settings(&limited(
            &upstream,
            r#"aliases = { "gpt-4o-latest" = "gpt-4o" }"#,
            1,
        )))
        .unwrap();
    // Counted under gpt-4o now, whose one request is spent.
    assert_eq!(
        post(&client, &url, chat("gpt-4o-latest")).await.status(),
        429
    );

    gw.gateway
        .apply(settings(&limited(&upstream, "", 1)))
        .unwrap();
    // Its own route again, with its own quota.
    assert_eq!(
        post(&client, &url, chat("gpt-4o-latest")).await.status(),
        200
    );
    gw.shutdown().await;
    upstream.stop().await;
}

// ---------------------------------------------------------------- the OpenAI SDK

/// What openai-python 1.x (over httpx 0.28) sends for
/// `client.chat.completions.create(model=..., messages=..., stream=True,
/// stream_options={"include_usage": True})`, in its order; `connection`
/// concerns one hop and `content-length` is the body's.
const SDK_HEADERS: [(&str, &str); 14] = [
    ("accept-encoding", "gzip, deflate"),
    ("connection", "keep-alive"),
    ("accept", "application/json"),
    ("content-type", "application/json"),
    ("user-agent", "OpenAI/Python 1.54.4"),
    ("x-stainless-lang", "python"),
    ("x-stainless-package-version", "1.54.4"),
    ("x-stainless-os", "Linux"),
    ("x-stainless-arch", "x64"),
    ("x-stainless-runtime", "CPython"),
    ("x-stainless-runtime-version", "3.12.7"),
    ("authorization", "Bearer sk-clients-own-Rw9d"),
    ("x-stainless-async", "false"),
    ("x-stainless-retry-count", "0"),
];

const SDK_BODY: &str = r#"{"messages":[{"role":"user","content":"Say hi"}],"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true}}"#;

/// OpenAI's answer to it, one write per event: a role chunk, a content
/// chunk, the finish chunk, the usage chunk (no choices), `[DONE]`.
const SSE_EVENTS: [&str; 5] = [
    "data: {\"id\":\"chatcmpl-AZ1\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-AZ1\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi! \u{1f44b}\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-AZ1\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-AZ1\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,\"total_tokens\":13,\"prompt_tokens_details\":{\"cached_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n",
    "data: [DONE]\n\n",
];

#[tokio::test]
async fn an_openai_sdk_stream_passes_through_unchanged_chunk_by_chunk() {
    let upstream = FakeUpstream::start().await;
    let gw = start(&format!(
        "[[providers]]\nname = \"openai\"\nkind = \"openai\"\nbase_url = \"{}\"\n\
         api_key_env = \"OPENAI_API_KEY\"\n",
        upstream.base_url()
    ))
    .await;
    let events = upstream.stream_next(vec![
        ("content-type", "text/event-stream; charset=utf-8"),
        ("openai-processing-ms", "182"),
        ("x-request-id", "req_5f1e"),
    ]);

    // hyper sends the headers given and no others (but Host).
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut request = http::Request::post(format!("{}/v1/chat/completions", gw.url()));
    for (name, value) in SDK_HEADERS {
        request = request.header(name, value);
    }
    let request = request
        .header("content-length", SDK_BODY.len())
        .body(Full::new(Bytes::from_static(SDK_BODY.as_bytes())))
        .unwrap();
    let bound = Duration::from_secs(10);
    let response = tokio::time::timeout(bound, client.request(request))
        .await
        .expect("response head within 10 s")
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream; charset=utf-8"
    );
    assert_eq!(response.headers()["openai-processing-ms"], "182");
    assert_eq!(response.headers()["x-request-id"], "req_5f1e");

    // Each event reaches the client before the next is written upstream,
    // byte for byte: nothing is buffered, nothing rewritten.
    let mut body = response.into_body();
    for event in SSE_EVENTS {
        events
            .unbounded_send(Ok(Bytes::from_static(event.as_bytes())))
            .unwrap();
        let mut got = Vec::new();
        while got.len() < event.len() {
            let frame = tokio::time::timeout(bound, body.frame())
                .await
                .expect("the event within 10 s")
                .expect("the stream ends after the event")
                .unwrap();
            got.extend_from_slice(&frame.into_data().unwrap_or_default());
        }
        assert_eq!(String::from_utf8_lossy(&got), event);
    }
    drop(events);
    let end = tokio::time::timeout(bound, body.frame())
        .await
        .expect("the end within 10 s");
    assert!(end.is_none(), "nothing after [DONE]: {end:?}");
    // The usage is in the last chunk before [DONE], as the SDK reads it.
    let usage: Value =
        serde_json::from_str(SSE_EVENTS[3].trim().trim_start_matches("data: ")).unwrap();
    assert_eq!(usage["usage"]["total_tokens"], 13);

    // Upstream: the SDK's body byte for byte, its headers as sent, the
    // gateway's key instead of the client's.
    let received = upstream.received();
    assert_eq!(received.len(), 1);
    let r = &received[0];
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(r.body, SDK_BODY.as_bytes());
    for (name, value) in SDK_HEADERS {
        match name {
            "connection" => {}
            "authorization" => {
                assert_eq!(r.values(name), [format!("Bearer {OPENAI_KEY}")]);
            }
            _ => assert_eq!(r.values(name), [value], "{name}"),
        }
    }
    assert_eq!(r.values("content-length"), [SDK_BODY.len().to_string()]);
    assert_no_secret(r, &[CLIENT_KEY]);
    gw.shutdown().await;
    upstream.stop().await;
}

// ---------------------------------------------------------------- the README

#[test]
fn the_readmes_provider_configs_load() {
    let readme = include_str!("../../../README.md");
    let section = readme
        .split("#### Pointing the proxy at real providers")
        .nth(1)
        .expect("the README's section")
        .split("\n### ")
        .next()
        .unwrap()
        .split("\n#### ")
        .next()
        .unwrap();
    let blocks: Vec<&str> = section
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(blocks.len(), 4, "OpenAI, Anthropic, Azure, a local server");
    let mut kinds = Vec::new();
    for toml in blocks {
        let settings = Settings::from_toml(toml, &env).unwrap_or_else(|e| panic!("{e}\n{toml}"));
        kinds.push(settings.providers[0].kind);
    }
    assert_eq!(
        kinds,
        [
            Kind::OpenAi,
            Kind::Anthropic,
            Kind::AzureOpenAi,
            Kind::OpenAiCompatible
        ]
    );
}

#[test]
fn the_commented_provider_fields_of_proxy_toml_load_uncommented() {
    let text = config::DEFAULT_CONFIG;
    let start = text.find("\n[[providers]]").expect("a providers entry");
    let end = text
        .find("\n# Per-route request rates")
        .expect("the rate limits");
    let field = |line: &str| {
        let name: String = line.chars().take_while(|c| *c != ' ').collect();
        // A private CA's file is not on this machine (tests/proxy_tls.rs
        // loads those fields with a CA of its own).
        if matches!(name.as_str(), "ca_file" | "insecure_skip_verify") {
            return false;
        }
        line.starts_with("[[providers]]")
            || line.starts_with("[[routes]]")
            || line.starts_with("[[clients]]")
            || (!name.is_empty()
                && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                && line[name.len()..].starts_with(" = "))
    };
    let mut uncommented = String::new();
    let mut count = 0;
    for line in text[start..end].lines() {
        match line.strip_prefix("# ") {
            Some(rest) if field(rest) => {
                uncommented.push_str(rest);
                count += 1;
            }
            _ => uncommented.push_str(line),
        }
        uncommented.push('\n');
    }
    assert!(count > 15, "{uncommented}");
    let env = |name: &str| {
        env(name)
            .or_else(|| matches!(name, "SIM_API_KEY" | "OPENAI_API_KEY_B").then(|| "k".to_owned()))
            .or_else(|| {
                (name == "SEARCH_TEAM_KEY").then(|| "search-team-key-0123456789".to_owned())
            })
    };
    let toml = format!("[simulator]\n{uncommented}");
    let settings = Settings::from_toml(&toml, &env).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let kinds: Vec<Kind> = settings.providers.iter().map(|p| p.kind).collect();
    assert_eq!(
        kinds,
        [
            Kind::OpenAiCompatible,
            Kind::OpenAi,
            Kind::Anthropic,
            // A second OpenAI key, a deployment of the route below.
            Kind::OpenAi,
            Kind::OpenAiCompatible,
            // The private-CA example (HTTPS).
            Kind::OpenAiCompatible,
        ]
    );
    assert_eq!(settings.routes.len(), 1);
    assert_eq!(settings.clients.len(), 1);
}

#[tokio::test]
async fn rewrite_model_sends_the_model_an_alias_resolves_to_and_nothing_else_changes() {
    let upstream = FakeUpstream::start().await;
    let gw = start(&limited(
        &upstream,
        "aliases = { \"gpt-4o\" = \"gpt-4o-2024-08-06\" }\nrewrite_model = true",
        10,
    ))
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    let written = r#"{"temperature":1.50,"model":"gpt-4o","messages":[{"role":"user","content":"hi \u00e9"}],"n":1e0}"#;
    assert_eq!(post(&client, &url, written.to_owned()).await.status(), 200);
    // A model without an alias, and the resolved name itself, go as sent.
    let plain = chat("gpt-4o-mini");
    assert_eq!(post(&client, &url, plain.clone()).await.status(), 200);
    let exact = chat("gpt-4o-2024-08-06");
    assert_eq!(post(&client, &url, exact.clone()).await.status(), 200);

    let received = upstream.received();
    assert_eq!(received.len(), 3);
    assert_eq!(
        String::from_utf8_lossy(&received[0].body),
        r#"{"temperature":1.50,"model":"gpt-4o-2024-08-06","messages":[{"role":"user","content":"hi \u00e9"}],"n":1e0}"#,
        "only the model changed; every other member as written, in order"
    );
    assert_eq!(received[1].body, plain.as_bytes());
    assert_eq!(received[2].body, exact.as_bytes());
    gw.shutdown().await;
    upstream.stop().await;
}

#[test]
fn rewrite_model_leaves_what_is_not_an_object_naming_a_model_alone() {
    use proxy::preset::rewrite_model;
    assert_eq!(rewrite_model(br#"{"messages":[]}"#, "m"), None);
    assert_eq!(rewrite_model(br#"[{"model":"a"}]"#, "m"), None);
    assert_eq!(rewrite_model(b"not json", "m"), None);
    assert_eq!(
        rewrite_model(br#" { "model" : "a" , "x" : {"model":"a"} } "#, "m\"q").as_deref(),
        Some(&br#"{"model":"m\"q","x":{"model":"a"}}"#[..]),
        "only the top-level model, its new name escaped"
    );
}

#[test]
fn rewrite_model_without_aliases_is_a_config_error() {
    let toml =
        "[[providers]]\nname = \"p\"\nbase_url = \"http://127.0.0.1:9\"\nrewrite_model = true\n";
    let error = Settings::from_toml(toml, &env).unwrap_err().to_string();
    assert!(error.contains("providers[0].rewrite_model"), "{error}");
}

#[tokio::test]
async fn azure_gets_its_api_key_an_api_version_and_is_limited_per_deployment() {
    let openai = FakeUpstream::start().await;
    let azure = FakeUpstream::start().await;
    let toml = format!(
        r#"
[[providers]]
name = "openai"
kind = "openai"
base_url = "{}"
api_key_env = "OPENAI_API_KEY"

[[providers]]
name = "azure"
kind = "azure_openai"
base_url = "{}"
api_key_env = "AZURE_OPENAI_API_KEY"

[rate_limit]
mode = "reject"
quotas = [{{ limit = 1, period = "1m" }}]
"#,
        openai.base_url(),
        azure.base_url()
    );
    let gw = start(&toml).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    let send = |path: &str, model: &str| {
        client
            .post(format!("{url}{path}"))
            .header("authorization", format!("Bearer {CLIENT_KEY}"))
            .header("api-key", CLIENT_KEY)
            .header("content-type", "application/json")
            .body(chat(model))
            .send()
    };
    let deployments = "/azure/openai/deployments";
    // The deployment is the model, whatever the body names; the default
    // api-version is added.
    let first = send(&format!("{deployments}/gpt4o-prod/chat/completions"), "x").await;
    assert_eq!(first.unwrap().status(), 200);
    // The same deployment, another body model: the same route, refused.
    let again = send(&format!("{deployments}/gpt4o-prod/chat/completions"), "y").await;
    assert_eq!(again.unwrap().status(), 429);
    // Another deployment, with the client's own api-version, kept.
    let other = send(
        &format!("{deployments}/gpt4o-mini/chat/completions?api-version=2025-01-01-preview"),
        "x",
    )
    .await;
    assert_eq!(other.unwrap().status(), 200);
    let plain = send("/openai/v1/chat/completions", "gpt-4o").await;
    assert_eq!(plain.unwrap().status(), 200);

    let to_azure = azure.received();
    assert_eq!(to_azure.len(), 2);
    assert_eq!(
        to_azure[0].path,
        "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"
    );
    assert_eq!(
        to_azure[1].path,
        "/openai/deployments/gpt4o-mini/chat/completions?api-version=2025-01-01-preview"
    );
    for r in &to_azure {
        assert_eq!(r.values("api-key"), [AZURE_KEY]);
        assert!(r.values("authorization").is_empty(), "{:?}", r.headers);
        assert_no_secret(r, &[OPENAI_KEY, CLIENT_KEY]);
    }
    let to_openai = openai.received();
    assert_eq!(to_openai.len(), 1);
    assert_eq!(to_openai[0].path, "/v1/chat/completions");
    assert_eq!(
        to_openai[0].values("authorization"),
        [format!("Bearer {OPENAI_KEY}")]
    );
    assert!(to_openai[0].values("api-key").is_empty());
    assert_no_secret(&to_openai[0], &[AZURE_KEY, CLIENT_KEY]);

    let shown = stats(&client, &url).await;
    let names = route_names(&shown);
    assert!(names.iter().any(|n| n == "azure/gpt4o-prod"), "{names:?}");
    assert!(names.iter().any(|n| n == "azure/gpt4o-mini"), "{names:?}");
    assert_eq!(shown["providers"][1]["kind"], "azure_openai");
    assert!(!shown.to_string().contains(AZURE_KEY));
    gw.shutdown().await;
    openai.stop().await;
    azure.stop().await;
}

#[test]
fn azure_deployments_and_api_versions_are_read_and_checked() {
    use proxy::preset::deployment;
    assert_eq!(
        deployment("/openai/deployments/d1/chat/completions"),
        Some("d1")
    );
    assert_eq!(
        deployment("/base/openai/deployments/d1/embeddings"),
        Some("d1")
    );
    assert_eq!(deployment("/openai/deployments//chat/completions"), None);
    assert_eq!(deployment("/openai/v1/chat/completions"), None);
    let with = |version: &str| {
        format!(
            "[[providers]]\nname = \"a\"\nkind = \"azure_openai\"\nbase_url = \"http://127.0.0.1:9\"\napi_version = {version:?}\n"
        )
    };
    assert_eq!(
        settings(&with("2025-01-01-preview")).providers[0]
            .api_version
            .as_deref(),
        Some("2025-01-01-preview")
    );
    for bad in ["", "2024&x=1", "a b", "2024#"] {
        let error = Settings::from_toml(&with(bad), &env)
            .unwrap_err()
            .to_string();
        assert!(error.contains("providers[0].api_version"), "{bad}: {error}");
    }
}
