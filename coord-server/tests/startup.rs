//! Start-up: a Redis without a required command is refused with a message naming it, by the library and by the
//! binary; the binary serves and stops cleanly on SIGTERM.

mod common;

use common::config;
use coord_server::server::CoordinatorHandle;
use std::process::Stdio;
use std::time::Duration;
use test_support::{free_port, wait_until, RedisServer};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_coord-server");
const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn spawn_fails_naming_a_disabled_xautoclaim() {
    let redis = RedisServer::builder().rename_command("XAUTOCLAIM", "").start().await;
    let err = CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .expect_err("a Redis without XAUTOCLAIM is refused");
    let message = err.to_string();
    assert!(message.contains("XAUTOCLAIM"), "{message}");
    assert!(message.contains("missing or renamed"), "{message}");
}

#[tokio::test]
async fn spawn_fails_naming_every_consumer_command_that_was_renamed() {
    // Commands only the consumer SDK sends, which the list once missed.
    let redis = RedisServer::builder()
        .rename_command("XCLAIM", "")
        .rename_command("CLIENT", "CLIENT_RENAMED")
        .rename_command("MULTI", "")
        .start()
        .await;
    let err = CoordinatorHandle::spawn(config(&redis.url()))
        .await
        .expect_err("a Redis without XCLAIM, CLIENT and MULTI is refused");
    let message = err.to_string();
    for name in ["XCLAIM", "CLIENT", "MULTI"] {
        assert!(message.contains(&format!("{name} (")), "{name}: {message}");
    }
    assert!(!message.contains("EXEC ("), "EXEC is still there: {message}");
}

#[tokio::test]
async fn binary_exits_nonzero_naming_a_disabled_xautoclaim() {
    let redis = RedisServer::builder().rename_command("XAUTOCLAIM", "").start().await;
    let run = Command::new(BIN)
        .args(["--redis-url", &redis.url(), "--listen", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(WAIT, run)
        .await
        .expect("the binary exits by itself")
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "exit status {:?}; stderr: {stderr}",
        output.status
    );
    assert!(
        stderr.contains("Redis lacks required commands (missing or renamed): XAUTOCLAIM"),
        "{stderr}"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn binary_serves_until_sigterm_and_exits_cleanly() {
    let redis = RedisServer::start().await;
    let port = free_port();
    let child = Command::new(BIN)
        .args(["--redis-url", &redis.url(), "--listen", &format!("127.0.0.1:{port}")])
        .args(["--tick-interval-ms", "50", "--log-format", "json"])
        .env("COORD_ADMIN_TOKEN", "secret")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    wait_until(WAIT, "the binary to answer /readyz", || {
        let http = http.clone();
        let url = format!("{base}/readyz");
        async move { http.get(url).send().await.is_ok_and(|r| r.status().is_success()) }
    })
    .await;
    let admin = http
        .get(format!("{base}{}", protocol::routes::GROUPS))
        .send()
        .await
        .expect("request sent");
    assert_eq!(
        admin.status(),
        reqwest::StatusCode::UNAUTHORIZED,
        "the token from the environment applies"
    );

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
    assert!(
        output.status.success(),
        "exit status {:?}; stderr: {stderr}",
        output.status
    );
    assert!(stderr.contains("SIGTERM received"), "{stderr}");
}
