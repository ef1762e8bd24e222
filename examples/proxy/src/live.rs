//! Every setting of the stateful layers live: what a configuration says
//! about the rate limiter, the concurrency permits and the backoff table,
//! applied through their handles at start and on every reload, and the
//! master switch.
//!
//! The client stack itself (waits, queue limits, `release_at_headers`,
//! identity rules, timeouts) is rebuilt on each reload around the same
//! stateful layers (see `gateway::build`); what lives in those layers'
//! state is changed here, without losing it: spent capacity stays spent,
//! requests in flight keep their permits, cooling routes keep cooling.

use tower_throttle::error::ConfigError;
use tower_throttle::rate_limit::Limits;

use crate::config::Settings;
use crate::gateway::Handles;

/// Concurrency without a `[concurrency]` section: the layer still counts
/// requests in flight per route, it just never makes one wait.
pub const UNLIMITED: usize = 1 << 30;

/// The master switch: top-level `enabled` in the file, on unless it says
/// `false`. Off, every layer passes every request untouched.
pub fn enabled(settings: &Settings) -> bool {
    settings.file.enabled != Some(false)
}

/// Requests in flight per route that `settings` allow.
pub fn max_in_flight(settings: &Settings) -> usize {
    match &settings.stack.concurrency {
        Some(c) => usize::try_from(c.max_in_flight).unwrap_or(1).max(1),
        None => UNLIMITED,
    }
}

/// Apply `settings` to the stateful layers. The settings were checked
/// whole when they were read (`Settings::check`), so nothing here fails in
/// practice; the one step that could (rate-limit rule names) goes first and
/// changes nothing when it does.
pub fn apply(handles: &Handles, settings: &Settings) -> Result<(), ConfigError> {
    let on = enabled(settings);
    let mut limits: Limits = match &settings.stack.rate_limit {
        Some(limits) => limits.clone(),
        // No section: limiting is off, but the quotas in force stay in
        // place (switched off), so a section gone for a moment forgets
        // nothing any key has spent.
        None => {
            let mut kept = handles.learned.configured();
            if kept.default.is_empty() && kept.rules.is_empty() {
                Limits::default()
            } else {
                kept.enabled = false;
                kept
            }
        }
    };
    // Off overrides the section's own switch; on, the section decides.
    limits.enabled &= on;
    // The learned limits go on top of the configured ones (see `learn`).
    handles
        .learned
        .apply(settings, &limits)
        .map_err(|e| e.within("rate_limit"))?;
    handles
        .concurrency
        .set_max_in_flight(max_in_flight(settings))
        .map_err(|e| e.within("concurrency"))?;
    handles.concurrency.set_enabled(on);
    handles
        .backoff
        .apply(&settings.stack.backoff.clone().unwrap_or_default())
        .map_err(|e| e.within("backoff"))?;
    if settings.providers.iter().any(|p| p.learn_limits) {
        // A provider saying its limit is spent (remaining 0, with a reset)
        // cools the route before the 429; see `learn`.
        handles.backoff.set_proactive(true);
    }
    handles.backoff.set_enabled(on);
    let mut clients = crate::config::client_limits(&settings.clients)?;
    clients.enabled = on;
    handles
        .clients
        .apply(&clients)
        .map_err(|e| e.within("clients"))?;
    let mut models = crate::config::client_model_limits(&settings.clients)?;
    models.enabled = on;
    handles
        .client_models
        .apply(&models)
        .map_err(|e| e.within("clients"))?;
    Ok(())
}
