//! Fallback between deployments: a `[[routes]]` model served by several
//! providers. Each request goes to the deployment whose limits would admit
//! it soonest (or the first admitting at once, or by weight), asked without
//! booking; the chosen one's layers then book it as any request. A
//! deployment cooling down after a 429, or failing (unreachable, or a
//! 502/503/504 of its own, in the last [`DOWN_FOR`]), is passed over while
//! another can take the request.
//!
//! Asking and booking are two steps: two requests arriving together may
//! both pick a deployment with room for one, and the second then waits or
//! is refused there, as it would without fallback.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use tokio::time::Instant;

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Response, StatusCode};
use bytes::Bytes;
use http::request::Parts;

use super::build::UNREACHABLE;
use super::callers::{Caller, WaitMark};
use super::{Current, Gateway, forward};
use crate::access_log::Reached;
use crate::config::{ModelRoute, Order};
use crate::reply::{ErrorCode, json_error};

type Counter = Arc<AtomicU64>;
type ModelDeployment = (Arc<str>, Arc<str>);

/// How long a deployment that failed is passed over.
pub const DOWN_FOR: Duration = Duration::from_secs(10);

/// The counts and failures that outlive a reload.
#[derive(Debug, Default)]
pub struct DeployState {
    /// Requests answered, by (model, deployment).
    served: Mutex<HashMap<ModelDeployment, Counter>>,
    down_until: Mutex<HashMap<Arc<str>, Instant>>,
}

impl DeployState {
    fn served(&self, model: &Arc<str>, deployment: &Arc<str>) -> Arc<AtomicU64> {
        self.served
            .lock()
            .entry((model.clone(), deployment.clone()))
            .or_default()
            .clone()
    }

    /// `deployment` failed: passed over for [`DOWN_FOR`].
    pub fn failed(&self, deployment: &Arc<str>) {
        let until = Instant::now() + DOWN_FOR;
        self.down_until.lock().insert(deployment.clone(), until);
        tracing::warn!(
            deployment = %deployment,
            "deployment failing; its routes' requests go to the others for {DOWN_FOR:?}"
        );
    }

    /// `deployment` answered: no longer passed over.
    pub fn answered(&self, deployment: &Arc<str>) {
        let mut down = self.down_until.lock();
        if !down.is_empty() {
            down.remove(deployment);
        }
    }

    /// Whether `deployment` is passed over now.
    pub fn is_down(&self, deployment: &str) -> bool {
        let down = self.down_until.lock();
        down.get(deployment)
            .is_some_and(|until| *until > Instant::now())
    }
}

/// What the layers would do with a request to one deployment now.
#[derive(Clone, Copy, Debug, Default)]
pub struct Look {
    /// The rate limiter's wait (zero: at once).
    pub wait: Duration,
    /// What is left of its cooldown, if it is cooling down.
    pub cooling: Option<Duration>,
    /// Whether it failed lately.
    pub down: bool,
}

/// The routes of one configuration.
#[derive(Debug, Default)]
pub struct Dispatch {
    routes: Vec<RouteChoice>,
}

impl Dispatch {
    /// The routes of `routes`, counting into `state`.
    pub fn new(routes: &[ModelRoute], state: &DeployState) -> Self {
        Self {
            routes: routes
                .iter()
                .map(|route| RouteChoice {
                    picked: route
                        .deployments
                        .iter()
                        .map(|_| AtomicU64::new(0))
                        .collect(),
                    served: route
                        .deployments
                        .iter()
                        .map(|d| state.served(&route.model, d))
                        .collect(),
                    smooth: Mutex::new(vec![0; route.deployments.len()]),
                    route: route.clone(),
                })
                .collect(),
        }
    }

    /// Whether there is no route.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The route of `model`, if it has one.
    pub fn route(&self, model: &str) -> Option<&RouteChoice> {
        self.routes.iter().find(|r| &*r.route.model == model)
    }

    /// Each route's deployments and their shares, for `/stats`.
    pub fn shares(&self, state: &DeployState) -> Vec<RouteShares> {
        self.routes
            .iter()
            .map(|r| {
                let served: Vec<u64> = r.served.iter().map(|n| n.load(Ordering::Relaxed)).collect();
                let total: u64 = served.iter().sum();
                RouteShares {
                    model: r.route.model.to_string(),
                    order: match r.route.order {
                        Order::Soonest => "soonest",
                        Order::InOrder => "in_order",
                        Order::Weighted => "weighted",
                    },
                    deployments: r
                        .route
                        .deployments
                        .iter()
                        .zip(served)
                        .map(|(name, served)| DeploymentShare {
                            name: name.to_string(),
                            served,
                            share: if total == 0 {
                                0.0
                            } else {
                                served as f64 / total as f64
                            },
                            down: state.is_down(name),
                        })
                        .collect(),
                }
            })
            .collect()
    }
}

/// One route and its counts.
#[derive(Debug)]
pub struct RouteChoice {
    route: ModelRoute,
    /// Requests sent to each under this configuration: spreads requests
    /// among deployments all free.
    picked: Vec<AtomicU64>,
    /// Requests each answered, since start.
    served: Vec<Arc<AtomicU64>>,
    /// Smooth weighted round robin's running weights.
    smooth: Mutex<Vec<i64>>,
}

impl RouteChoice {
    /// The deployments, in the configured order.
    pub fn deployments(&self) -> &[Arc<str>] {
        &self.route.deployments
    }

    /// The deployment for the next request, given what `look` says of each
    /// and leaving out those `tried`; `None` when all were tried. One
    /// that can take the request (not cooling, not down) is preferred;
    /// among those, `order` picks. When none can, the one that could
    /// soonest: its layers then wait or refuse with the earliest retry.
    pub fn choose(&self, look: impl Fn(&str) -> Look, tried: &[usize]) -> Option<usize> {
        let looks: Vec<(usize, Look)> = (0..self.route.deployments.len())
            .filter(|i| !tried.contains(i))
            .map(|i| (i, look(&self.route.deployments[i])))
            .collect();
        let open: Vec<(usize, Duration)> = looks
            .iter()
            .filter(|(_, l)| l.cooling.is_none() && !l.down)
            .map(|(i, l)| (*i, l.wait))
            .collect();
        let pick = if open.is_empty() {
            // Down ones last: a cooldown ends for sure, a failure may not.
            looks
                .iter()
                .min_by_key(|(i, l)| (l.down, l.wait.max(l.cooling.unwrap_or_default()), *i))
                .map(|(i, _)| *i)
        } else {
            let now: Vec<usize> = open
                .iter()
                .filter(|(_, w)| w.is_zero())
                .map(|(i, _)| *i)
                .collect();
            match self.route.order {
                _ if now.is_empty() => open.iter().min_by_key(|(i, w)| (*w, *i)).map(|(i, _)| *i),
                Order::Soonest => now
                    .into_iter()
                    .min_by_key(|i| (self.picked[*i].load(Ordering::Relaxed), *i)),
                Order::InOrder => now.first().copied(),
                Order::Weighted => Some(self.weighted(&now)),
            }
        };
        if let Some(i) = pick {
            self.picked[i].fetch_add(1, Ordering::Relaxed);
        }
        pick
    }

    /// Smooth weighted round robin over `among` (nginx's: each gains its
    /// weight, the highest is picked and loses the total), so that weights
    /// 3 and 1 give a a b a, spread, not by chance.
    fn weighted(&self, among: &[usize]) -> usize {
        let mut current = self.smooth.lock();
        let total: i64 = among
            .iter()
            .map(|&i| i64::from(self.route.weights[i]))
            .sum();
        let mut best = among[0];
        for &i in among {
            current[i] += i64::from(self.route.weights[i]);
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        best
    }
}

/// The header naming the deployment that served (or refused) a request.
pub const DEPLOYMENT_HEADER: HeaderName = HeaderName::from_static("x-gateway-deployment");

/// Send a request for `route`'s model to the deployment chosen for it;
/// when that one cannot be reached (nothing was sent), to the next.
pub(super) async fn send(
    gateway: &Gateway,
    current: &Current,
    route: &RouteChoice,
    parts: Parts,
    body: Bytes,
) -> Response<Body> {
    let handles = gateway.handles();
    let state = &gateway.inner.layers.deploy;
    let target_of = |name: &str| current.targets.iter().find(|t| &*t.name == name);
    let look = |name: &str| {
        let Some(target) = target_of(name) else {
            return Look {
                down: true,
                ..Look::default()
            };
        };
        // Counted under the model that deployment serves it as.
        let model = target
            .aliases
            .resolve(Some(&route.route.model))
            .unwrap_or(&route.route.model);
        let key = [name, &**model];
        Look {
            wait: handles.rate.peek_wait(&key),
            cooling: handles.backoff.cooldown(&key).map(|c| c.remaining),
            down: state.is_down(name),
        }
    };
    let mut tried = Vec::new();
    loop {
        let Some(i) = route.choose(look, &tried) else {
            // Every deployment tried and unreachable (the last answer went
            // back); not reached with at least one.
            return json_error(
                StatusCode::BAD_GATEWAY,
                UNREACHABLE,
                "no deployment of this model could be reached",
            );
        };
        tried.push(i);
        let name = &route.deployments()[i];
        let Some(target) = target_of(name) else {
            continue;
        };
        let mut response =
            forward::send(gateway, current, target, 0, copy(&parts), body.clone()).await;
        let reached = response.extensions().get::<Reached>().is_some();
        let code = response.extensions().get::<ErrorCode>().map(|c| c.0);
        // Nothing was sent: no connection, or no TLS session.
        let unreachable = matches!(code, Some(c) if c == UNREACHABLE || c == "upstream_tls");
        let status = response.status().as_u16();
        let failed = matches!(code, Some("upstream_timeout" | "upstream_failed"));
        if unreachable || failed || (reached && (502..=504).contains(&status)) {
            state.failed(name);
        } else if reached {
            state.answered(name);
        }
        if reached {
            route.served[i].fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(value) = HeaderValue::from_str(name) {
            response.headers_mut().insert(DEPLOYMENT_HEADER, value);
        }
        if unreachable && tried.len() < route.deployments().len() {
            continue;
        }
        return response;
    }
}

/// A request head again, for another deployment.
fn copy(parts: &Parts) -> Parts {
    let (mut copy, ()) = http::Request::new(()).into_parts();
    copy.method = parts.method.clone();
    copy.uri = parts.uri.clone();
    copy.version = parts.version;
    copy.headers = parts.headers.clone();
    if let Some(caller) = parts.extensions.get::<Caller>() {
        copy.extensions.insert(caller.clone());
    }
    // Its clones end its wait once, when the first attempt goes upstream.
    if let Some(mark) = parts.extensions.get::<WaitMark>() {
        copy.extensions.insert(mark.clone());
    }
    copy
}

/// A route's deployments as `/stats` shows them.
#[derive(Clone, Debug, Serialize)]
pub struct RouteShares {
    /// The model clients name.
    pub model: String,
    /// `soonest`, `in_order` or `weighted`.
    pub order: &'static str,
    /// Each deployment, in the configured order.
    pub deployments: Vec<DeploymentShare>,
}

/// One deployment's share of its route.
#[derive(Clone, Debug, Serialize)]
pub struct DeploymentShare {
    /// The provider.
    pub name: String,
    /// Requests it answered since start (not those refused before they
    /// were sent).
    pub served: u64,
    /// Its part of the route's requests, 0 to 1.
    pub share: f64,
    /// Whether it is passed over now for a failure.
    pub down: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(order: Order, weights: Vec<u32>) -> RouteChoice {
        let routes = [ModelRoute {
            model: Arc::from("m"),
            deployments: vec![Arc::from("a"), Arc::from("b"), Arc::from("c")],
            order,
            weights,
        }];
        Dispatch::new(&routes, &DeployState::default())
            .routes
            .remove(0)
    }

    fn name(r: &RouteChoice, i: Option<usize>) -> &str {
        &r.deployments()[i.unwrap()]
    }

    #[test]
    fn soonest_spreads_while_all_are_free_and_then_takes_the_shortest_wait() {
        let r = route(Order::Soonest, vec![1; 3]);
        let free = |_: &str| Look::default();
        let picks: Vec<&str> = (0..4).map(|_| name(&r, r.choose(free, &[]))).collect();
        assert_eq!(picks, ["a", "b", "c", "a"]);
        let waits = |d: &str| Look {
            wait: Duration::from_secs(match d {
                "a" => 3,
                "b" => 1,
                _ => 2,
            }),
            ..Look::default()
        };
        assert_eq!(name(&r, r.choose(waits, &[])), "b");
    }

    #[test]
    fn cooling_and_down_ones_are_passed_over_until_none_is_left() {
        let r = route(Order::InOrder, vec![1; 3]);
        let look = |d: &str| Look {
            cooling: (d == "a").then_some(Duration::from_secs(5)),
            down: d == "b",
            wait: Duration::from_secs(u64::from(d == "c") * 9),
        };
        // c waits 9 s, still before a cooling one and a down one.
        assert_eq!(name(&r, r.choose(look, &[])), "c");
        // Without c: a's cooldown ends; b may never come back.
        assert_eq!(name(&r, r.choose(look, &[2])), "a");
        assert_eq!(name(&r, r.choose(look, &[0, 2])), "b");
        assert_eq!(r.choose(look, &[0, 1, 2]), None);
    }

    #[test]
    fn weighted_gives_each_its_share_spread_evenly() {
        let r = route(Order::Weighted, vec![3, 1, 1]);
        let look = |d: &str| Look {
            down: d == "c",
            ..Look::default()
        };
        let picks: String = (0..8).map(|_| name(&r, r.choose(look, &[]))).collect();
        // c is down: a and b share by 3 to 1.
        assert_eq!(picks, "aabaaaba");
    }
}
