//! What a rate limit logs when it is switched: one line for each change,
//! none for a setting applied again (a configuration reloaded unchanged
//! must not fill the log). One test in its own binary: the captured log is
//! the whole process's.

use testkit::capture;

use capture::{capture_logs, log_text};
use tower_throttle::key::GlobalKey;
use tower_throttle::rate_limit::{Quota, RateLimitLayer};

#[test]
fn switching_logs_one_line_per_change_and_none_for_a_repeat() {
    capture_logs();
    let handle = RateLimitLayer::new(Quota::per_minute(10).unwrap(), GlobalKey).handle();
    let count = |what: &str| log_text().matches(what).count();

    handle.set_enabled(true);
    handle.set_dry_run(false);
    assert_eq!(count("rate limit switched"), 0, "{}", log_text());
    assert_eq!(count("rate limit dry run switched"), 0);

    handle.set_enabled(false);
    handle.set_enabled(false);
    handle.set_dry_run(true);
    handle.set_dry_run(true);
    assert_eq!(
        count("rate limit switched enabled=false"),
        1,
        "{}",
        log_text()
    );
    assert_eq!(count("rate limit dry run switched dry_run=true"), 1);

    handle.set_enabled(true);
    handle.set_dry_run(false);
    assert_eq!(count("rate limit switched enabled=true"), 1);
    assert_eq!(count("rate limit dry run switched dry_run=false"), 1);
}
