//! Node credentials: a request acts as the node whose key it presents, a
//! turn or an inbox is its own node's only, and `/reset` and `/stats` are
//! the operator's. Driven in process (the router called with `oneshot`).

use std::path::Path;

use agent_messaging::app::App;
use agent_messaging::cli::Cli;
use agent_messaging::flow::Settings;
use agent_messaging::projects::Directory;
use axum::Router;
use axum::body::Body;
use clap::Parser as _;
use http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

const PROJECTS: &str = r#"{"projects":[
  {"id":"demo","nodes":[{"id":"alice","key_env":"ALICE_KEY"},{"id":"bob","key_env":"BOB_KEY"}]},
  {"id":"other","nodes":[{"id":"mallory","key_env":"MALLORY_KEY"}]}
]}"#;

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const MALLORY: &str = "mallory-key-0123456789abc";
const OPERATOR: &str = "operator-key-0123456789ab";

fn env(name: &str) -> Option<String> {
    let value = match name {
        "ALICE_KEY" => ALICE,
        "BOB_KEY" => BOB,
        "MALLORY_KEY" => MALLORY,
        "OPERATOR_KEY" => OPERATOR,
        _ => return None,
    };
    Some(value.to_owned())
}

fn router(args: &[&str]) -> Router {
    let directory = Directory::parse_with(PROJECTS, &env, Path::new(".")).expect("valid");
    let cli = Cli::try_parse_from(std::iter::once("agent_messaging").chain(args.iter().copied()))
        .expect("valid flags");
    let directory = cli.access(directory, &env).expect("valid access");
    App::new(directory, &Settings::default(), None)
        .expect("valid settings")
        .router()
}

/// One request as the holder of `key` (none: no header); status and body.
async fn call(
    router: &Router,
    key: Option<&str>,
    method: &str,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let response = router
        .clone()
        .oneshot(request.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = response.status();
    if status == StatusCode::UNAUTHORIZED {
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
    }
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, body)
}

async fn send(router: &Router, key: Option<&str>, from: &str, to: &str) -> (StatusCode, Value) {
    let message = json!({"from": from, "to": to, "text": "hi"});
    call(router, key, "POST", "/send", message).await
}

fn reason(answer: &(StatusCode, Value)) -> String {
    assert_eq!(answer.0, 403, "{}", answer.1);
    assert_eq!(answer.1["error"]["code"], "not_permitted");
    answer.1["error"]["reason"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_request_acts_only_as_the_node_whose_key_it_presents() {
    let r = router(&["--admin-key-env", "OPERATOR_KEY"]);
    assert_eq!(send(&r, None, "alice", "bob").await.0, 401);
    assert_eq!(
        send(&r, Some("not-a-key-of-anyone-here"), "alice", "bob")
            .await
            .0,
        401
    );
    // Someone else's key, of the same project or of another.
    assert_eq!(
        reason(&send(&r, Some(BOB), "alice", "bob").await),
        "not-the-sender"
    );
    assert_eq!(
        reason(&send(&r, Some(MALLORY), "alice", "bob").await),
        "not-the-sender"
    );
    assert_eq!(
        reason(&send(&r, Some(MALLORY), "mallory", "bob").await),
        "cross-project"
    );
    assert_eq!(send(&r, Some(ALICE), "alice", "bob").await.0, 200);

    // Reading and emptying an inbox is its node's alone.
    let path = "/nodes/bob/inbox";
    assert_eq!(call(&r, None, "GET", path, Value::Null).await.0, 401);
    assert_eq!(
        reason(&call(&r, Some(ALICE), "GET", path, Value::Null).await),
        "not-your-inbox"
    );
    let (status, body) = call(&r, Some(BOB), "GET", path, Value::Null).await;
    assert_eq!(status, 200);
    assert_eq!(body["messages"][0]["from"], "alice");

    // Nobody refills another node's fan-out.
    let turn = "/nodes/alice/turn";
    assert_eq!(
        reason(&call(&r, Some(BOB), "POST", turn, Value::Null).await),
        "not-your-turn"
    );
    assert_eq!(
        call(&r, Some(ALICE), "POST", turn, Value::Null).await.0,
        204
    );

    // The pair interval holds: resetting needs the operator.
    for key in [None, Some(ALICE)] {
        let (status, _) = call(&r, key, "POST", "/reset", Value::Null).await;
        assert!(status == 401 || status == 403, "{status}");
        assert_eq!(send(&r, Some(ALICE), "alice", "bob").await.0, 429);
    }
    assert_eq!(
        reason(&call(&r, Some(BOB), "GET", "/stats", Value::Null).await),
        "operator-only"
    );
    let (status, stats) = call(&r, Some(OPERATOR), "GET", "/stats", Value::Null).await;
    assert_eq!(status, 200);
    assert_eq!(stats["refused"]["not-the-sender"], 2);
    assert_eq!(stats["refused"]["unauthorized"], 2);
    assert_eq!(
        call(&r, Some(OPERATOR), "POST", "/reset", Value::Null)
            .await
            .0,
        204
    );
    // The operator is no node.
    assert_eq!(
        reason(&send(&r, Some(OPERATOR), "alice", "bob").await),
        "not-the-sender"
    );
    assert_eq!(send(&r, Some(ALICE), "alice", "bob").await.0, 200);
}

#[tokio::test]
async fn without_an_operator_key_the_operator_endpoints_are_off() {
    let r = router(&[]);
    for key in [None, Some(ALICE)] {
        let (status, body) = call(&r, key, "POST", "/reset", Value::Null).await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(body["error"]["reason"], "no-operator-key");
    }
}

#[test]
fn keys_are_named_by_reference_checked_and_never_echoed() {
    let base = Path::new(".");
    let parse = |text: &str| {
        Directory::parse_with(text, &env, base)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let node =
        |fields: &str| format!(r#"{{"projects":[{{"id":"p","nodes":[{{"id":"a"{fields}}}]}}]}}"#);
    let cases = [
        (node(r#","key":"inline-key-0123456789""#), "never written in the projects file"),
        (node(r#","key_env":"UNSET_KEY""#), "$UNSET_KEY is not set"),
        (node(r#","key_env":"ALICE_KEY","key_file":"k""#), "give one"),
        (node(r#","key_file":"/nonexistent/key""#), "cannot read"),
        (
            r#"{"projects":[{"id":"p","nodes":[{"id":"a","key_env":"ALICE_KEY"},{"id":"b"}]}]}"#.to_owned(),
            "node `b` has no key while others do",
        ),
        (
            r#"{"projects":[{"id":"p","nodes":[{"id":"a","key_env":"ALICE_KEY"},{"id":"b","key_env":"ALICE_KEY"}]}]}"#.to_owned(),
            "has the key of node `a`",
        ),
    ];
    for (text, expected) in &cases {
        let error = parse(text).expect_err(text);
        assert!(error.contains(expected), "{text}: {error}");
        assert!(
            !error.contains(ALICE) && !error.contains("inline-key"),
            "a key in: {error}"
        );
    }
    // Too short a key, named by the variable that holds it.
    let short = |name: &str| (name == "SHORT").then(|| "short".to_owned());
    let error = Directory::parse_with(&node(r#","key_env":"SHORT""#), &short, base).unwrap_err();
    assert!(error.to_string().contains("at least 16"), "{error}");
    assert!(!error.to_string().contains("short\""), "{error}");

    // A key file, relative to the projects file, its final newline not
    // part of the key.
    let dir = std::env::temp_dir().join(format!("agent-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.key"), format!("{ALICE}\n")).unwrap();
    std::fs::write(dir.join("projects.json"), node(r#","key_file":"a.key""#)).unwrap();
    let directory = Directory::load_with(&dir.join("projects.json"), &env).expect("a key file");
    assert!(directory.access.has_node_keys());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_service_whose_nodes_have_no_keys_listens_only_on_loopback() {
    let open = || {
        Directory::parse(r#"{"projects":[{"id":"p","nodes":[{"id":"a"},{"id":"b"}]}]}"#).unwrap()
    };
    let cli = |listen: &str| Cli::try_parse_from(["agent_messaging", "--listen", listen]).unwrap();
    assert!(cli("127.0.0.1:0").access(open(), &env).is_ok());
    assert!(cli("[::1]:0").access(open(), &env).is_ok());
    let error = cli("0.0.0.0:8090").access(open(), &env).unwrap_err();
    assert!(error.contains("loopback"), "{error}");
    // With keys, any address.
    let keyed = Directory::parse_with(PROJECTS, &env, Path::new(".")).unwrap();
    assert!(cli("0.0.0.0:8090").access(keyed, &env).is_ok());
    // An operator key that is unset, short, or a node's is refused.
    for name in ["UNSET", "ALICE_KEY"] {
        let keyed = Directory::parse_with(PROJECTS, &env, Path::new(".")).unwrap();
        let cli = Cli::try_parse_from(["agent_messaging", "--admin-key-env", name]).unwrap();
        assert!(cli.access(keyed, &env).is_err(), "{name}");
    }
}
