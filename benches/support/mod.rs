//! Pieces every bench shares: driving a service synchronously, and running
//! a list of named contenders under criterion or, for instruction counts,
//! one of them alone.
#![allow(dead_code)] // each bench uses what it needs

use std::future::Future;
use std::hint::black_box;
use std::task::{Context, Poll, Waker};

use criterion::Criterion;
use tower::Service;

/// `poll_ready`, `call`, and one poll of the response future, with a no-op
/// waker. Panics if anything is pending: every contender is ready.
#[inline(always)]
pub fn drive<S: Service<R>, R>(svc: &mut S, req: R) -> Result<S::Response, S::Error> {
    let mut cx = Context::from_waker(Waker::noop());
    match svc.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {}
        Poll::Ready(Err(e)) => return Err(e),
        Poll::Pending => panic!("service not ready"),
    }
    let fut = svc.call(req);
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("response future pending"),
    }
}

/// One request through one contender; true when it was admitted.
pub type Run = Box<dyn FnMut() -> bool>;

/// Bench every contender in one criterion group `group`. With
/// `{env}_COUNT=<name>` (and optionally `{env}_ITERS=<n>`, default 1,000,000)
/// set, run that one contender n times and return instead: for an
/// instruction count under valgrind or `perf stat` (two values of n; the
/// difference over the difference in n is its instructions per request,
/// whatever else the machine is doing).
pub fn run_contenders(env: &str, group: &str, contenders: impl Fn() -> Vec<(&'static str, Run)>) {
    if let Ok(name) = std::env::var(format!("{env}_COUNT")) {
        let iters: u64 = std::env::var(format!("{env}_ITERS"))
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1_000_000);
        let mut all = contenders();
        let (_, run) = all
            .iter_mut()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no contender named {name}"));
        for _ in 0..iters {
            black_box(run());
        }
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group(group);
    for (name, mut run) in contenders() {
        g.bench_function(name, |b| b.iter(|| black_box(run())));
    }
    g.finish();
    c.final_summary();
}
