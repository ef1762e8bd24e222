//! Per-key rules, configuration files, and the tighten-only merge.

#![cfg(feature = "test-util")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use support::Inner;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::error::{BoxError, RateLimited};
use tower_throttle::key::{HeaderKey, KeyBuilder, KeyExtractor};
use tower_throttle::rate_limit::{
    Algorithm, KeyPattern, Limits, Quota, RateLimitConfig, RateLimitLayer, Rule,
};

fn route(provider: &str, model: &str) -> http::Request<()> {
    http::Request::builder()
        .header("x-provider", provider)
        .header("x-model", model)
        .body(())
        .unwrap()
}

fn route_key() -> (HeaderKey, HeaderKey) {
    (
        HeaderKey::new("x-provider").unwrap(),
        HeaderKey::new("x-model").unwrap(),
    )
}

/// How many requests of one route get through at once.
async fn capacity<S>(svc: &mut S, provider: &str, model: &str) -> usize
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    let mut admitted = 0;
    for _ in 0..100 {
        match svc
            .ready()
            .await
            .unwrap()
            .call(route(provider, model))
            .await
        {
            Ok(_) => admitted += 1,
            Err(err) if err.is::<RateLimited>() => return admitted,
            Err(err) => panic!("{err}"),
        }
    }
    admitted
}

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(n).unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_most_specific_rule_wins_and_unmatched_keys_use_the_default() {
    let layer = RateLimitLayer::new(per_minute(1), route_key())
        .with_rule(
            Rule::new(
                "any-opencode",
                KeyPattern::parts(["opencode", "*"]).unwrap(),
            )
            .with_quota(per_minute(4)),
        )
        .unwrap()
        .with_rule(
            Rule::new(
                "claude",
                KeyPattern::parts(["opencode", "claude-*"]).unwrap(),
            )
            .with_quota(per_minute(2)),
        )
        .unwrap()
        .with_rule(
            Rule::new(
                "opus-anywhere",
                KeyPattern::parts(["*", "claude-opus"]).unwrap(),
            )
            .with_quota(per_minute(3)),
        )
        .unwrap()
        .with_rule(
            Rule::new(
                "opus-exact",
                KeyPattern::parts(["opencode", "claude-opus"]).unwrap(),
            )
            .with_quota(per_minute(5)),
        )
        .unwrap()
        .with_rule(Rule::new(
            "free",
            KeyPattern::parts(["local", "*"]).unwrap(),
        ))
        .unwrap();
    let mut svc = layer.layer(Inner::new());
    // Exact beats glob beats wildcard.
    assert_eq!(capacity(&mut svc, "opencode", "claude-opus").await, 5);
    assert_eq!(capacity(&mut svc, "opencode", "claude-sonnet").await, 2);
    assert_eq!(capacity(&mut svc, "other", "claude-opus").await, 3);
    assert_eq!(capacity(&mut svc, "opencode", "gpt-4o").await, 4);
    // No rule: the default. A rule without quotas: unlimited.
    assert_eq!(capacity(&mut svc, "other", "gpt-4o").await, 1);
    assert_eq!(capacity(&mut svc, "local", "llama").await, 100);
}

#[tokio::test(start_paused = true)]
async fn equally_specific_rules_go_by_declaration_order() {
    let layer = RateLimitLayer::new(per_minute(1), HeaderKey::new("x-model").unwrap())
        .with_rule(Rule::new("first", KeyPattern::text("gpt-*").unwrap()).with_quota(per_minute(2)))
        .unwrap()
        .with_rule(
            Rule::new("second", KeyPattern::text("gpt-4*").unwrap()).with_quota(per_minute(3)),
        )
        .unwrap()
        .with_rule(
            Rule::new("third", KeyPattern::text("gpt-4?").unwrap()).with_quota(per_minute(4)),
        )
        .unwrap();
    let svc = layer.layer(Inner::new());
    let model = |m: &str| {
        http::Request::builder()
            .header("x-model", m)
            .body(())
            .unwrap()
    };
    let count = |m: &'static str| {
        let mut svc = svc.clone();
        async move {
            let mut n = 0;
            while svc.ready().await.unwrap().call(model(m)).await.is_ok() {
                n += 1;
            }
            n
        }
    };
    // "gpt-4*" and "gpt-4?" both have 4 literal characters: the first
    // declared of them wins over the later; "gpt-*" has fewer.
    assert_eq!(count("gpt-4o").await, 3);
    assert_eq!(count("gpt-3.5").await, 2);
}

/// Found by the `key_patterns` fuzz target: an all-exact pattern was looked
/// up before the others and won a tie it should lose to an earlier rule.
#[tokio::test(start_paused = true)]
async fn an_exact_text_pattern_ties_an_exact_part_and_the_first_declared_wins() {
    let rules = vec![
        Rule::new("text", KeyPattern::text("a").unwrap()),
        Rule::new("parts", KeyPattern::parts(["a"]).unwrap()),
    ];
    assert_eq!(Rule::find(&rules, &["a"]).map(Rule::name), Some("text"));
    let reversed: Vec<Rule> = rules.iter().rev().cloned().collect();
    assert_eq!(Rule::find(&reversed, &["a"]).map(Rule::name), Some("parts"));

    // The limiter picks the same rule.
    let layer = RateLimitLayer::new(per_minute(1), HeaderKey::new("x-model").unwrap())
        .with_rule(Rule::new("text", KeyPattern::text("a").unwrap()).with_quota(per_minute(2)))
        .unwrap()
        .with_rule(Rule::new("parts", KeyPattern::parts(["a"]).unwrap()).with_quota(per_minute(3)))
        .unwrap();
    let mut svc = layer.layer(Inner::new());
    let mut admitted = 0;
    loop {
        let req = http::Request::builder()
            .header("x-model", "a")
            .body(())
            .unwrap();
        if svc.ready().await.unwrap().call(req).await.is_err() {
            break;
        }
        admitted += 1;
    }
    assert_eq!(admitted, 2);
}

/// Counts how often the key is extracted: once per request for its hash,
/// plus once each time the key's text is needed.
#[derive(Clone, Default)]
struct CountingKey(Arc<AtomicUsize>);

impl KeyExtractor<http::Request<()>> for CountingKey {
    fn extract(
        &self,
        req: &http::Request<()>,
        key: &mut KeyBuilder<'_>,
    ) -> Result<(), tower_throttle::error::KeyError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        key.push_bytes(req.headers()["x-model"].as_bytes());
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_keys_rule_is_looked_up_once_and_cached() {
    let extracted = CountingKey::default();
    let mut layer = RateLimitLayer::new(Quota::per_second(1_000).unwrap(), extracted.clone());
    for i in 0..200 {
        let rule = Rule::new(
            format!("r{i}"),
            KeyPattern::text(&format!("model-{i}-*")).unwrap(),
        )
        .with_quota(Quota::per_second(1_000).unwrap());
        layer = layer.with_rule(rule).unwrap();
    }
    let mut svc = layer.layer(Inner::new());
    let req = || {
        http::Request::builder()
            .header("x-model", "model-7-x")
            .body(())
            .unwrap()
    };
    for _ in 0..50 {
        svc.ready().await.unwrap().call(req()).await.unwrap();
    }
    // 50 hashes, and the text once, for the one lookup.
    assert_eq!(extracted.0.load(Ordering::SeqCst), 51);
}

#[test]
fn config_from_toml_builds_rules_and_quotas() {
    let limits = RateLimitConfig::from_toml(
        r#"
        mode = "wait"
        max_wait = "2s"
        [[quotas]]
        limit = 60
        period = "1m"
        burst = 10
        [[quotas]]
        limit = 0
        period = "1d"
        [[rules]]
        provider = "opencode"
        model = "claude-*"
        quotas = [{ limit = 500, period = "1m", algorithm = "sliding_window" }]
        [[rules]]
        name = "turns"
        key = "agent-*"
        quotas = [{ limit = 3, period = "5m", algorithm = "turn_budget" }]
        "#,
    )
    .unwrap()
    .validate()
    .unwrap();
    assert_eq!(limits.max_wait, Duration::from_secs(2));
    // Limit 0 is unlimited: left out.
    assert_eq!(limits.default, vec![per_minute(60).with_burst(10).unwrap()]);
    assert_eq!(limits.rules[0].name(), "opencode/claude-*");
    assert_eq!(
        limits.rules[0].quotas()[0].algorithm(),
        Algorithm::SlidingWindow
    );
    assert_eq!(
        limits.rules[1].quotas()[0].algorithm(),
        Algorithm::TurnBudget
    );
}

#[test]
fn bad_config_names_the_field_and_the_value() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "[[quotas]]\nlimit = -10\nperiod = \"1m\"",
            "quotas[0].limit",
            "-10",
        ),
        (
            "[[quotas]]\nlimit = 5\nperiod = \"1m\"\nburst = 0",
            "quotas[0].burst",
            "0",
        ),
        (
            "[[quotas]]\nlimit = 5\nperiod = \"1m\"\nalgorithm = \"leaky\"",
            "quotas[0].algorithm",
            "leaky",
        ),
        (
            "[[quotas]]\nlimit = 5\nperiod = \"soon\"",
            "quotas[0].period",
            "soon",
        ),
        (
            "[[quotas]]\nlimit = 5\nperiod = \"0s\"",
            "quotas[0].period",
            "zero",
        ),
        (
            "[[quotas]]\nlimit = 99999999999\nperiod = \"1m\"",
            "quotas[0].limit",
            "99999999999",
        ),
        (
            "[[rules]]\nkey = \"\"\nquotas = []",
            "rules[0].key",
            "empty",
        ),
        (
            "[[rules]]\nprovider = \"a\"\nkey = \"b\"",
            "rules[0].key",
            "only one",
        ),
        ("[[rules]]\nquotas = []", "rules[0].key", "which keys"),
        (
            "[[rules]]\nmodel = \"x\"\nquotas = [{ limit = 1, period = \"1m\", burst = -1 }]",
            "rules[0].quotas[0].burst",
            "-1",
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = \"x\"\n[[rules]]\nname = \"a\"\nkey = \"y\"",
            "rules[1].name",
            "`a`",
        ),
        ("mode = \"sometimes\"", "mode", "sometimes"),
        ("mode = \"wait\"", "max_wait", "above zero"),
    ];
    for (toml, field, mention) in cases {
        let err = RateLimitConfig::from_toml(toml)
            .and_then(|c| c.validate())
            .expect_err(toml);
        assert_eq!(&err.field, field, "{toml}: {err}");
        assert!(err.to_string().contains(mention), "{toml}: {err}");
    }
    let err = RateLimitConfig::from_toml("limits = 5").unwrap_err();
    assert!(err.to_string().contains("limits"), "{err}");
    assert!(RateLimitConfig::from_toml("[[quotas]]\nlimit = \"x\"").is_err());
}

fn limits(toml: &str) -> Limits {
    RateLimitConfig::from_toml(toml)
        .unwrap()
        .validate()
        .unwrap()
}

const USER: &str = r#"
    [[quotas]]
    limit = 60
    period = "1m"
    [[quotas]]
    limit = 1000
    period = "1d"
    [[rules]]
    name = "claude"
    provider = "opencode"
    model = "claude-*"
    quotas = [{ limit = 100, period = "1m" }]
"#;

#[test]
fn a_later_layer_may_add_and_lower_limits() {
    let (merged, ignored) = limits(USER).tighten_with(&limits(
        r#"
        [[quotas]]
        limit = 30
        period = "1m"
        [[quotas]]
        limit = 5
        period = "1s"
        [[rules]]
        name = "claude"
        provider = "opencode"
        model = "claude-*"
        quotas = [{ limit = 50, period = "1m" }]
        "#,
    ));
    assert!(ignored.is_empty(), "{ignored:?}");
    let limits: Vec<_> = merged
        .default
        .iter()
        .map(|q| (q.limit(), q.period()))
        .collect();
    assert_eq!(
        limits,
        vec![
            (30, Duration::from_secs(60)),
            (1000, Duration::from_secs(86_400)),
            (5, Duration::from_secs(1))
        ]
    );
    assert_eq!(merged.rules[0].quotas()[0].limit(), 50);
}

#[test]
fn a_later_layer_that_relaxes_is_ignored_and_reported() {
    let (merged, ignored) = limits(USER).tighten_with(&limits(
        r#"
        enabled = false
        dry_run = true
        [[quotas]]
        limit = 600
        period = "1m"
        [[quotas]]
        limit = 0
        period = "1d"
        [[rules]]
        name = "claude"
        provider = "*"
        model = "*"
        quotas = []
        "#,
    ));
    assert_eq!(merged, limits(USER), "a relaxation got through");
    let fields: Vec<_> = ignored.iter().map(|i| i.field.as_str()).collect();
    assert!(fields.contains(&"enabled"), "{fields:?}");
    assert!(fields.contains(&"dry_run"), "{fields:?}");
    assert!(
        fields
            .iter()
            .any(|f| f.starts_with("quotas[1m") && f.ends_with(".limit")),
        "{fields:?}"
    );
    assert!(fields.contains(&"rules[claude].pattern"), "{fields:?}");
}

#[test]
fn a_new_rule_cannot_relax_the_quotas_its_keys_had() {
    // A more specific rule, and a catch-all, both added by the later layer
    // with generous limits: the keys keep the user's, including those of
    // the user's rule the new one would displace (20 per minute).
    let user = USER.replace(
        "limit = 100, period = \"1m\"",
        "limit = 20, period = \"1m\"",
    );
    let (merged, _) = limits(&user).tighten_with(&limits(
        r#"
        [[rules]]
        name = "opus"
        provider = "opencode"
        model = "claude-opus"
        quotas = [{ limit = 5000, period = "1m" }]
        [[rules]]
        name = "everything"
        key = "*"
        quotas = [{ limit = 9000, period = "1m" }]
        "#,
    ));
    let opus = merged.rules.iter().find(|r| r.name() == "opus").unwrap();
    let per_minute = opus
        .quotas()
        .iter()
        .find(|q| q.period() == Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        per_minute.limit(),
        20,
        "min of default 60, claude's 20 and 5000"
    );
    assert!(
        opus.quotas().iter().any(|q| q.limit() == 1000),
        "the daily cap stays"
    );
    let everything = merged
        .rules
        .iter()
        .find(|r| r.name() == "everything")
        .unwrap();
    assert!(everything.quotas().iter().all(|q| q.limit() <= 1000));
}

#[test]
fn provider_limits_cannot_relax_the_users() {
    let project = limits("[[quotas]]\nlimit = 40\nperiod = \"1m\"");
    let provider = limits(
        "[[quotas]]\nlimit = 500\nperiod = \"1m\"\n[[quotas]]\nlimit = 20000\nperiod = \"1d\"",
    );
    let (merged, _) = limits(USER).tighten_with(&project);
    let (merged, ignored) = merged.tighten_with(&provider);
    let caps: Vec<_> = merged.default.iter().map(|q| q.limit()).collect();
    assert_eq!(caps, vec![40, 1000]);
    // The provider's raised limit and burst per minute, and its raised daily
    // limit and burst.
    assert_eq!(ignored.len(), 4, "{ignored:?}");
}

#[tokio::test(start_paused = true)]
async fn a_layer_built_from_config_enforces_it() {
    let limits = limits(
        r#"
        [[quotas]]
        limit = 2
        period = "1m"
        [[rules]]
        provider = "opencode"
        quotas = [{ limit = 3, period = "1m", algorithm = "fixed_window" }]
        "#,
    );
    let mut svc = RateLimitLayer::from_limits(&limits, route_key()).layer(Inner::new());
    assert_eq!(capacity(&mut svc, "openai", "gpt").await, 2);
    let opencode = capacity(&mut svc, "opencode", "any").await;
    assert!((1..=3).contains(&opencode), "fixed window of 3: {opencode}");
}

#[test]
fn a_sliding_window_counter_is_chosen_by_its_name_only() {
    let limits = limits(
        r#"
        [[quotas]]
        limit = 30000
        period = "1m"
        algorithm = "sliding_window_counter"
        "#,
    );
    assert_eq!(
        limits.default[0].algorithm(),
        tower_throttle::rate_limit::Algorithm::SlidingWindowCounter
    );
    // A near miss is an error naming every algorithm, not a guess.
    let err = RateLimitConfig::from_toml(
        r#"
        [[quotas]]
        limit = 3
        period = "1m"
        algorithm = "sliding_counter"
        "#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("sliding_counter") && err.contains("sliding_window_counter"),
        "{err}"
    );
}
