//! `--demo`: a short load through the gateway, in three phases, and what
//! each layer did with it. Made for the default configuration (routes
//! `sim/sim-small` and `sim/sim-large`), it works with any that has them.
//!
//! 1. A burst of 30 `sim-small` and 8 `sim-large` requests: the rate limiter
//!    admits a burst, makes some wait their turn and refuses the rest with
//!    429; the concurrency layer queues what is over 4 in flight; the
//!    simulator, whose limits are looser, refuses nothing.
//! 2. A streamed answer: it holds its concurrency permit until its last
//!    chunk.
//! 3. The rate limiter switched off through its handle: a burst of
//!    `sim-large` above the simulator's own limit draws 429s, the route cools
//!    down and is refused by the gateway (503, never reaching the
//!    simulator), while `sim-small` keeps flowing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use futures::StreamExt;
use tower_throttle::error::BoxError;

use crate::gateway::Gateway;
use crate::simulator::{ModelCounts, SimHandle};

/// Statuses of one batch of requests to one model.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// What it was.
    pub label: String,
    /// The model.
    pub model: String,
    /// Status → how many.
    pub statuses: BTreeMap<u16, usize>,
}

// Read by the example's tests.
#[allow(dead_code)]
impl Batch {
    /// How many got `status`.
    pub fn count(&self, status: u16) -> usize {
        self.statuses.get(&status).copied().unwrap_or(0)
    }
}

/// What the demo saw.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Every batch, in order.
    pub batches: Vec<Batch>,
    /// Chunks of the streamed answer.
    pub stream_chunks: usize,
    /// Requests in flight on its route while it streamed.
    pub in_flight_while_streaming: u64,
    /// What the simulator saw, per model, after each phase.
    pub simulator: Vec<(String, Vec<ModelCounts>)>,
    /// The gateway's table at the end.
    pub table: String,
}

// Read by the example's tests.
#[allow(dead_code)]
impl Report {
    /// The batch labelled `label` for `model`.
    pub fn batch(&self, label: &str, model: &str) -> Option<&Batch> {
        self.batches
            .iter()
            .find(|b| b.label == label && b.model == model)
    }
}

fn body(model: &str, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}],
    })
    .to_string()
}

/// Send `n` requests for `model` at once; count the statuses.
async fn burst(client: &reqwest::Client, url: &str, label: &str, model: &str, n: usize) -> Batch {
    let sends = (0..n).map(|_| {
        let request = client
            .post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body(model, false));
        async move {
            match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let _ = response.bytes().await;
                    status
                }
                Err(_) => 0,
            }
        }
    });
    let mut statuses = BTreeMap::new();
    for status in futures::future::join_all(sends).await {
        *statuses.entry(status).or_default() += 1;
    }
    Batch {
        label: label.to_owned(),
        model: model.to_owned(),
        statuses,
    }
}

/// Run the three phases against the gateway at `url`.
pub async fn run(
    url: &str,
    gateway: &Gateway,
    simulator: Option<SimHandle>,
) -> Result<Report, BoxError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let mut report = Report::default();
    let snap = |label: &str, report: &mut Report| {
        if let Some(sim) = &simulator {
            report.simulator.push((label.to_owned(), sim.counts()));
        }
    };

    // 1. A burst on both routes.
    let (small, large) = tokio::join!(
        burst(&client, url, "burst", "sim-small", 30),
        burst(&client, url, "burst", "sim-large", 8),
    );
    report.batches.extend([small, large]);
    snap("after the burst", &mut report);

    // 2. One streamed answer; watch its route's permit while it streams.
    let response = client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body("sim-small", true))
        .send()
        .await?;
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        report.stream_chunks += String::from_utf8_lossy(&chunk).matches("data:").count();
        let in_flight = gateway
            .handles()
            .concurrency
            .stats()
            .keys
            .iter()
            .find(|k| k.key == "sim/sim-small")
            .and_then(|k| k.in_flight)
            .unwrap_or(0);
        report.in_flight_while_streaming = report.in_flight_while_streaming.max(in_flight);
    }

    // 3. Without the gateway's rate limit, the simulator's own refuses.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let rate = &gateway.handles().rate;
    // Put back as found: the configuration's master switch may have it off.
    let was_enabled = rate.is_enabled();
    rate.set_enabled(false);
    let over = burst(&client, url, "rate limit off", "sim-large", 8).await;
    let (cooling, other) = tokio::join!(
        burst(&client, url, "while cooling", "sim-large", 3),
        burst(&client, url, "while cooling", "sim-small", 3),
    );
    rate.set_enabled(was_enabled);
    report.batches.extend([over, cooling, other]);
    snap("after the cooldown", &mut report);

    tokio::time::sleep(Duration::from_millis(100)).await;
    report.table = table(&crate::stats::snapshot(gateway, 0));
    Ok(report)
}

/// The per-route stats as a text table.
pub fn table(s: &crate::stats::Snapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<16} | {:^26} | {:^26} | {:^18} | {:^11}",
        "", "rate limit", "concurrency", "backoff", "upstream"
    );
    let _ = writeln!(
        out,
        "  {:<16} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>8} {:>9} | {:>5} {:>5}",
        "route",
        "admitted",
        "waited",
        "refused",
        "admitted",
        "waited",
        "refused",
        "cooling",
        "refused",
        "2xx",
        "429"
    );
    for r in &s.routes {
        let cooldown = r.cooldown.as_ref().map_or("-".to_owned(), |c| {
            format!("{:.1}s", c.remaining.as_secs_f64())
        });
        let _ = writeln!(
            out,
            "  {:<16} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>8} {:>9} | {:>5} {:>5}",
            r.route,
            r.rate_limit.admitted,
            r.rate_limit.waited,
            r.rate_limit.rejected,
            r.concurrency.admitted,
            r.concurrency.waited,
            r.concurrency.rejected,
            cooldown,
            r.backoff.rejected,
            r.upstream.ok,
            r.upstream.rate_limited,
        );
    }
    out
}

fn statuses(b: &Batch) -> String {
    b.statuses
        .iter()
        .map(|(status, n)| match status {
            0 => format!("{n} failed"),
            s => format!("{n}×{s}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "\ndemo: what each layer did")?;
        for b in &self.batches {
            writeln!(f, "  {:<16} {:<10} {}", b.label, b.model, statuses(b))?;
        }
        writeln!(
            f,
            "  streamed answer: {} events; its route had {} request(s) in flight while it streamed",
            self.stream_chunks, self.in_flight_while_streaming
        )?;
        for (label, counts) in &self.simulator {
            let line: Vec<String> = counts
                .iter()
                .map(|c| {
                    format!(
                        "{} {} received, {} refused (429)",
                        c.model, c.received, c.refused
                    )
                })
                .collect();
            writeln!(f, "  simulator {label}: {}", line.join("; "))?;
        }
        writeln!(
            f,
            "  200: answered; 429 from the gateway: rate limited (or from the simulator, passed on);"
        )?;
        writeln!(
            f,
            "  503: concurrency queue full, or the route cooling down after an upstream 429\n"
        )?;
        write!(f, "{}", self.table)
    }
}
