//! Per-request cost of `IdentityHeaderLayer` with 1 rule and with 1,000
//! rules, on hits and misses, beside tower-http's `SetRequestHeaderLayer`
//! setting one header, in the same run.
//!
//! Every service is driven synchronously: `poll_ready`, `call` and one poll
//! of the response future with a no-op waker. Every contender gets a clone of
//! the same prebuilt request (two headers, an absolute URL) and the same
//! ready inner service, which drops the request; `bare_inner` measures that
//! clone-and-drop alone.
//!
//! ```text
//! cargo bench --bench identity -- --warm-up-time 1 --measurement-time 2
//! ```

mod support;

use support::drive;

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::hint::black_box;

use http::header::USER_AGENT;
use http::{HeaderValue, Request, Response};
use tower::{Layer, Service};
use tower_http::set_header::SetRequestHeaderLayer;
use tower_throttle::identity::{IdentityHeaderLayer, Rule};

const UA: &str = "my-agent/1.4";

/// The inner service every contender wraps: drops the request, answers an
/// empty response.
fn inner() -> impl Service<
    Request<()>,
    Response = Response<()>,
    Error = Infallible,
    Future = Ready<Result<Response<()>, Infallible>>,
> + Clone {
    tower::service_fn(|req: Request<()>| {
        black_box(&req);
        ready(Ok::<_, Infallible>(Response::new(())))
    })
}

/// What a client sends: an absolute URL, a user agent and an accept header.
fn request(url: &str) -> Request<()> {
    Request::post(url)
        .header(USER_AGENT, "reqwest/0.13")
        .header("accept", "application/json")
        .body(())
        .unwrap()
}

/// One rule for one host; it replaces the user agent (one header, like the
/// tower-http anchor).
fn one_rule() -> IdentityHeaderLayer {
    IdentityHeaderLayer::new([Rule::new()
        .host("api.example.com")
        .path_prefix("/v1/")
        .user_agent(UA)])
    .unwrap()
}

/// One rule that does everything: user agent, a fresh ULID request id, the
/// session id, and two static headers (one secret).
fn one_full_rule() -> IdentityHeaderLayer {
    IdentityHeaderLayer::new([Rule::new()
        .host("api.example.com")
        .path_prefix("/v1/")
        .user_agent(UA)
        .request_id()
        .session_id()
        .header("x-title", "bench")
        .header("x-api-key", "sk-live-0123456789abcdef")])
    .unwrap()
}

/// 1,000 rules: 500 exact hosts `svc{even}.example.com` and 500 suffixes
/// `*.tenant{odd}.example.net`, each with a path prefix and a user agent.
fn thousand_rules() -> IdentityHeaderLayer {
    IdentityHeaderLayer::new((0..1000).map(|i| {
        let rule = if i % 2 == 0 {
            Rule::new().host(format!("svc{i}.example.com"))
        } else {
            Rule::new().host(format!("*.tenant{i}.example.net"))
        };
        rule.path_prefix("/v1/").user_agent(format!("{UA} ({i})"))
    }))
    .unwrap()
}

/// 1,000 rules with no host, path prefixes only: the case the host index
/// cannot help, tried one by one.
fn thousand_hostless_rules() -> IdentityHeaderLayer {
    IdentityHeaderLayer::new(
        (0..1000).map(|i| Rule::new().path_prefix(format!("/p{i}/")).user_agent(UA)),
    )
    .unwrap()
}

/// One contender: a name, and one request through its service.
type Contender = (&'static str, Box<dyn FnMut() -> bool>);

/// Every contender, in report order, each with its own service and request.
fn contenders() -> Vec<Contender> {
    let hit = request("https://api.example.com/v1/chat/completions");
    let miss = request("https://api.other.org/v1/chat/completions");
    let hit_exact_1000 = request("https://svc998.example.com/v1/chat/completions");
    let hit_suffix_1000 = request("https://eu.tenant999.example.net/v1/chat/completions");

    let mut out: Vec<Contender> = Vec::new();
    {
        let mut svc = inner();
        let req = hit.clone();
        out.push((
            "bare_inner",
            Box::new(move || drive(&mut svc, req.clone()).is_ok()),
        ));
    }
    {
        let layer = SetRequestHeaderLayer::overriding(USER_AGENT, HeaderValue::from_static(UA));
        let mut svc = layer.layer(inner());
        let req = hit.clone();
        out.push((
            "tower_http_set_header",
            Box::new(move || drive(&mut svc, req.clone()).is_ok()),
        ));
    }
    {
        // The natural peer of `ours_1_rule_hit`: the same rule (host, path
        // prefix, user agent) as a tower user would write it, a
        // `map_request` closure.
        let mut svc = tower::ServiceBuilder::new()
            .map_request(|mut req: Request<()>| {
                let uri = req.uri();
                if uri.host() == Some("api.example.com") && uri.path().starts_with("/v1/") {
                    req.headers_mut()
                        .insert(USER_AGENT, HeaderValue::from_static(UA));
                }
                req
            })
            .service(inner());
        let req = hit.clone();
        out.push((
            "tower_map_request_host_path",
            Box::new(move || drive(&mut svc, req.clone()).is_ok()),
        ));
    }
    let ours: [(&str, IdentityHeaderLayer, &Request<()>, Option<usize>); 7] = [
        ("ours_1_rule_hit", one_rule(), &hit, Some(0)),
        ("ours_1_rule_miss", one_rule(), &miss, None),
        ("ours_1_full_rule_hit", one_full_rule(), &hit, Some(0)),
        (
            "ours_1000_rules_hit_exact",
            thousand_rules(),
            &hit_exact_1000,
            Some(998),
        ),
        (
            "ours_1000_rules_hit_suffix",
            thousand_rules(),
            &hit_suffix_1000,
            Some(999),
        ),
        ("ours_1000_rules_miss", thousand_rules(), &miss, None),
        (
            "ours_1000_hostless_rules_miss",
            thousand_hostless_rules(),
            &miss,
            None,
        ),
    ];
    for (name, layer, req, expect) in ours {
        assert_eq!(layer.matching_rule(req), expect, "{name}");
        let mut svc = layer.layer(inner());
        let req = req.clone();
        out.push((name, Box::new(move || drive(&mut svc, req.clone()).is_ok())));
    }
    out
}

fn main() {
    support::run_contenders("TT_IDENTITY", "identity", contenders);
}
