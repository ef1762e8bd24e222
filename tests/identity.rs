//! IdentityHeaderLayer: which requests a rule matches, what it sets and in
//! which order, ULID request ids, validation when built, secrets kept out of
//! `Debug`, and configuration from TOML.

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::{Ready, ready};

use http::{HeaderMap, HeaderValue, Request};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::error::ConfigError;
use tower_throttle::identity::{
    DEFAULT_CLIENT_ID_HEADER, DEFAULT_PROJECT_ID_HEADER, DEFAULT_REQUEST_ID_HEADER,
    DEFAULT_SESSION_ID_HEADER, IdentityConfig, IdentityHeaderLayer, Rule, Ulid,
};

const SECRET: &str = "sk-live-5ecret-0123456789abcdef";

// ---------------------------------------------------------------- helpers

/// The inner service: echoes the request back, so a test sees what was sent.
fn echo() -> impl Service<
    Request<()>,
    Response = Request<()>,
    Error = Infallible,
    Future = Ready<Result<Request<()>, Infallible>>,
> + Clone
+ std::fmt::Debug {
    tower::service_fn(|req: Request<()>| ready(Ok::<_, Infallible>(req)))
}

/// `req` as the inner service receives it through `layer`.
fn send(layer: &IdentityHeaderLayer, req: Request<()>) -> Request<()> {
    futures::executor::block_on(layer.layer(echo()).oneshot(req)).unwrap()
}

fn get(url: &str) -> Request<()> {
    Request::get(url).body(()).unwrap()
}

fn layer(rules: impl IntoIterator<Item = Rule>) -> IdentityHeaderLayer {
    IdentityHeaderLayer::new(rules).expect("valid test rules")
}

/// The user agent `layer` gives a GET of `url`, if it sets one.
fn ua_for(layer: &IdentityHeaderLayer, url: &str) -> Option<String> {
    send(layer, get(url))
        .headers()
        .get("user-agent")
        .map(|v| v.to_str().unwrap().to_owned())
}

/// Every header as (name, raw bytes), in map order.
fn raw(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

fn build_err(rules: impl IntoIterator<Item = Rule>) -> ConfigError {
    IdentityHeaderLayer::new(rules).expect_err("rules should be refused")
}

fn is_crockford_ulid(text: &str) -> bool {
    text.len() == 26
        && text
            .bytes()
            .all(|b| b"0123456789ABCDEFGHJKMNPQRSTVWXYZ".contains(&b))
        && text.as_bytes()[0] <= b'7' // 128 bits: the first character holds 3
}

// ---------------------------------------------------------------- matching

#[test]
fn exact_host_matches_only_that_host_in_any_case() {
    let l = layer([Rule::new().host("api.example.com").user_agent("A")]);
    assert_eq!(
        ua_for(&l, "https://api.example.com/x").as_deref(),
        Some("A")
    );
    assert_eq!(
        ua_for(&l, "https://API.Example.COM/x").as_deref(),
        Some("A")
    );
    assert_eq!(
        ua_for(&l, "https://api.example.com:8443/").as_deref(),
        Some("A")
    );
    assert_eq!(
        ua_for(&l, "https://api.example.com./").as_deref(),
        Some("A")
    );
    assert_eq!(ua_for(&l, "https://eu.api.example.com/x"), None);
    assert_eq!(ua_for(&l, "https://example.com/x"), None);
    assert_eq!(ua_for(&l, "https://api.example.com.evil.test/x"), None);
}

#[test]
fn exact_host_rule_reads_the_host_header_of_a_server_request() {
    let l = layer([Rule::new().host("api.example.com").user_agent("A")]);
    let req = Request::get("/v1/chat")
        .header("host", "api.example.com:8080")
        .body(())
        .unwrap();
    assert_eq!(send(&l, req).headers()["user-agent"], "A");
}

#[test]
fn suffix_host_matches_subdomains_at_any_depth_but_not_the_apex() {
    let l = layer([Rule::new().host("*.example.com").user_agent("S")]);
    assert_eq!(ua_for(&l, "https://api.example.com/").as_deref(), Some("S"));
    assert_eq!(
        ua_for(&l, "https://a.b.c.example.com/").as_deref(),
        Some("S")
    );
    assert_eq!(ua_for(&l, "https://EU.Example.com/").as_deref(), Some("S"));
    assert_eq!(ua_for(&l, "https://example.com/"), None);
    assert_eq!(ua_for(&l, "https://notexample.com/"), None);
    assert_eq!(ua_for(&l, "https://example.com.evil.test/"), None);
}

/// Found by the `identity_urls` fuzz target: a host starting with a dot
/// (an empty first label) was taken for a subdomain.
#[test]
fn suffix_host_does_not_match_a_host_with_an_empty_first_label() {
    let l = layer([Rule::new().host("*.example.com").user_agent("S")]);
    assert_eq!(ua_for(&l, "https://.example.com/"), None);
    assert_eq!(ua_for(&l, "https://a.example.com/").as_deref(), Some("S"));
}

#[test]
fn path_prefix_matches_the_start_of_the_path_only() {
    let l = layer([Rule::new().path_prefix("/v1/chat").user_agent("P")]);
    assert_eq!(ua_for(&l, "https://h.test/v1/chat").as_deref(), Some("P"));
    assert_eq!(
        ua_for(&l, "https://h.test/v1/chat/completions").as_deref(),
        Some("P")
    );
    assert_eq!(
        ua_for(&l, "https://other.test/v1/chat?x=1").as_deref(),
        Some("P")
    );
    assert_eq!(ua_for(&l, "https://h.test/v2/chat"), None);
    assert_eq!(ua_for(&l, "https://h.test/api/v1/chat"), None);
    assert_eq!(ua_for(&l, "https://h.test/?p=/v1/chat"), None);
}

#[test]
fn path_glob_matches_the_whole_path() {
    let l = layer([Rule::new().path_glob("/v?/*/completions").user_agent("G")]);
    assert_eq!(
        ua_for(&l, "https://h.test/v1/chat/completions").as_deref(),
        Some("G")
    );
    assert_eq!(
        ua_for(&l, "https://h.test/v2/a/b/completions").as_deref(),
        Some("G")
    );
    assert_eq!(
        ua_for(&l, "https://h.test/v1/chat/completions?stream=1").as_deref(),
        Some("G")
    );
    assert_eq!(ua_for(&l, "https://h.test/v10/chat/completions"), None);
    assert_eq!(ua_for(&l, "https://h.test/v1/chat/completions/x"), None);
    assert_eq!(ua_for(&l, "https://h.test/api/v1/chat/completions"), None);
}

#[test]
fn substring_matches_anywhere_in_the_whole_url_query_included() {
    let l = layer([Rule::new().url_contains("openai").user_agent("U")]);
    assert_eq!(
        ua_for(&l, "https://api.openai.com/v1").as_deref(),
        Some("U")
    );
    assert_eq!(
        ua_for(&l, "https://proxy.test/openai/v1").as_deref(),
        Some("U")
    );
    assert_eq!(
        ua_for(&l, "https://proxy.test/v1?provider=openai").as_deref(),
        Some("U")
    );
    assert_eq!(
        ua_for(&l, "https://proxy.test/OpenAI/v1"),
        None,
        "case-sensitive"
    );
    assert_eq!(ua_for(&l, "https://anthropic.test/v1"), None);
}

#[test]
fn every_condition_of_a_rule_must_hold() {
    let l = layer([Rule::new()
        .host("*.example.com")
        .path_prefix("/v1/")
        .url_contains("stream=1")
        .user_agent("ALL")]);
    assert_eq!(
        ua_for(&l, "https://api.example.com/v1/x?stream=1").as_deref(),
        Some("ALL")
    );
    assert_eq!(ua_for(&l, "https://api.example.com/v1/x?stream=0"), None);
    assert_eq!(ua_for(&l, "https://api.example.com/v2/x?stream=1"), None);
    assert_eq!(ua_for(&l, "https://api.other.com/v1/x?stream=1"), None);
}

#[test]
fn first_matching_rule_applies_whatever_kind_of_rule_it_is() {
    let l = layer([
        Rule::new()
            .url_contains("/special/")
            .user_agent("0-substring"),
        Rule::new()
            .host("*.example.com")
            .path_prefix("/v2/")
            .user_agent("1-suffix"),
        Rule::new().host("api.example.com").user_agent("2-exact"),
        Rule::new().host("*.example.com").user_agent("3-suffix"),
        Rule::new()
            .host("*.api.example.com")
            .user_agent("4-deeper-suffix"),
        Rule::new().user_agent("5-catch-all"),
    ]);
    let ua = |url| ua_for(&l, url).unwrap();
    assert_eq!(ua("https://api.example.com/special/x"), "0-substring");
    assert_eq!(ua("https://api.example.com/v2/x"), "1-suffix");
    assert_eq!(ua("https://api.example.com/v1/x"), "2-exact");
    assert_eq!(ua("https://www.example.com/v1/x"), "3-suffix");
    // A later, more specific suffix does not beat an earlier one.
    assert_eq!(ua("https://eu.api.example.com/v1/x"), "3-suffix");
    assert_eq!(ua("https://elsewhere.test/"), "5-catch-all");
    assert_eq!(
        l.matching_rule(&get("https://eu.api.example.com/")),
        Some(3)
    );
}

#[test]
fn a_rule_that_sets_nothing_shields_its_requests_from_later_rules() {
    let l = layer([
        Rule::named("leave health checks alone").path_prefix("/health"),
        Rule::new().user_agent("agent"),
    ]);
    let req = Request::get("https://h.test/health")
        .header("user-agent", "probe")
        .body(())
        .unwrap();
    assert_eq!(send(&l, req).headers()["user-agent"], "probe");
    assert_eq!(ua_for(&l, "https://h.test/v1").as_deref(), Some("agent"));
}

#[test]
fn unmatched_request_keeps_its_headers_byte_for_byte() {
    let l = layer([Rule::new()
        .host("api.example.com")
        .user_agent("A")
        .request_id()
        .session_id()
        .header("x-api-key", SECRET)]);
    let mut req = Request::get("https://other.example.com/v1?q=1")
        .header("user-agent", "original/1.0")
        .header("accept", "application/json")
        .header("x-multi", "one")
        .header("x-multi", "two")
        .header("x-request-id", "caller-chosen")
        .header(
            "x-bytes",
            HeaderValue::from_bytes(b"caf\xe9 \t latin-1").unwrap(),
        )
        .body(())
        .unwrap();
    req.headers_mut()
        .insert("authorization", HeaderValue::from_static("Bearer caller"));
    let before = raw(req.headers());
    let sent = send(&l, req);
    assert_eq!(raw(sent.headers()), before);
    assert!(
        !sent.headers()["authorization"].is_sensitive(),
        "flags untouched too"
    );
}

#[test]
fn no_rules_at_all_leaves_every_request_alone() {
    let l = layer([]);
    assert_eq!(l.rule_count(), 0);
    let req = Request::get("https://h.test/")
        .header("user-agent", "x")
        .body(())
        .unwrap();
    let before = raw(req.headers());
    assert_eq!(raw(send(&l, req).headers()), before);
}

#[test]
fn a_thousand_rules_find_the_right_one_by_host() {
    let rules = (0..1000).map(|i| {
        let rule = if i % 2 == 0 {
            Rule::new().host(format!("svc{i}.example.com"))
        } else {
            Rule::new().host(format!("*.tenant{i}.example.net"))
        };
        rule.path_prefix("/v1/").user_agent(format!("ua-{i}"))
    });
    let l = layer(rules);
    assert_eq!(l.rule_count(), 1000);
    assert_eq!(
        ua_for(&l, "https://svc0.example.com/v1/").as_deref(),
        Some("ua-0")
    );
    assert_eq!(
        ua_for(&l, "https://svc998.example.com/v1/x").as_deref(),
        Some("ua-998")
    );
    assert_eq!(
        ua_for(&l, "https://a.b.tenant999.example.net/v1/").as_deref(),
        Some("ua-999")
    );
    assert_eq!(ua_for(&l, "https://svc998.example.com/v2/x"), None);
    assert_eq!(ua_for(&l, "https://svc1.example.com/v1/"), None);
    assert_eq!(ua_for(&l, "https://tenant999.example.net/v1/"), None);
}

// ---------------------------------------------------------------- what a rule sets

#[test]
fn rule_replaces_user_agent_and_adds_ids_in_default_headers() {
    let l = layer([Rule::new()
        .user_agent("my-agent/1.4")
        .request_id()
        .client_id()
        .project_id()
        .session_id()]);
    let req = Request::get("https://h.test/")
        .header("user-agent", "reqwest/0.13")
        .header("user-agent", "second")
        .body(())
        .unwrap();
    let sent = send(&l, req);
    let h = sent.headers();
    let all: Vec<_> = h.get_all("user-agent").iter().collect();
    assert_eq!(all, ["my-agent/1.4"], "replaced, every value");
    let ids = l.stable_ids();
    assert!(is_crockford_ulid(
        h[DEFAULT_REQUEST_ID_HEADER].to_str().unwrap()
    ));
    assert_eq!(h[DEFAULT_CLIENT_ID_HEADER], ids.client.to_string());
    assert_eq!(h[DEFAULT_PROJECT_ID_HEADER], ids.project.to_string());
    assert_eq!(h[DEFAULT_SESSION_ID_HEADER], ids.session.to_string());
    assert_eq!(h.len(), 5);
}

#[test]
fn static_headers_override_user_agent_and_dynamic_ids_and_unrelated_headers_survive() {
    let l = layer([Rule::new()
        .user_agent("from-rule")
        .request_id()
        .session_id()
        .header("User-Agent", "from-static")
        .header("x-request-id", "fixed-request")
        .header("x-session-id", "fixed-session")
        .header("x-title", "My app")]);
    let req = Request::get("https://h.test/")
        .header("user-agent", "from-caller")
        .header("x-request-id", "from-caller")
        .header("x-title", "caller-title")
        .header("accept", "text/event-stream")
        .header("x-trace", "abc")
        .body(())
        .unwrap();
    let sent = send(&l, req);
    let h = sent.headers();
    let values = |name: &str| -> Vec<&str> {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    };
    assert_eq!(values("user-agent"), ["from-static"]);
    assert_eq!(values("x-request-id"), ["fixed-request"]);
    assert_eq!(values("x-session-id"), ["fixed-session"]);
    assert_eq!(values("x-title"), ["My app"]);
    assert_eq!(values("accept"), ["text/event-stream"]);
    assert_eq!(values("x-trace"), ["abc"]);
    assert_eq!(h.len(), 6);
}

#[test]
fn a_header_named_twice_in_one_rule_gets_both_values() {
    let l = layer([Rule::new()
        .header("x-tag", "a")
        .header("X-Tag", "b")
        .header("x-other", "c")]);
    let req = Request::get("https://h.test/")
        .header("x-tag", "caller")
        .body(())
        .unwrap();
    let sent = send(&l, req);
    let tags: Vec<_> = sent.headers().get_all("x-tag").iter().collect();
    assert_eq!(tags, ["a", "b"]);
}

#[test]
fn id_header_names_are_configurable_per_rule() {
    let l = layer([Rule::new()
        .request_id_header("X-Correlation-Id")
        .client_id_header("x-install")
        .project_id_header("x-workspace")
        .session_id_header("x-conversation")]);
    let sent = send(&l, get("https://h.test/"));
    let h = sent.headers();
    assert!(is_crockford_ulid(h["x-correlation-id"].to_str().unwrap()));
    assert_eq!(h["x-install"], l.stable_ids().client.to_string());
    assert_eq!(h["x-workspace"], l.stable_ids().project.to_string());
    assert_eq!(h["x-conversation"], l.stable_ids().session.to_string());
    assert!(!h.contains_key(DEFAULT_REQUEST_ID_HEADER));
    assert_eq!(h.len(), 4);
}

#[test]
fn stable_ids_hold_across_requests_clones_and_services_while_request_ids_change() {
    let l = layer([Rule::new().request_id().client_id().session_id()]);
    let l2 = l.clone();
    let a = send(&l, get("https://h.test/"));
    let b = send(&l2, get("https://h.test/"));
    for name in ["x-client-id", "x-session-id"] {
        assert_eq!(a.headers()[name], b.headers()[name]);
    }
    assert_ne!(a.headers()["x-request-id"], b.headers()["x-request-id"]);
    assert_ne!(l.stable_ids().client, l.stable_ids().session);

    let other = layer([Rule::new().session_id()]);
    assert_ne!(
        other.stable_ids().session,
        l.stable_ids().session,
        "per layer"
    );
}

#[test]
fn stable_ids_can_be_pinned() {
    let client = Ulid::from_string("01ARZ3NDEKTSV4RRFFQ69G5FAV").unwrap();
    let l = layer([Rule::new().client_id()]).with_client_id(client);
    assert_eq!(l.stable_ids().client, client);
    let sent = send(&l, get("https://h.test/"));
    assert_eq!(sent.headers()["x-client-id"], "01ARZ3NDEKTSV4RRFFQ69G5FAV");
}

// ---------------------------------------------------------------- ULIDs

#[test]
fn request_ids_are_crockford_ulids_unique_and_strictly_increasing_over_100k_requests() {
    const N: usize = 100_000;
    let l = layer([Rule::new().request_id()]);
    let mut svc = l.layer(echo());
    let mut ids = Vec::with_capacity(N);
    for _ in 0..N {
        let fut = svc.call(get("https://h.test/"));
        let sent = futures::executor::block_on(fut).unwrap();
        let id = sent.headers()["x-request-id"].to_str().unwrap().to_owned();
        ids.push(id);
    }
    for id in &ids {
        assert!(is_crockford_ulid(id), "{id:?}");
        assert!(Ulid::from_string(id).is_ok(), "{id:?}");
    }
    let unique: HashSet<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(unique.len(), N);
    // Text order is id order (Crockford base-32, fixed width), and each id
    // sorts after the one before, within a millisecond too.
    let mut same_ms = 0;
    for w in ids.windows(2) {
        assert!(w[0] < w[1], "{} !< {}", w[0], w[1]);
        let (a, b) = (
            Ulid::from_string(&w[0]).unwrap(),
            Ulid::from_string(&w[1]).unwrap(),
        );
        assert!(a < b);
        if a.timestamp_ms() == b.timestamp_ms() {
            same_ms += 1;
        }
    }
    assert!(same_ms > 0, "100k ids should share some milliseconds");
}

#[test]
fn request_ids_stay_unique_and_sorted_across_threads_and_clones() {
    let l = layer([Rule::new().request_id()]);
    let ids: Vec<Vec<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let mut svc = l.layer(echo());
                s.spawn(move || {
                    (0..5_000)
                        .map(|_| {
                            let sent =
                                futures::executor::block_on(svc.call(get("https://h.test/")))
                                    .unwrap();
                            sent.headers()["x-request-id"].to_str().unwrap().to_owned()
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut unique = HashSet::new();
    for thread in &ids {
        assert!(
            thread.windows(2).all(|w| w[0] < w[1]),
            "each caller sees them in order"
        );
        for id in thread {
            assert!(unique.insert(id.clone()), "duplicate {id}");
        }
    }
    assert_eq!(unique.len(), 20_000);
}

// ---------------------------------------------------------------- validation

#[test]
fn invalid_static_header_name_is_a_build_error_naming_rule_and_header() {
    let err = build_err([
        Rule::named("fine").header("x-ok", "1"),
        Rule::named("openrouter").header("X Title", "My app"),
    ]);
    assert_eq!(err.field, r#"rules[1].headers["X Title"]"#);
    assert!(
        err.message
            .starts_with(r#"rule "openrouter": "X Title" is not a valid header name"#),
        "{err}"
    );

    let err = build_err([
        Rule::new(),
        Rule::new(),
        Rule::new().header("bad:name", "1"),
    ]);
    assert_eq!(err.field, r#"rules[2].headers["bad:name"]"#);
    assert!(
        err.message
            .starts_with(r#""bad:name" is not a valid header name"#),
        "{err}"
    );
}

#[test]
fn invalid_header_value_is_a_build_error_that_does_not_repeat_the_value() {
    let secret_with_newline = format!("Bearer {SECRET}\r\nx-injected: 1");
    let err = build_err([Rule::named("llm").header("authorization", &secret_with_newline)]);
    assert_eq!(err.field, r#"rules[0].headers["authorization"]"#);
    assert!(err.message.starts_with(r#"rule "llm": "#), "{err}");
    assert!(err.message.contains("not a valid header value"), "{err}");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(SECRET), "{shown}");

    let err = build_err([Rule::new().user_agent("agent\n1.0")]);
    assert_eq!(err.field, "rules[0].user_agent");
}

#[test]
fn invalid_id_header_names_are_build_errors() {
    let err = build_err([Rule::named("ids").request_id_header("x request id")]);
    assert_eq!(err.field, "rules[0].request_id");
    assert!(
        err.message
            .starts_with(r#"rule "ids": "x request id" is not a valid header name"#),
        "{err}"
    );
    let err = build_err([Rule::new().session_id_header("")]);
    assert_eq!(err.field, "rules[0].session_id");
}

#[test]
fn invalid_conditions_are_build_errors_naming_the_rule() {
    let cases: Vec<(Rule, &str)> = vec![
        (Rule::new().host(""), "rules[0].host"),
        (Rule::new().host("https://api.example.com"), "rules[0].host"),
        (Rule::new().host("api.example.com:443"), "rules[0].host"),
        (Rule::new().host("api.*.com"), "rules[0].host"),
        (Rule::new().host("*."), "rules[0].host"),
        (Rule::new().path_prefix("v1/"), "rules[0].path_prefix"),
        (Rule::new().path_glob("v1/*"), "rules[0].path_glob"),
        (
            Rule::new().path_prefix("/a").path_glob("/b*"),
            "rules[0].path_glob",
        ),
        (Rule::new().url_contains(""), "rules[0].url_contains"),
        (
            Rule::new().header("x-a", "1").sensitive("x-b"),
            "rules[0].sensitive[0]",
        ),
        (
            Rule::new()
                .header("x-a", "1")
                .sensitive("x-a")
                .sensitive("bad name"),
            "rules[0].sensitive[1]",
        ),
    ];
    for (rule, field) in cases {
        let dbg = format!("{rule:?}");
        let err = build_err([rule]);
        assert_eq!(err.field, field, "{dbg}: {err}");
        assert!(!err.message.is_empty());
    }
}

#[test]
fn building_never_panics_on_hostile_input() {
    let hostile = [
        "", " ", "\0", "\u{7f}", "\r\n", "*", "**", "*.*", ".", "..", "/", "?", "[", "[::1", "é",
        "\u{202e}", "a\u{0}b", "x-ok",
    ];
    let long = "a".repeat(100_000);
    for s in hostile.iter().copied().chain([long.as_str()]) {
        let rules = [
            Rule::named(s).host(s),
            Rule::new().path_prefix(s),
            Rule::new().path_glob(s),
            Rule::new().url_contains(s),
            Rule::new().user_agent(s),
            Rule::new().header(s, s),
            Rule::new().request_id_header(s),
            Rule::new().sensitive_header(s, s),
        ];
        for rule in rules {
            let _ = IdentityHeaderLayer::new([rule]);
        }
        let _ = IdentityConfig::from_toml(s).map(IdentityConfig::build);
    }
}

// ---------------------------------------------------------------- secrets

#[test]
fn debug_of_layer_service_rule_and_config_shows_no_secret() {
    let rules = || {
        [Rule::named("llm")
            .host("api.example.com")
            .user_agent("my-agent/1.4")
            .request_id()
            .header("authorization", format!("Bearer {SECRET}"))
            .header("x-api-key", SECRET)
            .header("X-Auth-Token", SECRET)
            .header("x-client-secret", SECRET)
            .header("cookie", format!("sid={SECRET}"))
            .sensitive_header("x-custom", SECRET)
            .header("x-flagged", SECRET)
            .sensitive("X-Flagged")
            .header("x-title", "visible title")]
    };
    let l = layer(rules());
    let svc = l.layer(echo());
    let config = IdentityConfig::new(rules());
    for shown in [
        format!("{l:?}"),
        format!("{l:#?}"),
        format!("{svc:?}"),
        format!("{:?}", rules()[0]),
        format!("{config:?}"),
    ] {
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        assert!(
            shown.contains("visible title"),
            "non-secret values are shown: {shown}"
        );
    }
    assert!(format!("{l:?}").contains("my-agent/1.4"));
}

#[test]
fn secret_header_values_are_sent_marked_sensitive() {
    let l = layer([Rule::new()
        .header("authorization", "Bearer x")
        .header("Proxy-Authorization", "Basic x")
        .header("x-api-key", "k")
        .header("x-auth-token", "t")
        .header("x-client-secret", "s")
        .sensitive_header("x-custom", "c")
        .header("x-flagged", "f")
        .sensitive("x-flagged")
        .session_id_header("x-session-token")
        .request_id()
        .sensitive("x-request-id")
        .header("x-title", "public")
        .user_agent("agent")]);
    let sent = send(&l, get("https://h.test/"));
    let h = sent.headers();
    for name in [
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "x-auth-token",
        "x-client-secret",
        "x-custom",
        "x-flagged",
        "x-session-token",
        "x-request-id",
    ] {
        assert!(h[name].is_sensitive(), "{name}");
    }
    assert!(!h["x-title"].is_sensitive());
    assert!(!h["user-agent"].is_sensitive());
    assert!(!format!("{h:?}").contains("Bearer x"));
}

// ---------------------------------------------------------------- configuration

const CONFIG: &str = r#"
[stable_ids]
client = "01ARZ3NDEKTSV4RRFFQ69G5FAV"

[[rules]]
name = "health"
path_prefix = "/health"

[[rules]]
name = "openrouter"
host = "openrouter.ai"
path_glob = "/api/v1/*"
user_agent = "my-agent/1.4"
request_id = true
client_id = true
project_id = "x-project"
session_id = false
sensitive = ["x-team"]

[rules.headers]
"HTTP-Referer" = "https://example.com"
"x-team" = "research"
"authorization" = "Bearer sk-live-5ecret-0123456789abcdef"

[[rules]]
name = "proxied"
url_contains = "/openai/"
user_agent = "my-agent/1.4 (proxied)"
"#;

#[test]
fn config_from_toml_builds_the_same_rules() {
    let l = IdentityHeaderLayer::from_toml(CONFIG).unwrap();
    assert_eq!(l.rule_count(), 3);
    assert_eq!(
        l.stable_ids().client.to_string(),
        "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    );
    assert!(!format!("{l:?}").contains(SECRET));

    let req = Request::post("https://openrouter.ai/api/v1/chat/completions")
        .header("user-agent", "reqwest")
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let sent = send(&l, req);
    let h = sent.headers();
    assert_eq!(h["user-agent"], "my-agent/1.4");
    assert!(is_crockford_ulid(h["x-request-id"].to_str().unwrap()));
    assert_eq!(h["x-client-id"], "01ARZ3NDEKTSV4RRFFQ69G5FAV");
    assert_eq!(h["x-project"], l.stable_ids().project.to_string());
    assert!(!h.contains_key("x-session-id"));
    assert_eq!(h["http-referer"], "https://example.com");
    assert_eq!(h["content-type"], "application/json");
    assert!(h["x-team"].is_sensitive());
    assert!(h["authorization"].is_sensitive());
    assert_eq!(h.len(), 8);

    assert_eq!(
        l.matching_rule(&get("https://openrouter.ai/health")),
        Some(0)
    );
    assert_eq!(l.matching_rule(&get("https://gw.test/openai/v1")), Some(2));
    assert_eq!(l.matching_rule(&get("https://openrouter.ai/docs")), None);
}

#[test]
fn config_is_a_serde_table_another_config_can_embed() {
    #[derive(serde::Deserialize)]
    struct App {
        identity: IdentityConfig,
    }
    let app: App = toml::from_str(
        r#"
        [[identity.rules]]
        host = "*.example.com"
        user_agent = "embedded"
        "#,
    )
    .unwrap();
    let l = app.identity.build().unwrap();
    assert_eq!(
        ua_for(&l, "https://a.example.com/").as_deref(),
        Some("embedded")
    );
}

#[test]
fn broken_toml_is_an_error_with_line_and_column_and_no_secret() {
    let err = IdentityConfig::from_toml(
        "[[rules]]\nname = \"x\"\n[rules.headers]\nauthorization = \"Bearer sk-live-5ecret-0123456789abcdef\n",
    )
    .unwrap_err();
    assert_eq!(err.field, "rules[0].headers.authorization", "{err}");
    assert!(err.message.contains("(line 4, column"), "{err}");
    assert!(!format!("{err} {err:?}").contains(SECRET), "{err}");

    let err = IdentityConfig::from_toml("[[rules]]\nhost = \"a.test\"\npathprefix = \"/v1\"\n")
        .unwrap_err();
    assert_eq!(err.field, "rules[0].pathprefix");
    assert!(err.message.ends_with("(line 3, column 1)"), "{err}");
    assert!(err.message.contains("unknown field `pathprefix`"), "{err}");

    let err = IdentityConfig::from_toml("[[rules]]\nrequest_id = 1\n").unwrap_err();
    assert_eq!(err.field, "rules[0].request_id", "{err}");
    assert!(err.message.contains("(line 2, column"), "{err}");
    assert!(
        err.message.contains("`true`, `false`, or a header name"),
        "{err}"
    );

    let err = IdentityConfig::from_toml("[[rules]]\nheaders = { x-a = 1 }\n").unwrap_err();
    assert!(err.message.contains("expected a string"), "{err}");

    let err = IdentityConfig::from_toml("rule = []\n").unwrap_err();
    assert!(err.message.contains("unknown field `rule`"), "{err}");
}

#[test]
fn invalid_rule_in_toml_is_a_build_error_naming_rule_and_header() {
    let text = r#"
        [[rules]]
        name = "ok"
        host = "a.test"

        [[rules]]
        name = "gateway"
        host = "*.gateway.test"
        [rules.headers]
        "x-api key" = "sk-live-5ecret-0123456789abcdef"
    "#;
    let err = IdentityHeaderLayer::from_toml(text).unwrap_err();
    assert_eq!(err.field, r#"rules[1].headers["x-api key"]"#);
    assert!(!format!("{err} {err:?}").contains(SECRET));
    assert_eq!(
        err.to_string(),
        r#"invalid `rules[1].headers["x-api key"]`: rule "gateway": "x-api key" is not a valid header name (letters, digits and !#$%&'*+-.^_`|~ only; no spaces, no colon)"#
    );

    let err =
        IdentityHeaderLayer::from_toml("[[rules]]\nsession_id = \"x session\"\n").unwrap_err();
    assert_eq!(err.field, "rules[0].session_id");

    let err =
        IdentityHeaderLayer::from_toml("[stable_ids]\nsession = \"not-a-ulid\"\n").unwrap_err();
    assert_eq!(err.field, "stable_ids.session");
}

#[test]
fn empty_config_builds_a_layer_that_changes_nothing() {
    let l = IdentityHeaderLayer::from_toml("").unwrap();
    assert_eq!(l.rule_count(), 0);
    assert!(send(&l, get("https://h.test/")).headers().is_empty());
}

// ---------------------------------------------------------------- reqwest

#[cfg(feature = "reqwest")]
#[test]
fn works_on_reqwest_requests() {
    let l = layer([Rule::new()
        .host("*.example.com")
        .path_prefix("/v1/")
        .user_agent("my-agent/1.4")
        .request_id()
        .header("x-api-key", SECRET)]);
    let echo = tower::service_fn(|req: reqwest::Request| ready(Ok::<_, Infallible>(req)));
    let svc = l.layer(echo);

    let client = reqwest::Client::new();
    let req = client
        .get("https://api.example.com/v1/models")
        .header("user-agent", "reqwest")
        .header("accept", "application/json")
        .build()
        .unwrap();
    let sent = futures::executor::block_on(svc.clone().oneshot(req)).unwrap();
    let h = sent.headers();
    assert_eq!(h["user-agent"], "my-agent/1.4");
    assert_eq!(h["accept"], "application/json");
    assert!(is_crockford_ulid(h["x-request-id"].to_str().unwrap()));
    assert!(h["x-api-key"].is_sensitive());

    let other = client.get("https://example.com/v1/models").build().unwrap();
    let before = raw(other.headers());
    let sent = futures::executor::block_on(svc.oneshot(other)).unwrap();
    assert_eq!(raw(sent.headers()), before);
}
