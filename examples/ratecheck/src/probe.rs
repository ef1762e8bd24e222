//! Running a plan: each request goes at its planned instant (or as soon as
//! one of the `--concurrency` slots frees), and its outcome is recorded as a
//! status code or a kind of transport failure. Response bodies are read to
//! the end, to time the whole response, and dropped unread.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use crate::cli::Config;
use crate::schedule::{self, Params, Phase, Plan};

/// Runs whose plan lasts longer than this get a progress bar.
const PROGRESS_AFTER: Duration = Duration::from_secs(3);

/// How a request failed before a complete response arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// No connection could be made.
    Connect,
    /// The TLS handshake failed: the certificate is not trusted (see
    /// `--ca-file`), has expired or names another host.
    Tls,
    /// No complete response within `--timeout`.
    Timeout,
    /// The request could not be sent.
    Request,
    /// The response body broke off.
    Body,
    /// Anything else.
    Other,
    /// Still waiting when the run was stopped (Ctrl-C, SIGTERM).
    Cancelled,
}

impl TransportKind {
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Connect => "connect",
            TransportKind::Tls => "tls",
            TransportKind::Timeout => "timeout",
            TransportKind::Request => "request",
            TransportKind::Body => "body",
            TransportKind::Other => "other",
            TransportKind::Cancelled => "cancelled",
        }
    }

    fn of(err: &reqwest::Error) -> TransportKind {
        // Only the kind is kept: reqwest's messages can quote the URL, and
        // with it credentials or tokens in the query string.
        if err.is_timeout() {
            TransportKind::Timeout
        } else if crate::tls::is_tls_failure(err) {
            TransportKind::Tls
        } else if err.is_connect() {
            TransportKind::Connect
        } else if err.is_body() || err.is_decode() {
            TransportKind::Body
        } else if err.is_request() {
            TransportKind::Request
        } else {
            TransportKind::Other
        }
    }
}

/// What came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// A complete response with this status.
    Status(u16),
    /// No complete response.
    Transport(TransportKind),
}

/// The outcome of one planned request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Its index in the plan's events.
    pub event: usize,
    /// When it was sent, from the start of the run.
    pub sent: Duration,
    /// From sending to the end of the response (or the failure).
    pub latency: Duration,
    pub class: Class,
}

impl Outcome {
    /// A 2xx response.
    pub fn is_success(&self) -> bool {
        matches!(self.class, Class::Status(s) if (200..300).contains(&s))
    }

    /// A 429: refused by the limiter.
    pub fn is_refused(&self) -> bool {
        self.class == Class::Status(429)
    }

    /// Anything else: another status, or no response.
    pub fn is_other_failure(&self) -> bool {
        !self.is_success() && !self.is_refused()
    }

    /// Admitted (2xx), refused (429), or neither.
    pub fn admitted(&self) -> Option<bool> {
        if self.is_success() {
            Some(true)
        } else {
            self.is_refused().then_some(false)
        }
    }
}

/// A finished (or interrupted) run.
#[derive(Clone, Debug)]
pub struct Run {
    /// Wall-clock time at the start, for the report.
    pub started_at: SystemTime,
    pub plan: Plan,
    /// One per request sent, in plan order.
    pub outcomes: Vec<Outcome>,
    /// From the start until the last response.
    pub elapsed: Duration,
    /// The run was stopped before it finished: requests still planned were
    /// not sent, those in flight were cancelled.
    pub interrupted: bool,
}

/// The run could not start.
#[derive(Debug)]
pub struct RunError(pub String);

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunError {}

/// The HTTP client every request of a run goes through: no redirects
/// followed (a redirect is an answer to measure, and following one could
/// carry headers elsewhere), `--timeout` per request, for https the public
/// web roots and `--ca-file` trusted.
fn client(config: &Config) -> Result<reqwest::Client, RunError> {
    let tls = crate::tls::client_config(&config.ca_certs).map_err(RunError)?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(config.timeout)
        .connect_timeout(config.timeout.min(Duration::from_secs(10)))
        .user_agent(concat!("ratecheck/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| RunError(format!("cannot build the HTTP client: {e}")))
}

fn request(client: &reqwest::Client, config: &Config) -> reqwest::RequestBuilder {
    let builder = client
        .request(config.method.clone(), config.url.clone())
        .headers(config.headers.clone());
    match &config.body {
        Some(body) => builder.body(body.0.clone()),
        None => builder,
    }
}

async fn send(request: reqwest::RequestBuilder) -> Class {
    let mut response = match request.send().await {
        Ok(response) => response,
        Err(e) => return Class::Transport(TransportKind::of(&e)),
    };
    let status = response.status().as_u16();
    loop {
        match response.chunk().await {
            Ok(Some(_)) => {}
            Ok(None) => return Class::Status(status),
            Err(e) if e.is_timeout() => return Class::Transport(TransportKind::Timeout),
            Err(_) => return Class::Transport(TransportKind::Body),
        }
    }
}

fn progress_bar(plan: &Plan, show: bool) -> ProgressBar {
    if !show || plan.last_at() < PROGRESS_AFTER {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(plan.events.len() as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{bar:25}] {pos}/{len} {elapsed:>3} {wide_msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

fn phase_message(phase: Phase) -> &'static str {
    match phase {
        Phase::Sustained => "sustained stream",
        Phase::Burst => "burst",
        Phase::RefillProbe => "refill probes",
        Phase::SlidingProbe => "once-a-second probes",
        Phase::BoundaryBefore => "batch before the boundary",
        Phase::BoundaryAfter => "batch after the boundary",
        Phase::LateBatch => "batch at the end",
        Phase::AfterSilence => "nothing admitted under the probes: a batch after a quiet window",
        Phase::QuietProbe => "probes after the quiet batch",
    }
}

/// Plan and run `config`'s probe. `progress` allows a progress bar on stderr
/// (shown only for runs longer than a few seconds, on a terminal). When
/// `cancel` completes, no more requests are sent, those in flight are
/// cancelled at once (recorded as `cancelled` transport failures), and the
/// run is marked interrupted.
pub async fn run(
    config: &Config,
    progress: bool,
    cancel: impl Future<Output = ()>,
) -> Result<Run, RunError> {
    let client = client(config)?;
    let start = Instant::now();
    let started_at = SystemTime::now();
    let now_unix = started_at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let plan =
        schedule::plan(&Params::of(config), now_unix).map_err(|e| RunError(e.to_string()))?;

    let bar = progress_bar(&plan, progress);
    let wait = plan.initial_wait();
    if !wait.is_zero() {
        bar.set_message(format!(
            "waiting {:.1} s for the window",
            wait.as_secs_f64()
        ));
    }

    let slots = Arc::new(Semaphore::new(config.concurrency));
    let (stop, stopped) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut plan = plan;
    let mut outcomes = Vec::with_capacity(plan.events.len());
    let mut interrupted = false;
    let mut last_phase = None;
    let mut next = 0;
    let mut extended = false;
    tokio::pin!(cancel);
    'run: loop {
        while let Some(event) = plan.events.get(next).copied() {
            let index = next;
            next += 1;
            let slot = tokio::select! {
                biased;
                () = &mut cancel => {
                    interrupted = true;
                    break 'run;
                }
                slot = async {
                    sleep_until(start + event.at).await;
                    slots.clone().acquire_owned().await
                } => slot,
            };
            // The semaphore is never closed; were it, nothing more could go.
            let Ok(slot) = slot else { break 'run };
            if last_phase != Some(event.phase) {
                last_phase = Some(event.phase);
                bar.set_message(phase_message(event.phase));
            }
            while let Some(done) = tasks.try_join_next() {
                if let Ok(outcome) = done {
                    outcomes.push(outcome);
                }
            }
            let request = request(&client, config);
            let bar = bar.clone();
            let mut stopped = stopped.clone();
            tasks.spawn(async move {
                let sent = Instant::now();
                let class = tokio::select! {
                    class = send(request) => class,
                    _ = stopped.wait_for(|s| *s) => Class::Transport(TransportKind::Cancelled),
                };
                let latency = sent.elapsed();
                drop(slot);
                bar.inc(1);
                Outcome {
                    event: index,
                    sent: sent.saturating_duration_since(start),
                    latency,
                    class,
                }
            });
        }
        loop {
            tokio::select! {
                biased;
                () = &mut cancel => {
                    interrupted = true;
                    break 'run;
                }
                done = tasks.join_next() => match done {
                    Some(Ok(outcome)) => outcomes.push(outcome),
                    Some(Err(_)) => {}
                    None => break,
                },
            }
        }
        // Every answer in: whether the run needs its batch after silence.
        if extended {
            break;
        }
        extended = true;
        // By event, once: a run may hold a million requests.
        let mut admitted = vec![None; plan.events.len()];
        for o in &outcomes {
            if let Some(slot) = admitted.get_mut(o.event) {
                *slot = o.admitted();
            }
        }
        let last_sent = outcomes.iter().map(|o| o.sent).max().unwrap_or_default();
        let extra = plan.after_silence(|i| admitted.get(i).copied().flatten(), last_sent);
        if extra.is_empty() {
            break;
        }
        bar.inc_length(extra.len() as u64);
        plan.events.extend(extra);
    }
    if interrupted {
        bar.set_message("interrupted; cancelling requests in flight");
        stop.send_replace(true);
    }
    while let Some(done) = tasks.join_next().await {
        // A task only fails by panicking, which sending does not do; such a
        // request is simply missing from the report.
        if let Ok(outcome) = done {
            outcomes.push(outcome);
        }
    }
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    outcomes.sort_by_key(|o| o.event);
    Ok(Run {
        started_at,
        plan,
        outcomes,
        elapsed,
        interrupted,
    })
}
