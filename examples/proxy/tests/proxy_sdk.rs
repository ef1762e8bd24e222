//! The official OpenAI Python SDK through the gateway to an HTTPS upstream:
//! a streamed chat completion with `stream_options.include_usage`, whose
//! text and usage chunk the SDK reads as the upstream sent them.
//!
//! Needs `python3` with the `openai` package (`.ci/run` installs it):
//! without them the test prints a notice and passes, except under
//! `CI=true`, where it fails.

use std::process::Stdio;
use std::time::Duration;

use proxy::{config, gateway};
use serde_json::Value;
use testkit::tls_upstream::{Alpn, STREAM_CHUNKS, TestCa, TlsUpstream};

const SDK_STREAM: &str = r#"
import json, sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="the-sdk-needs-one", max_retries=0, timeout=20)
stream = client.chat.completions.create(
    model="m",
    messages=[{"role": "user", "content": "hi"}],
    stream=True,
    stream_options={"include_usage": True},
)
text, usage, chunks = "", None, 0
for chunk in stream:
    chunks += 1
    for choice in chunk.choices:
        text += choice.delta.content or ""
    if chunk.usage is not None:
        usage = chunk.usage.total_tokens
print(json.dumps({"text": text, "usage": usage, "chunks": chunks}))
"#;

/// Whether `python3 -c "import openai"` works; under `CI=true` it must.
fn sdk_available() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: python3 with the openai package is needed (.ci/run installs it)"
        );
        eprintln!("notice: python3 with the openai package not found; the SDK test is skipped");
    }
    ok
}

fn env(name: &str) -> Option<String> {
    (name == "SDK_TEST_KEY").then(|| "sk-gateway-sdk-test".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_sdk_streams_through_the_gateway_to_an_https_upstream() {
    if !sdk_available() {
        return;
    }
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, Alpn::Http2).await;
    let ca_file = ca.ca_file();
    let toml = format!(
        "[[providers]]\nname = \"openai\"\nkind = \"openai\"\nbase_url = \"{}/v1\"\n\
         api_key_env = \"SDK_TEST_KEY\"\nca_file = {}\n",
        upstream.url(),
        ca_file.toml()
    );
    let settings = config::Settings::from_toml(&toml, &env).unwrap_or_else(|e| panic!("{e}"));
    let running = gateway::start(settings, ([127, 0, 0, 1], 0).into(), "test")
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .args(["-c", SDK_STREAM, &format!("{}/openai/v1", running.url())])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the SDK finishes within 60 s")
    .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let got: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
    // Every chunk but [DONE], the usage chunk among them, unchanged.
    assert_eq!(got["text"], "hello", "{got}");
    assert_eq!(got["usage"], 7, "{got}");
    assert_eq!(got["chunks"], STREAM_CHUNKS.len() - 1, "{got}");

    // What the SDK asked for reached the upstream over HTTP/2.
    assert_eq!(upstream.versions(), vec![http::Version::HTTP_2]);
    let sent: Value = serde_json::from_slice(&upstream.bodies()[0]).expect("a JSON body");
    assert_eq!(sent["stream_options"]["include_usage"], true, "{sent}");
    running.shutdown().await;
}
