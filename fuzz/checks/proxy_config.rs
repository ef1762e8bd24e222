//! The proxy example's config TOML (`examples/proxy/src/config/`): any text
//! gives settings or an error, the same each time; an error names its
//! field, shows no hidden character and never an API key read from the
//! environment; settings build every layer of their stack, a reload of the
//! same text changes nothing that needs a restart, and `Debug` never shows
//! an API key.
//!
//! Needs the `proxy` crate. Shared by the fuzz target and
//! `examples/proxy/tests/fuzz_corpus.rs` (by `#[path]`).

use proxy::config::Settings;
use tower_throttle::key::GlobalKey;
use tower_throttle::redact::is_hidden;

/// What every environment variable holds, except those whose name says
/// `MISSING`: a secret that must never be shown.
const SECRET: &str = "sk-fuzz-0000-secret";

fn env(name: &str) -> Option<String> {
    (!name.contains("MISSING")).then(|| SECRET.to_owned())
}

/// Parse `data` (when UTF-8) as the proxy's configuration and check it.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let first = Settings::from_toml(text, &env);
    let again = Settings::from_toml(text, &env);
    let settings = match (first, again) {
        (Ok(a), Ok(b)) => {
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "deterministic");
            assert!(
                a.restart_only_changes(&b).is_empty(),
                "the same text needs a restart: {:?}",
                a.restart_only_changes(&b)
            );
            a
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "deterministic");
            assert!(!a.field.is_empty(), "an error without a field: {a:?}");
            let shown = a.to_string();
            assert!(
                !shown.chars().any(is_hidden),
                "an error shows a hidden character: {shown:?}"
            );
            assert!(!shown.contains(SECRET), "an error shows an API key");
            return;
        }
        (a, b) => panic!(
            "not deterministic: {:?} then {:?}",
            a.map(|_| ()),
            b.map(|_| ())
        ),
    };
    assert!(
        !format!("{settings:?}").contains(SECRET),
        "Debug shows an API key"
    );
    let stack = &settings.stack;
    let _ = stack.rate_limit_layer(GlobalKey);
    if let Err(e) = stack.concurrency_layer(GlobalKey) {
        panic!("checked [concurrency] does not build: {e}");
    }
    if let Err(e) = stack.backoff_layer(GlobalKey) {
        panic!("checked [backoff] does not build: {e}");
    }
    if let Err(e) = stack.identity_layer() {
        panic!("checked [identity] does not build: {e}");
    }
}
