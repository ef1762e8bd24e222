//! The learner: releasing, lapsing and logging what it learned.

use super::*;

use tower_throttle::rate_limit::RateLimitLayer;

use crate::gateway::RouteKey;

/// A learner for one learning provider `up`, 60 a minute by default.
fn learner() -> Learner {
    let toml = r#"
[[providers]]
name = "up"
base_url = "http://127.0.0.1:9"
learn_limits = true

[rate_limit]
quotas = [{ limit = 60, period = "1m", algorithm = "sliding_window" }]
"#;
    let settings = Settings::from_toml(toml, &|_: &str| None).unwrap();
    let limits = settings.stack.rate_limit.clone().unwrap();
    let learner = Learner::new(RateLimitLayer::from_limits(&limits, RouteKey).handle());
    learner.apply(&settings, &limits).unwrap();
    learner
}

fn route() -> Route {
    Route {
        provider: Arc::from("up"),
        model: Arc::from("m"),
    }
}

fn stating(limit: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-limit-requests", limit.parse().unwrap());
    headers
}

/// The route's first quota's limit now, and whether a learned one holds.
fn held(learner: &Learner) -> (u32, bool) {
    let info = &learner.snapshot()["up/m"];
    assert_eq!(info.configured[0].limit, 60);
    (info.quotas[0].limit, info.in_force)
}

#[test]
fn responses_that_stop_stating_a_limit_release_it() {
    let learner = learner();
    let t0 = Instant::now();
    let now = SystemTime::now();
    learner.prepare_at(&route(), t0);
    learner.observe_at(&route(), &stating("5"), now, t0);
    assert_eq!(held(&learner), (5, true));
    for _ in 1..RELEASE_AFTER_SILENT {
        learner.observe_at(&route(), &HeaderMap::new(), now, t0);
    }
    assert_eq!(held(&learner), (5, true), "not yet");
    learner.observe_at(&route(), &HeaderMap::new(), now, t0);
    assert_eq!(held(&learner), (60, false), "released at once");

    // Stated again within the second of the release: applied with the
    // route's next request after it.
    learner.observe_at(&route(), &stating("5"), now, t0);
    assert_eq!(held(&learner), (60, false));
    learner.prepare_at(&route(), t0 + RETUNE_EVERY);
    assert_eq!(held(&learner), (5, true));
}

#[test]
fn an_hour_without_any_response_releases_a_learned_limit() {
    let learner = learner();
    let t0 = Instant::now();
    learner.prepare_at(&route(), t0);
    learner.observe_at(&route(), &stating("5"), SystemTime::now(), t0);
    // Requests the learned limit refuses bring no response: they keep
    // it, however many there are.
    for minutes in 1..60 {
        learner.prepare_at(&route(), t0 + Duration::from_secs(60 * minutes));
    }
    assert_eq!(held(&learner), (5, true));
    learner.prepare_at(&route(), t0 + LAPSE_AFTER);
    assert_eq!(held(&learner), (60, false));
}

#[test]
fn changes_are_logged_once_a_minute_per_route_at_most() {
    let learner = learner();
    let t0 = Instant::now();
    let now = SystemTime::now();
    learner.prepare_at(&route(), t0);
    let observe = |second: u64, limit: &str| {
        let at = t0 + Duration::from_secs(second);
        learner.observe_at(&route(), &stating(limit), now, at);
        let state = learner.state.lock();
        let entry = &state.routes[&route()];
        assert_eq!(entry.applied.requests.map(|l| l.limit), limit.parse().ok());
        (entry.logged.map(|t| t - t0), entry.unlogged)
    };
    let logged = |second| Some(Duration::from_secs(second));
    assert_eq!(observe(0, "5"), (logged(0), 0));
    assert_eq!(observe(2, "6"), (logged(0), 1));
    assert_eq!(observe(4, "7"), (logged(0), 2));
    assert_eq!(
        observe(61, "8"),
        (logged(61), 0),
        "that line counts the two"
    );
}
