//! The settings renamed to one shape (`with_<setting>(value)`) keep their
//! old names, deprecated: each old name does exactly what its new one does.

#![allow(deprecated)]

use tower_throttle::backoff::{Backoff429Layer, RetryPolicy};
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::key::GlobalKey;

/// The layers' `Debug` shows their settings: equal for the same settings,
/// different for others (checked below, so the comparison can fail).
fn shown(value: &impl std::fmt::Debug) -> String {
    format!("{value:?}")
}

#[test]
fn old_names_do_what_the_new_ones_do() {
    let concurrency = || ConcurrencyLayer::new(2, GlobalKey).expect("two permits");
    assert_eq!(
        shown(&concurrency().release_at_headers()),
        shown(&concurrency().with_release_at_headers(true))
    );
    assert_ne!(
        shown(&concurrency().release_at_headers()),
        shown(&concurrency().with_release_at_headers(false))
    );

    let backoff = || Backoff429Layer::new(GlobalKey);
    for on in [true, false] {
        assert_eq!(
            shown(&backoff().on_503(on).proactive(!on)),
            shown(&backoff().with_on_503(on).with_proactive(!on))
        );
        assert_eq!(
            shown(&RetryPolicy::new().on_503(on)),
            shown(&RetryPolicy::new().with_on_503(on))
        );
    }
    assert_ne!(
        shown(&backoff().on_503(true)),
        shown(&backoff().with_on_503(false))
    );
    assert_ne!(
        shown(&RetryPolicy::new().on_503(true)),
        shown(&RetryPolicy::new().with_on_503(false))
    );
}
