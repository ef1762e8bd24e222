//! `[[routes]]`: a model served by several deployments (providers, or
//! several keys of one), checked against the providers.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Deserialize;
use tower_throttle::error::ConfigError;
use tower_throttle::redact::Quoted;

use super::Provider;
use crate::edge;
use crate::preset::Kind;

/// The most deployments one route may have.
pub const MAX_DEPLOYMENTS: usize = 32;

/// `[[routes]]` as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    /// The model a client names in its body.
    pub model: String,
    /// The providers serving it, in the order of preference.
    pub deployments: Vec<String>,
    /// `"soonest"` (default), `"in_order"` or `"weighted"`.
    pub order: Option<String>,
    /// With `order = "weighted"`: one positive weight per deployment.
    pub weights: Option<Vec<i64>>,
}

/// How a route picks among its deployments that can take a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The one whose limits would admit the request soonest; among those
    /// admitting at once, the one sent the fewest so far.
    Soonest,
    /// The first in the list admitting at once.
    InOrder,
    /// Among those admitting at once, shares by weight (smooth weighted
    /// round robin: deterministic, evenly spread).
    Weighted,
}

/// A route, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelRoute {
    /// The model clients name.
    pub model: Arc<str>,
    /// The providers serving it.
    pub deployments: Vec<Arc<str>>,
    /// How one is picked.
    pub order: Order,
    /// One per deployment; all 1 unless weighted.
    pub weights: Vec<u32>,
}

/// Which API a kind speaks: deployments of one route must speak one, the
/// request's body and path go to any of them unchanged.
fn api(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::OpenAi | Kind::OpenAiCompatible => Some("OpenAI's"),
        Kind::Anthropic => Some("Anthropic's"),
        // The deployment is in the path: a request for another provider's
        // path cannot go to it unchanged.
        Kind::AzureOpenAi => None,
    }
}

/// Check `sections` against `providers`; an error names the entry.
pub fn check_routes(
    sections: &[RouteSection],
    providers: &[Provider],
) -> Result<Vec<ModelRoute>, ConfigError> {
    let mut models = BTreeSet::new();
    let mut routes = Vec::new();
    for (i, section) in sections.iter().enumerate() {
        let route =
            check_route(section, providers).map_err(|e| e.within(&format!("routes[{i}]")))?;
        if !models.insert(route.model.clone()) {
            return Err(ConfigError::new(
                format!("routes[{i}].model"),
                format!("{} has a route already", Quoted(&route.model)),
            ));
        }
        routes.push(route);
    }
    Ok(routes)
}

fn check_route(section: &RouteSection, providers: &[Provider]) -> Result<ModelRoute, ConfigError> {
    if let Some(problem) = edge::model_problem(&section.model) {
        return Err(ConfigError::new("model", problem));
    }
    if section.deployments.is_empty() || section.deployments.len() > MAX_DEPLOYMENTS {
        return Err(ConfigError::new(
            "deployments",
            format!("one to {MAX_DEPLOYMENTS} provider names"),
        ));
    }
    let mut deployments: Vec<Arc<str>> = Vec::new();
    let mut speaks = None;
    for (i, name) in section.deployments.iter().enumerate() {
        let field = || format!("deployments[{i}]");
        let Some(provider) = providers.iter().find(|p| &*p.name == name) else {
            let names: Vec<&str> = providers.iter().map(|p| &*p.name).collect();
            return Err(ConfigError::new(
                field(),
                format!(
                    "no provider is named {} (providers: {})",
                    Quoted(name),
                    names.join(", ")
                ),
            ));
        };
        if deployments.contains(&provider.name) {
            return Err(ConfigError::new(
                field(),
                format!("{} is listed twice", Quoted(name)),
            ));
        }
        let Some(api) = api(provider.kind) else {
            return Err(ConfigError::new(
                field(),
                "an azure_openai provider names its deployment in the path and cannot take \
                 another provider's requests; give each Azure deployment a provider of its own \
                 and call it by its path",
            ));
        };
        match speaks {
            Some(first) if first != api => {
                return Err(ConfigError::new(
                    field(),
                    format!(
                        "speaks {api} API and the first deployment {first}: a request \
                             could not go to either unchanged"
                    ),
                ));
            }
            _ => speaks = Some(api),
        }
        deployments.push(provider.name.clone());
    }
    let order = match section.order.as_deref() {
        None | Some("soonest") => Order::Soonest,
        Some("in_order") => Order::InOrder,
        Some("weighted") => Order::Weighted,
        Some(other) => {
            return Err(ConfigError::new(
                "order",
                format!(
                    "{} is not \"soonest\", \"in_order\" or \"weighted\"",
                    Quoted(other)
                ),
            ));
        }
    };
    let weights = match (&section.weights, order) {
        (None, Order::Weighted) => {
            return Err(ConfigError::new(
                "weights",
                "order = \"weighted\" needs one weight per deployment",
            ));
        }
        (None, _) => vec![1; deployments.len()],
        (Some(_), Order::Soonest | Order::InOrder) => {
            return Err(ConfigError::new(
                "weights",
                "weights are for order = \"weighted\"",
            ));
        }
        (Some(w), Order::Weighted) => {
            if w.len() != deployments.len() {
                return Err(ConfigError::new(
                    "weights",
                    format!("{} weights for {} deployments", w.len(), deployments.len()),
                ));
            }
            w.iter()
                .map(|&n| match u32::try_from(n) {
                    Ok(n @ 1..=1_000_000) => Ok(n),
                    _ => Err(ConfigError::new(
                        "weights",
                        format!("{n} is outside 1..=1000000"),
                    )),
                })
                .collect::<Result<_, _>>()?
        }
    };
    Ok(ModelRoute {
        model: Arc::from(section.model.as_str()),
        deployments,
        order,
        weights,
    })
}
