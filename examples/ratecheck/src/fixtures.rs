//! Recorded diagnose runs for the inference's tests: each limiter design,
//! written as the servers in the wild run it (independently of
//! [`crate::models`], so that a slip in one is not copied into the other),
//! answers diagnose's plan, and the answers become a [`Timeline`] as a real
//! run records it. Noise is optional: a jittered network and server (each
//! request reaches the limiter up to `jitter` late, so requests sent at one
//! instant arrive in any order) and a few requests lost on the way (never
//! counted, recorded as failed).

use std::collections::VecDeque;
use std::time::Duration;

use crate::cli::Config;
use crate::schedule::{self, Event, Params, Plan};
use crate::timeline::{Request, Timeline};

/// A limiter as deployed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Server {
    /// GCRA, as nginx `limit_req ... burst=limit-1 nodelay` runs it.
    Gcra,
    /// A counter per clock-aligned window.
    FixedWindow,
    /// Redis `INCR` then `EXPIRE` on the first: refused requests counted too.
    Anchored,
    /// A log of admissions.
    SlidingLog,
    /// Cloudflare's and Upstash's weighted counter, counting admissions.
    WeightedCounter,
    /// The weighted counter counting every request, refused ones too.
    WeightedCounterCountingRefusals,
    /// A log of every request, refused ones too.
    SlidingLogCountingRefusals,
    /// Redis `INCR` then `EXPIRE` on every request: each request, refused
    /// or not, pushes the window's end back.
    AnchoredPushedBack,
    /// At most `limit` in flight, each admitted request taking 23% of the
    /// window (not a multiple of the probes' spacing: real service times
    /// are not).
    Concurrency,
    /// No limit.
    Unlimited,
    /// Admits its limit once, never again.
    NeverRecovers,
    /// Answers 503 to everything.
    Broken,
}

/// Noise on a run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Noise {
    /// Each request reaches the limiter up to this late (spread evenly, in
    /// a fixed pseudo-random order).
    pub jitter: Duration,
    /// Every `lost_every`-th request is lost before the limiter (0: none).
    pub lost_every: usize,
    /// The network's delay each way (0: half a millisecond).
    pub network: Duration,
    /// Each request leaves up to this late (a busy client opening many
    /// connections at once): its recorded sending time is when it left.
    pub late_send: Duration,
}

/// A diagnose run's plan for `limit` per `window` hints, `probe` long,
/// made at `now` (from the Unix epoch).
pub fn plan(limit: u32, window: Duration, probe: Option<Duration>, now: Duration) -> Plan {
    let (limit, window_ms) = (limit.to_string(), window.as_millis().to_string());
    let window_arg = format!("{window_ms}ms");
    let probe_arg = probe.map(|p| p.as_secs().to_string());
    let mut args = vec![
        "ratecheck",
        "--url",
        "http://127.0.0.1:9/",
        "--mode",
        "diagnose",
        "--rpm",
        &limit,
        "--window",
        &window_arg,
    ];
    if let Some(p) = &probe_arg {
        args.extend(["--probe-seconds", p]);
    }
    let config = Config::from_args(args).expect("a valid command line");
    schedule::plan(&Params::of(&config), now).expect("a small plan")
}

/// A fixed pseudo-random sequence in [0, 1) (an LCG): the fixtures must
/// be the same on every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One request on its way through the fixture.
struct Trip {
    index: usize,
    sent_us: i64,
    arrive_us: i64,
    lost: bool,
}

/// The timeline of `server` enforcing `limit` per `window` answering the
/// diagnose `plan` made at `now`, hinted `hint` per `hint_window`.
pub fn record(
    server: Server,
    limit: u32,
    window: Duration,
    plan: &Plan,
    now: Duration,
    hints: (u32, Duration),
    noise: Noise,
) -> Timeline {
    // Half a millisecond each way unless the noise says otherwise.
    let net_us = match noise.network.as_micros() as i64 {
        0 => 500,
        us => us,
    };
    let now_us = now.as_micros() as i64;
    let w_us = window.as_micros() as i64;
    let mut rng = Lcg(0x5eed);
    let jitter_us = noise.jitter.as_micros() as f64;
    let late_us = noise.late_send.as_micros() as f64;
    let mut trips_of = |events: &[Event], from: usize| {
        let mut trips: Vec<Trip> = events
            .iter()
            .enumerate()
            .skip(from)
            .map(|(index, e)| {
                let sent_us = e.at.as_micros() as i64 + (rng.next() * late_us) as i64;
                Trip {
                    index,
                    sent_us,
                    arrive_us: sent_us + net_us + (rng.next() * jitter_us) as i64,
                    lost: noise.lost_every > 0 && index % noise.lost_every == noise.lost_every / 2,
                }
            })
            .collect();
        trips.sort_by_key(|t| (t.arrive_us, t.index));
        trips
    };
    let mut events = plan.events.clone();
    let mut trips = trips_of(&events, 0);

    let limit_i = i64::from(limit);
    let mut state = State::default();
    let mut requests = vec![None; events.len()];
    // As a run does: the planned requests, then the batch after silence if
    // their answers call for it.
    let mut extended = false;
    loop {
        for trip in &trips {
            let phase = events[trip.index].phase;
            if trip.lost {
                requests[trip.index] = Some(Request {
                    phase,
                    sent_s: trip.sent_us as f64 / 1e6,
                    latency_s: 10.0,
                    status: None,
                });
                continue;
            }
            let at = trip.arrive_us;
            let unix = now_us + at;
            let (status, service_us) = match server {
                Server::Broken => (503, 1_000),
                Server::Unlimited => (200, 1_000),
                Server::Concurrency => {
                    state.in_flight.retain(|&end| end > at);
                    if state.in_flight.len() < limit as usize {
                        let service = w_us * 23 / 100;
                        state.in_flight.push(at + service);
                        (200, service)
                    } else {
                        (429, 1_000)
                    }
                }
                _ => (
                    if state.admit(server, limit_i, w_us, at, unix) {
                        200
                    } else {
                        429
                    },
                    1_000,
                ),
            };
            requests[trip.index] = Some(Request {
                phase,
                sent_s: trip.sent_us as f64 / 1e6,
                latency_s: (at - trip.sent_us + service_us + net_us) as f64 / 1e6,
                status: Some(status),
            });
        }
        if extended {
            break;
        }
        extended = true;
        let last_sent = requests
            .iter()
            .flatten()
            .map(|r| Duration::from_secs_f64(r.sent_s.max(0.0)))
            .max()
            .unwrap_or_default();
        let extra = plan.after_silence(
            |i| requests[i].and_then(|r: Request| r.admitted()),
            last_sent,
        );
        if extra.is_empty() {
            break;
        }
        let from = events.len();
        events.extend(extra);
        requests.resize(events.len(), None);
        trips = trips_of(&events, from);
    }
    Timeline {
        start_unix_s: now.as_secs_f64(),
        burst_at_s: plan.burst_at.unwrap_or_default().as_secs_f64(),
        limit_hint: hints.0,
        window_hint_s: hints.1.as_secs_f64(),
        requests: requests.into_iter().flatten().collect(),
    }
}

/// Every design's state; each uses its own part. Integer microseconds.
#[derive(Default)]
struct State {
    /// GCRA: the theoretical arrival time.
    tat: Option<i64>,
    /// Fixed windows: the window's number and its count.
    window: Option<i64>,
    count: i64,
    /// Anchored: when the key expires.
    expires: Option<i64>,
    /// Sliding log.
    log: VecDeque<i64>,
    /// Weighted counter: the previous window's count.
    previous: i64,
    /// Concurrency: when each admitted request in flight ends.
    in_flight: Vec<i64>,
    /// Never recovers: admitted so far.
    admitted: i64,
}

impl State {
    fn admit(&mut self, server: Server, limit: i64, w: i64, at: i64, unix: i64) -> bool {
        match server {
            Server::Gcra => {
                let t = w / limit;
                let tat = self.tat.unwrap_or(at).max(at);
                if tat - at <= (limit - 1) * t {
                    self.tat = Some(tat + t);
                    true
                } else {
                    false
                }
            }
            Server::FixedWindow => {
                let index = unix.div_euclid(w);
                if self.window != Some(index) {
                    self.window = Some(index);
                    self.count = 0;
                }
                self.count += 1;
                self.count <= limit
            }
            Server::Anchored => {
                if self.expires.is_none_or(|e| at >= e) {
                    self.expires = None;
                    self.count = 0;
                }
                self.count += 1; // INCR, whatever the answer
                if self.count == 1 {
                    self.expires = Some(at + w); // EXPIRE on the first
                }
                self.count <= limit
            }
            Server::SlidingLog | Server::SlidingLogCountingRefusals => {
                while self.log.front().is_some_and(|&a| a + w <= at) {
                    self.log.pop_front();
                }
                let ok = (self.log.len() as i64) < limit;
                if ok || server == Server::SlidingLogCountingRefusals {
                    self.log.push_back(at);
                }
                ok
            }
            Server::AnchoredPushedBack => {
                if self.expires.is_none_or(|e| at >= e) {
                    self.count = 0;
                }
                self.count += 1; // INCR
                self.expires = Some(at + w); // EXPIRE, every time
                self.count <= limit
            }
            Server::WeightedCounter | Server::WeightedCounterCountingRefusals => {
                let index = unix.div_euclid(w);
                match self.window {
                    Some(i) if i == index => {}
                    Some(i) if i + 1 == index => {
                        self.previous = self.count;
                        self.count = 0;
                    }
                    _ => {
                        self.previous = 0;
                        self.count = 0;
                    }
                }
                self.window = Some(index);
                let left = w - unix.rem_euclid(w);
                // previous × left / w + count < limit, in integers.
                let ok = self.previous * left + self.count * w < limit * w;
                if ok || server == Server::WeightedCounterCountingRefusals {
                    self.count += 1;
                }
                ok
            }
            Server::NeverRecovers => {
                self.admitted += 1;
                self.admitted <= limit
            }
            Server::Concurrency | Server::Unlimited | Server::Broken => true,
        }
    }
}
