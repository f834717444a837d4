//! The binary's JSON logs: with `--log-format json` every line is a JSON object, and a critical section's events
//! carry its `critical_section` span (workflow, group, member, write boundary, revision).

mod common;

use common::{join, timings, Api};
use protocol::messages::CreateGroupRequest;
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;
use test_support::{free_port, wait_until, RedisServer};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_coord-server");
const WAIT: Duration = Duration::from_secs(20);

#[cfg(unix)]
#[tokio::test]
async fn json_logs_carry_the_critical_section_span_and_its_write_boundary() {
    let redis = RedisServer::start().await;
    let port = free_port();
    let child = Command::new(BIN)
        .args(["--redis-url", &redis.url(), "--listen", &format!("127.0.0.1:{port}")])
        .args(["--log-format", "json", "--tick-interval-ms", "3600000"])
        // Short enough for the 1.5 s lease of `timings()`.
        .args(["--mutex-ttl-ms", "900", "--critical-section-timeout-ms", "600"])
        .env("RUST_LOG", "info,coord_server=debug")
        .env_remove("COORD_ADMIN_TOKEN")
        .env_remove("COORD_CLIENT_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    wait_until(WAIT, "the binary to answer /readyz", || {
        let http = http.clone();
        let url = format!("{base}/readyz");
        async move { http.get(url).send().await.is_ok_and(|r| r.status().is_success()) }
    })
    .await;
    let api = Api::new(base.clone());
    let create = CreateGroupRequest {
        shard_count: Some(2),
        timings: Some(timings()),
    };
    let resp = api.post("/v1/streams/orders/groups/billing", &create).await;
    assert_eq!(resp.status(), reqwest::StatusCode::CREATED);
    api.hb("orders", "billing", &join("a")).await;

    let pid = child.id().expect("running child has a pid");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let output = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("the binary stops after SIGTERM")
        .expect("wait for the binary");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<Value> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}")))
        .collect();

    let boundary = |workflow: &str, boundary: &str| {
        lines.iter().find(|l| {
            l["fields"]["message"] == "write boundary reached"
                && l["fields"]["boundary"] == boundary
                && l["span"]["name"] == "critical_section"
                && l["span"]["workflow"] == workflow
        })
    };
    let committed = boundary("join", "committed").unwrap_or_else(|| panic!("no committed join boundary:\n{stderr}"));
    assert_eq!(committed["span"]["group"], "billing", "{committed}");
    assert_eq!(committed["span"]["stream"], "orders", "{committed}");
    assert_eq!(committed["span"]["member_id"], "a", "{committed}");
    assert!(committed["fields"]["revision"].as_u64().is_some(), "{committed}");
    assert!(boundary("join", "loaded").is_some(), "{stderr}");
    assert!(boundary("join", "decided").is_some(), "{stderr}");
    assert!(boundary("create", "committed").is_some(), "{stderr}");
    // Events inside a section carry its span too (the join event is logged at info).
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "coordinator event" && l["span"]["workflow"] == "join"),
        "{stderr}"
    );
}
