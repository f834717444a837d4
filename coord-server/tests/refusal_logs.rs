//! Repeated refusals are logged once per window, not once or twice per request (issue 11, item 7): 3,713
//! heartbeats to a lost group used to write 7,426 lines.

mod common;

use common::{join, timings, Api};
use protocol::messages::CreateGroupRequest;
use std::process::Stdio;
use std::time::Duration;
use test_support::{free_port, wait_until, RedisServer};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_coord-server");
const WAIT: Duration = Duration::from_secs(20);
const REQUESTS: usize = 300;

#[cfg(unix)]
#[tokio::test]
async fn refusals_of_a_lost_group_are_logged_once_per_window() {
    let redis = RedisServer::start().await;
    let port = free_port();
    let mut child = Command::new(BIN)
        .args(["--redis-url", &redis.url(), "--listen", &format!("127.0.0.1:{port}")])
        .args(["--tick-interval-ms", "3600000"])
        // The shared short group timings need a mutex that a 1.5 s lease outlasts.
        .args(["--mutex-ttl-ms", "900", "--critical-section-timeout-ms", "600"])
        .env("RUST_LOG", "info")
        .env_remove("COORD_ADMIN_TOKEN")
        .env_remove("COORD_CLIENT_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    // Read the log while the binary runs: a full pipe would block its writes and stall the requests.
    let mut stderr = child.stderr.take().expect("piped stderr");
    let log = tokio::spawn(async move {
        let mut text = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await;
        text
    });
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
    let mut conn = redis.connection().await;
    let _: i64 = redis::cmd("DEL")
        .arg(common::metadata_key("orders", "billing"))
        .query_async(&mut conn)
        .await
        .expect("DEL");
    for _ in 0..REQUESTS {
        let err = api.heartbeat("orders", "billing", &join("a")).await.unwrap_err();
        assert_eq!(err.0, reqwest::StatusCode::SERVICE_UNAVAILABLE, "{err:?}");
    }

    let pid = child.id().expect("running child has a pid");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the binary stops after SIGTERM")
        .expect("wait for the binary");
    let stderr = tokio::time::timeout(WAIT, log)
        .await
        .expect("the log ends with the binary")
        .expect("log reader");
    let refusal_lines = stderr
        .lines()
        .filter(|l| l.contains("request failed") || l.contains("response failed"))
        .count();
    println!("{REQUESTS} refused heartbeats wrote {refusal_lines} log lines");
    // One line per limiter key (the refusal, tower-http's failure) per 10 s window; the requests may straddle a
    // window boundary.
    assert!(
        (1..=4).contains(&refusal_lines),
        "{REQUESTS} refusals wrote {refusal_lines} lines:\n{stderr}"
    );
}
