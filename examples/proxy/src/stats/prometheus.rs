//! `GET /metrics`: the snapshot in Prometheus text format, with the label
//! values escaped.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Response, StatusCode, header};
use axum::response::IntoResponse;
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder as _, TextEncoder};

use super::{RouteStats, Snapshot, snapshot};

use crate::gateway::{CallerStats, Gateway};
use crate::learn::{LearnedInfo, QuotaInfo, UnitInfo};

/// The families of one scrape, made from a snapshot and written by
/// `prometheus`'s `TextEncoder` (the text format 0.0.4, which escapes
/// `\`, `"` and line feeds in label values). Not `prometheus-client`: it
/// writes OpenMetrics (`# EOF`, counter families named without `_total`),
/// which `promtool check metrics` reads as families without help; nor
/// `metrics-exporter-prometheus`: its counters count whole numbers, and
/// the wait totals are seconds.
struct Prom {
    families: Vec<MetricFamily>,
}

/// A label value as raw text for the encoder: every control character but
/// the line feed (which the format escapes) as the text of its Rust escape
/// (`\u{1b}`), so none reaches a scraper or a terminal.
fn raw_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\n' => out.push(c),
            '\0' => out.push_str("\\0"),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

/// A route's provider or model, as the layers name it (already
/// [escaped](tower_throttle::redact::Escaped): backslashes doubled, hidden
/// characters as the text of their escapes), as the raw label value a
/// scraper reads back as the name itself: a doubled backslash is one
/// backslash, `\n` a line feed, and every other escape stays the text it
/// is (`\u{1b}`). Escaping the escaped text again would double every
/// backslash a model name holds.
fn route_raw_value(label: &str) -> String {
    let mut out = String::with_capacity(label.len());
    let mut chars = label.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.peek() {
                Some('\\') => {
                    chars.next();
                    out.push('\\');
                }
                Some('n') => {
                    chars.next();
                    out.push('\n');
                }
                // The start of an escape's text (`\r`, `\0`, `\u{1b}`).
                _ => out.push('\\'),
            },
            // Never in an escaped label; made safe all the same.
            c => out.push_str(&raw_label_value(c.encode_utf8(&mut [0; 4]))),
        }
    }
    out
}

impl Prom {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let mut family = MetricFamily::default();
        family.set_name(name.to_owned());
        family.set_help(help.to_owned());
        family.set_field_type(if kind == "counter" {
            MetricType::COUNTER
        } else {
            MetricType::GAUGE
        });
        self.families.push(family);
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.route_sample(name, None, labels, value);
    }

    /// A sample of the family begun last (named `name`), labelled with
    /// `route`'s provider and model (escaped names, see
    /// [`route_raw_value`]) first, then `labels` (raw text).
    fn route_sample(
        &mut self,
        name: &str,
        route: Option<&RouteStats>,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        let route = route.map(|r| {
            [
                ("provider", route_raw_value(&r.provider)),
                ("model", route_raw_value(&r.model)),
            ]
        });
        let raw = labels.iter().map(|(k, v)| (*k, raw_label_value(v)));
        let pairs = route
            .into_iter()
            .flatten()
            .chain(raw)
            .map(|(k, v)| {
                let mut pair = LabelPair::default();
                pair.set_name(k.to_owned());
                pair.set_value(v);
                pair
            })
            .collect();
        let mut metric = Metric::from_label(pairs);
        let Some(family) = self.families.last_mut().filter(|f| f.name() == name) else {
            debug_assert!(false, "{name}: a sample outside its family");
            return;
        };
        if family.get_field_type() == MetricType::COUNTER {
            let mut counter = Counter::default();
            counter.set_value(value);
            metric.set_counter(counter);
        } else {
            let mut gauge = Gauge::default();
            gauge.set_value(value);
            metric.set_gauge(gauge);
        }
        family.mut_metric().push(metric);
    }

    /// A family with one sample per route.
    fn per_route(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        routes: &[RouteStats],
        value: impl Fn(&RouteStats) -> Option<f64>,
    ) {
        self.family(name, kind, help);
        for r in routes {
            if let Some(v) = value(r) {
                self.route_sample(name, Some(r), &[], v);
            }
        }
    }

    /// The text of every family with a sample (the format has no empty
    /// family).
    fn text(mut self) -> String {
        self.families.retain(|f| !f.get_metric().is_empty());
        let mut out = Vec::new();
        match TextEncoder::new().encode(&self.families, &mut out) {
            Ok(()) => String::from_utf8(out).unwrap_or_default(),
            Err(e) => {
                tracing::error!(error = %e, "metrics not written");
                String::new()
            }
        }
    }
}

/// The snapshot in Prometheus text format (version 0.0.4).
pub fn prometheus(s: &Snapshot) -> String {
    let mut p = Prom {
        families: Vec::new(),
    };
    let r = &s.routes;
    let n = |v: u64| Some(v as f64);
    p.per_route(
        "proxy_rate_limit_admitted_total",
        "counter",
        "Requests the rate limiter let through.",
        r,
        |x| n(x.rate_limit.admitted),
    );
    p.per_route(
        "proxy_rate_limit_rejected_total",
        "counter",
        "Requests the rate limiter refused (429).",
        r,
        |x| n(x.rate_limit.rejected),
    );
    p.per_route(
        "proxy_rate_limit_would_reject_total",
        "counter",
        "Requests a dry-run limit would have refused.",
        r,
        |x| n(x.rate_limit.would_reject),
    );
    p.per_route(
        "proxy_rate_limit_waited_total",
        "counter",
        "Admitted requests that waited for their turn.",
        r,
        |x| n(x.rate_limit.waited),
    );
    p.per_route(
        "proxy_rate_limit_wait_seconds_total",
        "counter",
        "Time those requests waited.",
        r,
        |x| Some(x.rate_limit.total_wait_ms / 1e3),
    );
    p.per_route(
        "proxy_rate_limit_queued",
        "gauge",
        "Requests waiting for their turn now.",
        r,
        |x| n(x.rate_limit.queued_now),
    );
    p.per_route(
        "proxy_concurrency_admitted_total",
        "counter",
        "Requests given a concurrency permit.",
        r,
        |x| n(x.concurrency.admitted),
    );
    p.per_route(
        "proxy_concurrency_rejected_total",
        "counter",
        "Requests refused for a full queue or a queue timeout (503).",
        r,
        |x| n(x.concurrency.rejected),
    );
    p.per_route(
        "proxy_concurrency_waited_total",
        "counter",
        "Requests that waited for a permit.",
        r,
        |x| n(x.concurrency.waited),
    );
    p.per_route(
        "proxy_concurrency_wait_seconds_total",
        "counter",
        "Time those requests waited.",
        r,
        |x| Some(x.concurrency.total_wait_ms / 1e3),
    );
    p.per_route(
        "proxy_concurrency_queued",
        "gauge",
        "Requests waiting for a permit now.",
        r,
        |x| n(x.concurrency.queued_now),
    );
    p.per_route(
        "proxy_concurrency_in_flight",
        "gauge",
        "Requests in flight now, streamed bodies until their end.",
        r,
        |x| n(x.concurrency.in_flight.unwrap_or(0)),
    );
    p.per_route(
        "proxy_backoff_admitted_total",
        "counter",
        "Requests the backoff layer let through.",
        r,
        |x| n(x.backoff.admitted),
    );
    p.per_route(
        "proxy_backoff_rejected_total",
        "counter",
        "Requests refused while their route cooled down (503).",
        r,
        |x| n(x.backoff.rejected),
    );
    p.per_route(
        "proxy_backoff_waited_total",
        "counter",
        "Requests held until a cooldown ended.",
        r,
        |x| n(x.backoff.waited),
    );
    p.per_route(
        "proxy_backoff_cooldown_seconds",
        "gauge",
        "Time left of the route's cooldown.",
        r,
        |x| x.cooldown.as_ref().map(|c| c.remaining.as_secs_f64()),
    );
    p.family(
        "proxy_upstream_responses_total",
        "counter",
        "Upstream answers by status class.",
    );
    for x in r {
        let u = &x.upstream;
        for (class, v) in [
            ("2xx", u.ok),
            ("429", u.rate_limited),
            ("4xx", u.client_errors),
            ("5xx", u.server_errors),
        ] {
            p.route_sample(
                "proxy_upstream_responses_total",
                Some(x),
                &[("class", class)],
                v as f64,
            );
        }
    }
    p.per_route(
        "proxy_upstream_failures_total",
        "counter",
        "Upstream requests without an answer.",
        r,
        |x| n(x.upstream.failed),
    );
    p.family(
        "proxy_tokens_total",
        "counter",
        "Tokens of token quotas: charged at admission (estimates), used (as answers reported), \
         given back (estimates above the usage), charged after (usage above the estimate).",
    );
    for x in r {
        let t = &x.upstream.tokens;
        for (kind, v) in [
            ("charged", t.charged),
            ("used", t.used),
            ("given_back", t.given_back),
            ("charged_after", t.charged_after),
        ] {
            p.route_sample("proxy_tokens_total", Some(x), &[("kind", kind)], v as f64);
        }
    }
    p.per_route(
        "proxy_tokens_kept_total",
        "counter",
        "Answers that reported no usage, or ended early: their estimate stands.",
        r,
        |x| n(x.upstream.tokens.kept),
    );
    learned_families(&mut p, r);
    p.family(
        "proxy_backoff_cooldowns_started_total",
        "counter",
        "Cooldowns started.",
    );
    p.sample(
        "proxy_backoff_cooldowns_started_total",
        &[],
        s.aggregate.cooldowns_started as f64,
    );
    p.family(
        "proxy_untracked_routes",
        "gauge",
        "Requests of routes beyond the stats tables, counted under (other).",
    );
    p.sample("proxy_untracked_routes", &[], s.untracked_routes as f64);
    p.family(
        "proxy_config_generation",
        "gauge",
        "1 at start, one more per applied reload.",
    );
    p.sample("proxy_config_generation", &[], s.config.generation as f64);
    p.family("proxy_event_clients", "gauge", "Clients on /events now.");
    p.sample("proxy_event_clients", &[], s.event_clients as f64);
    p.family(
        "proxy_write_timeouts_total",
        "counter",
        "Connections closed because their client stopped reading a response.",
    );
    p.sample("proxy_write_timeouts_total", &[], s.write_timeouts as f64);
    client_families(&mut p, &s.clients);
    if let Some(dropped) = s.access_log_dropped {
        p.family(
            "proxy_access_log_dropped_total",
            "counter",
            "Access log lines dropped because its writer was behind or failing.",
        );
        p.sample("proxy_access_log_dropped_total", &[], dropped as f64);
    }
    p.text()
}

/// One of a client's counts.
type ClientCount = fn(&CallerStats) -> u64;

/// Each `[[clients]]` entry's requests, by name (names are checked plain
/// text; never a key).
fn client_families(p: &mut Prom, clients: &[CallerStats]) {
    if clients.is_empty() {
        return;
    }
    let counted: [(&str, &str, ClientCount); 2] = [
        (
            "proxy_client_requests_total",
            "Requests each client sent to the routes.",
            |c| c.requests,
        ),
        (
            "proxy_client_admitted_total",
            "Requests of each client sent upstream.",
            |c| c.admitted,
        ),
    ];
    for (name, help, of) in counted {
        p.family(name, "counter", help);
        for c in clients {
            p.sample(name, &[("client", &c.name)], of(c) as f64);
        }
    }
    p.family(
        "proxy_client_refused_total",
        "counter",
        "Requests of each client refused, by the limit that refused (its own quota: client; the route's limits: route).",
    );
    for c in clients {
        for (limit, n) in [("client", c.refused_client), ("route", c.refused_route)] {
            p.sample(
                "proxy_client_refused_total",
                &[("client", &c.name), ("limit", limit)],
                n as f64,
            );
        }
    }
    p.family(
        "proxy_client_tokens_total",
        "counter",
        "Tokens the answers to each client said they used (when a quota counts tokens).",
    );
    for c in clients {
        p.sample(
            "proxy_client_tokens_total",
            &[("client", &c.name)],
            c.tokens as f64,
        );
    }
    p.family(
        "proxy_client_waiting",
        "gauge",
        "Requests of each client in the gateway not yet sent upstream.",
    );
    for c in clients {
        p.sample(
            "proxy_client_waiting",
            &[("client", &c.name)],
            c.waiting as f64,
        );
    }
}

/// The learned limits, one sample per route and unit said.
fn learned_families(p: &mut Prom, routes: &[RouteStats]) {
    type Value = fn(&UnitInfo) -> Option<f64>;
    let families: [(&str, &str, Value); 4] = [
        (
            "proxy_learned_limit",
            "Units per window the provider states (learn_limits).",
            |u| u.limit.map(|v| v as f64),
        ),
        (
            "proxy_learned_remaining",
            "Units left, as the provider last said.",
            |u| u.remaining.map(|v| v as f64),
        ),
        (
            "proxy_learned_reset_seconds",
            "Seconds until the limit is whole, as the provider last said.",
            |u| u.reset_seconds,
        ),
        (
            "proxy_learned_timestamp_seconds",
            "When the provider last said it, Unix seconds.",
            |u| Some(u.learned_unix),
        ),
    ];
    for (name, help, value) in families {
        p.family(name, "gauge", help);
        for r in routes {
            let Some(learned) = &r.learned else { continue };
            for (unit, info) in learned.units() {
                if let Some(v) = info.and_then(value) {
                    p.route_sample(name, Some(r), &[("unit", unit)], v);
                }
            }
        }
    }
    p.family(
        "proxy_learned_in_force",
        "gauge",
        "1 while a learned limit holds the route (learn_limits), else 0.",
    );
    for r in routes {
        if let Some(learned) = &r.learned {
            let v = if learned.in_force { 1.0 } else { 0.0 };
            p.route_sample("proxy_learned_in_force", Some(r), &[], v);
        }
    }
    // The quotas next to what was learned: configured, and held to now.
    type Quotas = fn(&LearnedInfo) -> &[QuotaInfo];
    let quotas: [(&str, &str, Quotas); 2] = [
        (
            "proxy_route_quota_configured",
            "A learning route's configured quota: its limit, per period_seconds.",
            |l| &l.configured,
        ),
        (
            "proxy_route_quota_in_force",
            "A learning route's quota now, tightened by what it learned.",
            |l| &l.quotas,
        ),
    ];
    for (name, help, list) in quotas {
        p.family(name, "gauge", help);
        for r in routes {
            let Some(learned) = &r.learned else { continue };
            for q in list(learned) {
                let period = q.period_seconds.to_string();
                let labels = [("period_seconds", period.as_str()), ("unit", q.unit)];
                p.route_sample(name, Some(r), &labels, f64::from(q.limit));
            }
        }
    }
}

/// `GET /metrics`.
pub async fn metrics(State(gateway): State<Gateway>) -> Response<Body> {
    let text = prometheus(&snapshot(&gateway, gateway.hub().borrow().seq));
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
