//! Hot reload end to end: the gateway and its simulator on loopback, the
//! config file edited under a running watcher. Windows are 10 s, longer
//! than each test runs; only statuses and generations are asserted.

mod support;

use std::time::Duration;

use proxy::reload;
use support::sim::*;
use testkit::capture::{capture_logs, log_text};

fn reload_config(limit: &str, max_in_flight: u32) -> String {
    simulator(100, 100)
        + &format!(
            r#"
[rate_limit]
[[rate_limit.rules]]
name = "small"
provider = "sim"
model = "sim-small"
quotas = [{{ limit = {limit}, period = "10s", algorithm = "sliding_window" }}]

[concurrency]
max_in_flight = {max_in_flight}
"#
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_edit_takes_effect_without_restart_and_an_invalid_one_leaves_the_old_limits() {
    capture_logs();
    let path = temp_path("reload.toml");
    let write = |text: &str| std::fs::write(&path, text).unwrap();
    write(&reload_config("2", 8));
    let timing = reload::Timing {
        every: Duration::from_millis(50),
        settle: Duration::from_millis(50),
    };
    let (gw, client) = watched(&path, timing).await;
    let url = gw.url();
    let statuses = |r: Vec<reqwest::Response>| (count(&r, 200), count(&r, 429));

    assert_eq!(statuses(burst(&client, &url, "sim-small", 3).await), (2, 1));

    // Raise the limit: it applies at once, and what was spent stays spent
    // (2 more, not 4: no free burst).
    write(&reload_config("4", 2));
    until(&client, &url, "the reload", |s| {
        s["config"]["generation"] == 2
    })
    .await;
    assert_eq!(statuses(burst(&client, &url, "sim-small", 3).await), (2, 1));
    // max_in_flight is live too: applied, not put off until a restart.
    assert_eq!(gw.gateway.handles().concurrency.max_in_flight(), 2);
    let warned = log_text();
    assert!(
        !warned.contains("`concurrency.max_in_flight` changed"),
        "{warned}"
    );

    // An invalid edit: one line naming the field; the old limits stay.
    write(&reload_config("-1", 2));
    let mut refusal = None;
    for _ in 0..500 {
        refusal = log_text()
            .lines()
            .find(|l| l.contains("config reload refused") && l.contains("quotas[0].limit"))
            .map(str::to_owned);
        if refusal.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refusal = refusal.expect("no refusal logged");
    assert!(
        refusal.contains("`rate_limit.rules[0].quotas[0].limit`"),
        "{refusal}"
    );
    assert!(
        refusal.contains("the running configuration stays in force"),
        "{refusal}"
    );
    // A file that does not parse is refused the same way.
    write("[rate_limit\nquotas = 5\n");
    for _ in 0..500 {
        if log_text()
            .lines()
            .any(|l| l.contains("config reload refused") && l.contains("line 1"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        log_text()
            .lines()
            .any(|l| l.contains("config reload refused") && l.contains("line 1"))
    );
    let s = stats(&client, &url).await;
    assert_eq!(s["config"]["generation"], 2);
    assert_eq!(statuses(burst(&client, &url, "sim-small", 2).await), (0, 2));
    assert_eq!(
        gw.simulator.as_ref().unwrap().count("sim-small").received,
        4
    );

    gw.shutdown().await;
    let _ = std::fs::remove_file(&path);
}

fn statuses(responses: &[reqwest::Response]) -> (usize, usize) {
    (count(responses, 200), count(responses, 429))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_read_half_written_is_never_applied() {
    capture_logs();
    let path = temp_path("half.toml");
    let write = |text: &str| std::fs::write(&path, text).unwrap();
    write(&reload_config("2", 8));
    // A change must read the same a second later: far longer than the
    // half-written file below stays.
    let timing = reload::Timing {
        every: Duration::from_millis(20),
        settle: Duration::from_secs(1),
    };
    let (gw, client) = watched(&path, timing).await;
    let url = gw.url();
    assert_eq!(
        statuses(&burst(&client, &url, "sim-small", 3).await),
        (2, 1)
    );

    // An editor writing in place: for a moment the file is only what comes
    // before `[rate_limit]`, a valid config with no limits at all.
    write(&simulator(100, 100));
    tokio::time::sleep(Duration::from_millis(300)).await;
    write(&reload_config("2", 8));
    // Then a real edit, which is applied: one more unit, nothing forgotten.
    write(&reload_config("3", 8));
    until(&client, &url, "the real edit", |s| {
        s["config"]["generation"] != 1
    })
    .await;
    assert_eq!(
        stats(&client, &url).await["config"]["generation"],
        2,
        "the half-written file was applied"
    );
    assert_eq!(
        statuses(&burst(&client, &url, "sim-small", 3).await),
        (1, 2)
    );
    gw.shutdown().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_removed_and_restored_or_moved_to_another_algorithm_forget_nothing_spent() {
    capture_logs();
    let path = temp_path("restored.toml");
    let write = |text: &str| std::fs::write(&path, text).unwrap();
    write(&reload_config("2", 8));
    let quick = reload::Timing {
        every: Duration::from_millis(20),
        settle: Duration::from_millis(20),
    };
    let (gw, client) = watched(&path, quick).await;
    let url = gw.url();
    assert_eq!(
        statuses(&burst(&client, &url, "sim-small", 3).await),
        (2, 1)
    );

    // No `[rate_limit]`: limiting is off...
    write(&simulator(100, 100));
    until(&client, &url, "limits off", |s| {
        s["config"]["generation"] == 2
    })
    .await;
    assert_eq!(
        statuses(&burst(&client, &url, "sim-small", 3).await),
        (3, 0)
    );
    // ...and back on, the key's two units are still spent.
    write(&reload_config("2", 8));
    until(&client, &url, "limits back", |s| {
        s["config"]["generation"] == 3
    })
    .await;
    assert_eq!(
        statuses(&burst(&client, &url, "sim-small", 2).await),
        (0, 2),
        "the limits came back with a fresh quota"
    );
    // Another algorithm carries what was spent.
    write(&reload_config("2", 8).replace("sliding_window", "token_bucket"));
    until(&client, &url, "a token bucket", |s| {
        s["config"]["generation"] == 4
    })
    .await;
    assert_eq!(
        statuses(&burst(&client, &url, "sim-small", 2).await),
        (0, 2),
        "the new algorithm started with a fresh quota"
    );
    gw.shutdown().await;
    let _ = std::fs::remove_file(&path);
}
