//! One configuration file for a whole stack: parsing, field paths in
//! errors, and the tighten-only merge of whole-stack configs.

mod support;

use std::time::Duration;

use tower_throttle::config::StackConfig;
use tower_throttle::key::GlobalKey;

const FULL: &str = r#"
[rate_limit]
quotas = [{ limit = 60, period = "1m" }]
[[rate_limit.rules]]
name = "claude"
provider = "opencode"
model = "claude-*"
quotas = [{ limit = 500, period = "1m", algorithm = "sliding_window" }]

[concurrency]
max_in_flight = 4
max_queue = 100
queue_timeout = "30s"

[backoff]
mode = "wait"
max_wait = "10s"
initial_backoff = "1s"
max_backoff = "30s"
max_cooldown = "2m"
jitter = 0.2
on_503 = true

[identity]
[[identity.rules]]
host = "api.example.com"
user_agent = "my-app/1.0"
"#;

#[test]
fn a_whole_stack_config_builds_every_layer() {
    let stack = StackConfig::from_toml(FULL).unwrap().validate().unwrap();
    assert!(stack.rate_limit_layer(GlobalKey).is_some());
    assert!(stack.concurrency_layer(GlobalKey).unwrap().is_some());
    assert!(stack.backoff_layer(GlobalKey).unwrap().is_some());
    assert!(stack.identity_layer().unwrap().is_some());
    let empty = StackConfig::from_toml("").unwrap().validate().unwrap();
    assert!(empty.rate_limit_layer(GlobalKey).is_none());
    assert!(empty.concurrency_layer(GlobalKey).unwrap().is_none());
}

#[test]
fn every_error_names_its_field_path() {
    let cases: &[(&str, &str)] = &[
        (
            "[rate_limit]\n[[rate_limit.rules]]\nkey = \"a\"\n[[rate_limit.rules]]\nkey = \"b\"\n[[rate_limit.rules]]\nkey = \"c\"\nquotas = [{ limit = 5, period = \"1m\", burst = -1 }]",
            "rate_limit.rules[2].quotas[0].burst",
        ),
        (
            "[rate_limit]\nquotas = [{ limit = 5, period = \"fast\" }]",
            "rate_limit.quotas[0].period",
        ),
        (
            "[concurrency]\nmax_in_flight = 0",
            "concurrency.max_in_flight",
        ),
        (
            "[concurrency]\nmax_in_flight = 2\nmax_queue = -5",
            "concurrency.max_queue",
        ),
        (
            "[concurrency]\nmax_in_flight = 2\nqueue_timeout = \"soon\"",
            "concurrency.queue_timeout",
        ),
        ("[backoff]\njitter = 1.5", "backoff.jitter"),
        ("[backoff]\nmode = \"pray\"", "backoff.mode"),
        ("[backoff]\nmode = \"wait\"", "backoff.max_wait"),
        ("[backoff]\nmax_cooldown = \"-3s\"", "backoff.max_cooldown"),
    ];
    for (toml, field) in cases {
        let err = StackConfig::from_toml(toml)
            .and_then(|c| c.validate())
            .expect_err(toml);
        assert_eq!(&err.field, field, "{toml}: {err}");
        assert!(
            err.to_string().starts_with(&format!("invalid `{field}`")),
            "{err}"
        );
    }
    // Identity errors carry the identity prefix and name the header.
    let err = StackConfig::from_toml("[[identity.rules]]\nheaders = { \"bad header\" = \"x\" }")
        .and_then(|c| c.validate())
        .unwrap_err();
    assert!(err.field.starts_with("identity.rules[0]"), "{err}");
    // Unknown fields, at any depth, are errors naming the field and line.
    for (toml, field, line) in [
        ("[rate_limits]\nquotas = []", "rate_limits", 1),
        (
            "[concurrency]\nmax_in_flight = 1\nmax_inflight = 2",
            "concurrency.max_inflight",
            3,
        ),
        ("[backoff]\nretry = 3", "backoff.retry", 2),
    ] {
        let err = StackConfig::from_toml(toml).unwrap_err();
        assert_eq!(err.field, field, "{toml}: {err}");
        assert!(
            err.message.contains(&format!("(line {line}, column")),
            "{err}"
        );
    }
}

#[test]
fn a_later_stack_layer_may_only_tighten() {
    let user = StackConfig::from_toml(FULL).unwrap().validate().unwrap();
    let project = StackConfig::from_toml(
        r#"
        [rate_limit]
        enabled = false
        quotas = [{ limit = 6000, period = "1m" }, { limit = 1000, period = "1d" }]
        [concurrency]
        max_in_flight = 64
        max_queue = 10
        queue_timeout = "1h"
        [backoff]
        max_cooldown = "10m"
        initial_backoff = "100ms"
        "#,
    )
    .unwrap()
    .validate()
    .unwrap();
    let (merged, ignored) = user.tighten_with(&project);
    let limits = merged.rate_limit.unwrap();
    assert!(limits.enabled, "switching off is ignored");
    let caps: Vec<_> = limits.default.iter().map(|q| q.limit()).collect();
    assert_eq!(
        caps,
        vec![60, 1000],
        "raised limit ignored, daily cap added"
    );
    assert!(ignored.iter().any(|i| i.field == "enabled"));
    let concurrency = merged.concurrency.unwrap();
    assert_eq!(concurrency.max_in_flight, 4);
    assert_eq!(concurrency.max_queue, Some(10));
    assert_eq!(concurrency.queue_timeout, Some(Duration::from_secs(30)));
    let backoff = merged.backoff.unwrap();
    assert_eq!(
        backoff.max_cooldown,
        Some(Duration::from_secs(600)),
        "a longer cooldown cap tightens"
    );
    assert_eq!(
        backoff.initial_backoff,
        Some(Duration::from_secs(1)),
        "a shorter first cooldown is ignored"
    );
}

/// Found by the `stack_config` fuzz target's check: a value or a key
/// from the file reached the error's text raw, escape sequences
/// and line breaks included.
#[test]
fn config_errors_show_the_files_text_escaped() {
    let errors = [
        "[backoff]\nmode = \"\\u001b[2J\"\n",
        "[concurrency]\nmax_in_flight = 1\nqueue_timeout = \"\\u001b[2J\\nforged\"\n",
        "[concurrency]\n\"\\u001b[2J\" = 1\n",
        "[rate_limit]\n[[rate_limit.rules]]\nname = \"x\"\nkey = \"*\"\nquotas = [{ limit = 1, period = \"1s\\u202e\\n\" }]\n",
    ]
    .map(|text| match StackConfig::from_toml(text).and_then(|c| c.validate().map(|_| ())) {
        Ok(()) => panic!("{text:?} is refused"),
        Err(e) => e.to_string(),
    });
    for shown in errors {
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\n') && !shown.contains('\u{202e}'),
            "{shown:?}"
        );
        assert!(
            shown.contains(r"\u{1b}[2J") || shown.contains(r"\u{202e}"),
            "{shown:?}"
        );
    }
}

/// A program's own file holding the crate's sections: each side is read
/// with its own unknown-field check, and errors on either side name their
/// field and line as `from_toml`'s do.
#[test]
fn a_programs_file_reads_its_own_sections_beside_the_stacks() {
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Own {
        #[serde(default, with = "tower_throttle::config::optional_duration_text")]
        grace: Option<Duration>,
    }
    let (stack, own) = StackConfig::from_toml_with::<Own>(
        "grace = \"2s\"\n[concurrency]\nmax_in_flight = 3\nqueue_timeout = \"1m\"\n",
    )
    .unwrap();
    assert_eq!(own.grace, Some(Duration::from_secs(2)));
    let concurrency = stack.concurrency.unwrap();
    assert_eq!(concurrency.queue_timeout, Some(Duration::from_secs(60)));
    for (toml, field, line) in [
        ("grace = \"2s\"\ngrase = 1\n", "grase", 2),
        ("grace = \"soon\"\n", "grace", 1),
        (
            "grace = \"1s\"\n\n[concurrency]\nmax_in_flight = 3\nqueue_timeout = \"-1s\"\n",
            "concurrency.queue_timeout",
            5,
        ),
        (
            "[concurrency]\nmax_in_flight = 1\nqueues = 2\n",
            "concurrency.queues",
            3,
        ),
        ("[concurency]\nmax_in_flight = 1\n", "concurency", 1),
    ] {
        let err = StackConfig::from_toml_with::<Own>(toml).unwrap_err();
        assert_eq!(err.field, field, "{toml}: {err}");
        if field == "concurency" {
            // The crate's sections are offered beside the program's keys.
            assert!(err.message.contains("`concurrency`"), "{err}");
        }
        assert!(
            err.message.contains(&format!("(line {line}, column")),
            "{toml}: {err}"
        );
    }
}
