//! `coordctl` against a coordinator that serves HTTPS (issue 40): `--coordinator-tls-ca` (or `COORD_TLS_CA`)
//! makes it trust the coordinator's private CA; without it the call fails with exit status 3 and a message
//! naming the URL and the TLS cause.

use coord_server::server::CoordinatorHandle;
use coord_server::{Config, ServerTls};
use std::process::Stdio;
use std::time::Duration;
use test_support::pki::TestCa;
use test_support::RedisServer;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_coordctl");
const WAIT: Duration = Duration::from_secs(15);

async fn coordctl(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for var in [
        "COORD_URL",
        "COORD_ADMIN_TOKEN",
        "COORD_TLS_CA",
        "COORD_TLS_CERT",
        "COORD_TLS_KEY",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = tokio::time::timeout(WAIT, cmd.stdin(Stdio::null()).kill_on_drop(true).output())
        .await
        .expect("coordctl exits by itself")
        .expect("coordctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn coordctl_speaks_https_with_the_ca_it_is_given_and_names_the_tls_failure_without() {
    let redis = RedisServer::start().await;
    let ca = TestCa::new("coordinator CA");
    let server = ca.server("coordinator");
    let mut config = Config::new(redis.url());
    config.listen = "127.0.0.1:0".parse().expect("literal address");
    config.tls = Some(ServerTls::new(&server.cert, &server.key));
    let coord = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
    let url = coord.url();
    let ca_file = ca.ca_file.to_str().expect("a UTF-8 temp path");

    let (code, stdout, stderr) = coordctl(&["--url", &url, "--coordinator-tls-ca", ca_file, "groups"], &[]).await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    let (code, _, stderr) = coordctl(&["--url", &url, "--json", "groups"], &[("COORD_TLS_CA", ca_file)]).await;
    assert_eq!(code, 0, "COORD_TLS_CA is read too: {stderr}");

    let (code, _, stderr) = coordctl(&["--url", &url, "groups"], &[]).await;
    assert_eq!(code, 3, "no usable answer: {stderr}");
    assert!(stderr.contains(&url), "names the URL: {stderr}");
    assert!(
        stderr.contains("TLS") && stderr.contains("certificate"),
        "names the cause: {stderr}"
    );
    coord.shutdown().await;
}
