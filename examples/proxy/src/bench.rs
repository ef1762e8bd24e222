//! `--bench`: a bounded load test on loopback. The same requests are sent
//! to the simulator directly, through a plain forwarding proxy built on the
//! same HTTP stack without any layer (the cost of one more HTTP hop), and
//! through the gateway (all four layers active, with limits far above the
//! load, so none is hit), with C connections each sending its share one
//! after another. Prints throughput and latency percentiles of each, what
//! the gateway adds to the direct path, and what its layers add to the
//! plain hop, and what the access log adds to the gateway. `--tls` runs it with an HTTPS upstream instead (`bench_tls`).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::TokioExecutor;
use tower_throttle::error::BoxError;

use crate::config::{Settings, process_env};
use crate::gateway;

/// Every layer on, with limits no load test reaches: the sections both
/// load tests (plain and TLS) give the gateway after their providers.
macro_rules! bench_layers {
    () => {
        r#"
[rate_limit]
quotas = [{ limit = 100000000, period = "1s" }]

[concurrency]
max_in_flight = 100000

[backoff]
initial_backoff = "1s"

[[identity.rules]]
host = "127.0.0.1"
user_agent = "tower-throttle-proxy-bench/0.1"
request_id = true
"#
    };
}
pub(crate) use bench_layers;

/// The gateway for the load test: the simulator answering at once without a
/// limit, and every layer on with limits the load never reaches.
pub const BENCH_CONFIG: &str = concat!(
    r#"
[simulator]
latency = "0ms"
models = [{ name = "sim-small", limit = 0, period = "1s" }]

[[providers]]
name = "sim"
base_url = "simulator"
"#,
    bench_layers!()
);

const BODY: &str = r#"{"model":"sim-small","messages":[{"role":"user","content":"hello"}]}"#;

/// One run's numbers.
#[derive(Clone, Debug)]
pub struct Run {
    /// Requests per second.
    pub throughput: f64,
    /// Median latency, µs.
    pub p50: u64,
    /// 99th percentile, µs.
    pub p99: u64,
    /// Non-200 answers or failures.
    pub errors: u64,
}

type LoadClient = Client<HttpConnector, Full<Bytes>>;

/// `requests` POSTs to `url` over `connections` connections (or streams,
/// when `client` speaks HTTP/2 to it).
pub async fn load<C>(
    client: &Client<C, Full<Bytes>>,
    url: &str,
    requests: u64,
    connections: usize,
) -> Result<Run, BoxError>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let per = requests.div_ceil(connections as u64);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let client = client.clone();
        let url: http::Uri = url.parse()?;
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let mut errors = 0u64;
            for _ in 0..per {
                let request = http::Request::post(url.clone())
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(BODY.as_bytes())))?;
                let sent = Instant::now();
                match client.request(request).await {
                    Ok(response) => {
                        let ok = response.status() == 200;
                        let read = response.into_body().collect().await;
                        if !ok || read.is_err() {
                            errors += 1;
                        }
                    }
                    Err(_) => errors += 1,
                }
                let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                hist.saturating_record(micros.max(1));
            }
            Ok::<_, BoxError>((hist, errors))
        }));
    }
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut errors = 0;
    for task in tasks {
        let (hist, e) = task.await??;
        all.add(&hist)?;
        errors += e;
    }
    let elapsed = start.elapsed();
    Ok(Run {
        throughput: all.len() as f64 / elapsed.as_secs_f64(),
        p50: all.value_at_quantile(0.5),
        p99: all.value_at_quantile(0.99),
        errors,
    })
}

/// A forwarding proxy to `upstream` with nothing but hyper and axum: the
/// floor under any gateway's cost. Returns its URL.
async fn plain_proxy(upstream: String, client: LoadClient) -> Result<String, BoxError> {
    let app = Router::new().fallback(move |req: Request<Body>| {
        let client = client.clone();
        let upstream = upstream.clone();
        async move {
            let (parts, body) = req.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, 4 << 20).await else {
                return StatusCode::BAD_REQUEST.into_response();
            };
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let Ok(uri) = format!("{upstream}{path}").parse::<http::Uri>() else {
                return StatusCode::BAD_REQUEST.into_response();
            };
            let mut headers = parts.headers;
            headers.remove(header::HOST);
            headers.remove(header::CONTENT_LENGTH);
            let mut out = http::Request::new(Full::new(bytes));
            *out.method_mut() = parts.method;
            *out.uri_mut() = uri;
            *out.headers_mut() = headers;
            match client.request(out).await {
                Ok(response) => response.map(Body::new),
                Err(_) => Response::builder()
                    .status(StatusCode::BAD_GATEWAY)
                    .body(Body::empty())
                    .unwrap_or_default(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

/// A gateway whose one route is full: one request in flight (the simulator
/// answers after a minute) and the rest in its wait line.
const SATURATED: &str = r#"
[gateway]
shutdown_grace = "100ms"

[simulator]
latency = "60s"
models = [{ name = "sim-small", limit = 0, period = "1s" }]

[[providers]]
name = "sim"
base_url = "simulator"

[concurrency]
max_in_flight = 1
max_queue = 1000
queue_timeout = "2m"
"#;

/// How `/healthz` answers while 64 clients' requests fill a route (one in
/// flight, the rest waiting their turn): the line of the report.
async fn health_under_saturation(client: &LoadClient) -> Result<String, BoxError> {
    let settings = Settings::from_toml(SATURATED, &process_env)?;
    let running = gateway::start(settings, ([127, 0, 0, 1], 0).into(), "bench")
        .await
        .map_err(|e| e.to_string())?;
    let url = format!("{}/v1/chat/completions", running.url());
    let load: Vec<_> = (0..64)
        .map(|_| {
            let client = client.clone();
            let url = url.clone();
            tokio::spawn(async move {
                loop {
                    let _ = load(&client, &url, 1, 1).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let health: http::Uri = format!("{}/healthz", running.url()).parse()?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for _ in 0..2000 {
        let request = http::Request::get(health.clone()).body(Full::new(Bytes::new()))?;
        let sent = Instant::now();
        let response = client.request(request).await?;
        let ok = response.status() == 200;
        response.into_body().collect().await?;
        if !ok {
            return Err("/healthz did not answer 200 under load".into());
        }
        hist.saturating_record(u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX));
    }
    let waiting = running
        .gateway
        .handles()
        .concurrency
        .stats()
        .aggregate
        .queued_now;
    for task in load {
        task.abort();
    }
    running.shutdown().await;
    Ok(format!(
        "  /healthz with its route saturated ({waiting} requests waiting, 64 clients): \
         p50 {} µs, p99 {} µs, max {} µs over 2000\n",
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.99),
        hist.max()
    ))
}

/// One of the paths the load test compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchPath {
    /// The simulator, straight.
    Direct,
    /// Through the plain forwarding proxy.
    Plain,
    /// Through the gateway.
    Gateway,
    /// Through the gateway writing an access log.
    Logged,
}

/// What the load test runs against: the gateway, its simulator, a plain
/// hop and a gateway that logs, with a client for them.
struct Paths {
    running: gateway::Running,
    logging: gateway::Running,
    log_path: std::path::PathBuf,
    client: LoadClient,
    direct: String,
    plain: String,
    through: String,
    logged: String,
}

impl Paths {
    async fn start(connections: &[usize]) -> Result<Self, BoxError> {
        let settings = Settings::from_toml(BENCH_CONFIG, &process_env)?;
        let running = gateway::start(settings, ([127, 0, 0, 1], 0).into(), "bench")
            .await
            .map_err(|e| e.to_string())?;
        let simulator = running
            .simulator
            .as_ref()
            .map(|s| s.url())
            .unwrap_or_default();
        let direct = format!("{simulator}/v1/chat/completions");
        let through = format!("{}/v1/chat/completions", running.url());
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let most = connections.iter().copied().max().unwrap_or(1);
        let client: LoadClient = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(most * 2)
            .build(connector);
        let plain = format!(
            "{}/v1/chat/completions",
            plain_proxy(simulator.clone(), client.clone()).await?
        );
        // The same gateway writing an access log (JSON lines, every request,
        // to a file): what the log costs.
        let log_path = std::env::temp_dir().join(format!("proxy-bench-{}.log", std::process::id()));
        let logged_config = format!(
            "[gateway]\naccess_log = {:?}\n\n[[providers]]\nname = \"sim\"\nbase_url = {:?}\n{}",
            log_path.display().to_string(),
            simulator,
            bench_layers!()
        );
        let logging = gateway::start(
            Settings::from_toml(&logged_config, &process_env)?,
            ([127, 0, 0, 1], 0).into(),
            "bench",
        )
        .await
        .map_err(|e| e.to_string())?;
        let logged = format!("{}/v1/chat/completions", logging.url());
        Ok(Self {
            running,
            logging,
            log_path,
            client,
            direct,
            plain,
            through,
            logged,
        })
    }

    fn url(&self, path: BenchPath) -> &str {
        match path {
            BenchPath::Direct => &self.direct,
            BenchPath::Plain => &self.plain,
            BenchPath::Gateway => &self.through,
            BenchPath::Logged => &self.logged,
        }
    }

    async fn stop(self) {
        self.logging.shutdown().await;
        let _ = std::fs::remove_file(&self.log_path);
        self.running.shutdown().await;
    }
}

/// The report's name of a path.
fn path_name(path: BenchPath) -> &'static str {
    match path {
        BenchPath::Direct => "simulator direct",
        BenchPath::Plain => "plain proxy, no layers",
        BenchPath::Gateway => "the gateway, four layers",
        BenchPath::Logged => "the gateway with an access log",
    }
}

const TABLE_HEAD: &str =
    "| connections | path | req/s | p50 µs | p99 µs | errors |\n|---:|---|---:|---:|---:|---:|";

fn row(out: &mut String, connections: usize, path: BenchPath, r: &Run) {
    let _ = writeln!(
        out,
        "| {connections} | {} | {:.0} | {} | {} | {} |",
        path_name(path),
        r.throughput,
        r.p50,
        r.p99,
        r.errors
    );
}

/// `--path`: load one path alone, after a warm-up of 500 requests, and
/// report its rows. Two runs of different `--requests` under callgrind
/// give that path's instructions per request by their difference.
pub async fn run_one(
    path: BenchPath,
    requests: u64,
    connections: &[usize],
) -> Result<String, BoxError> {
    let paths = Paths::start(connections).await?;
    let url = paths.url(path).to_owned();
    let mut out = format!("load test: {requests} requests per run, loopback, no limit hit\n");
    out.push_str(TABLE_HEAD);
    out.push('\n');
    for &c in connections {
        load(&paths.client, &url, 500.min(requests), c).await?;
        let r = load(&paths.client, &url, requests, c).await?;
        row(&mut out, c, path, &r);
    }
    paths.stop().await;
    Ok(out)
}

/// Run the comparison and return the report.
pub async fn run(requests: u64, connections: &[usize]) -> Result<String, BoxError> {
    let paths = Paths::start(connections).await?;
    let client = &paths.client;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "load test: {requests} requests per run, loopback, no limit hit"
    );
    out.push_str(TABLE_HEAD);
    out.push('\n');
    let mut summary = String::new();
    for &c in connections {
        // Warm every path up: connections, pools, caches.
        let all = [
            BenchPath::Direct,
            BenchPath::Plain,
            BenchPath::Gateway,
            BenchPath::Logged,
        ];
        for path in all {
            load(client, paths.url(path), 500.min(requests), c).await?;
        }
        let d = load(client, &paths.direct, requests, c).await?;
        let p = load(client, &paths.plain, requests, c).await?;
        let g = load(client, &paths.through, requests, c).await?;
        let l = load(client, &paths.logged, requests, c).await?;
        for (path, r) in all.into_iter().zip([&d, &p, &g, &l]) {
            row(&mut out, c, path, r);
        }
        let share = |a: &Run, b: &Run| 100.0 * a.throughput / b.throughput.max(f64::MIN_POSITIVE);
        let _ = writeln!(
            summary,
            "  {c} connection(s): the gateway adds {} µs at p50 and {} µs at p99 to the direct path and keeps {:.0}% of its throughput;\n    its layers add {} µs at p50 and {} µs at p99 to a plain proxy hop and keep {:.0}% of its throughput",
            g.p50.saturating_sub(d.p50),
            g.p99.saturating_sub(d.p99),
            share(&g, &d),
            g.p50.saturating_sub(p.p50),
            g.p99.saturating_sub(p.p99),
            share(&g, &p),
        );
        let _ = writeln!(
            summary,
            "    its access log (JSON to a file, every request) adds {} µs at p50 and {} µs at p99 and keeps {:.0}% of its throughput",
            l.p50.saturating_sub(g.p50),
            l.p99.saturating_sub(g.p99),
            share(&l, &g),
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    out.push_str(&summary);
    out.push_str(&health_under_saturation(client).await?);
    paths.stop().await;
    Ok(out)
}
